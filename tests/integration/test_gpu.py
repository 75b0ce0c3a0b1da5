"""On a machine with a CUDA GPU (skipped elsewhere): runs on GPU workers through the real CLI. Each run over NCCL
asks for ``trainer.sync_debug_mode=error``: an operation in a training step that makes the host wait for the GPU
raises, and the run fails. (Gloo all-reduces CUDA tensors through host memory: it waits by design.)"""

import json
import re

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.workers, pytest.mark.gpu]

GPU = ["scaling.use_gpu=true", "trainer.precision=bf16-mixed", "hydra.run.dir=run"]


def gpu_run(ray_address, tmp_path, *overrides, sync_debug_mode="error"):
    waits = [f"trainer.sync_debug_mode={sync_debug_mode}"] if sync_debug_mode else []
    done = run_cli([f"ray.address={ray_address}", *GPU, *waits, *overrides], cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    return done, summary


def test_a_gpu_worker_trains_in_bf16_from_data_on_the_device_without_waiting_for_it(ray_address, tmp_path):
    """The digits on the GPU, cropped and flipped there, channels-last."""
    done, summary = gpu_run(
        ray_address,
        tmp_path,
        "scaling.num_workers=1",
        "trainer.max_epochs=2",
        "trainer.channels_last=true",
        "trainer.augment.random_crop_padding=1",
        "trainer.augment.horizontal_flip=true",
    )
    assert "data on cuda:0 as tensors" in done.stdout
    assert summary["epochs_completed"] == 2 and summary["final"]["val_accuracy"] > 0.3  # it trains (chance: 0.1)


def test_the_dataloader_path_pins_and_copies_ahead_without_waiting_for_the_gpu(ray_address, tmp_path):
    done, summary = gpu_run(
        ray_address,
        tmp_path,
        "scaling.num_workers=1",
        "model=resnet18",
        "dataset=fake",
        "dataset.train_size=512",
        "dataset.val_size=64",
        "trainer.max_epochs=1",
        "trainer.data_on_device=false",
        "trainer.dataloader.num_workers=2",
    )
    assert "pinned memory, each batch copied ahead" in done.stdout


SHARED_GPU = ("scaling.num_workers=2", "scaling.resources_per_worker={GPU: 0.5}")


def test_two_workers_share_one_gpu(ray_address, tmp_path):
    """Fractional GPUs: DDP over the gloo backend (NCCL refuses two ranks on one device). The loss guard sums both
    ranks' CUDA losses at every optimizer step (through gloo), and the run goes on."""
    _, summary = gpu_run(
        ray_address,
        tmp_path,
        "debug=smoke",
        *SHARED_GPU,
        "callbacks=[lr_monitor,loss_guard]",
        "callbacks.loss_guard.spike_factor=1000",
        sync_debug_mode=None,  # gloo copies the gradients to the host
    )
    assert summary["final"]["world_size"] == 2 and summary["final"]["lr_model"] > 0


def test_the_loss_guard_stops_a_diverging_run_on_gpu_workers(ray_address, tmp_path):
    """Adam at a learning rate of 1e20 in bf16-mixed on two workers sharing the GPU: both ranks stop at the guard's
    first check of a loss that is not finite, and the run is not retried."""
    done = run_cli(
        [f"ray.address={ray_address}", *GPU, "debug=smoke", *SHARED_GPU, "callbacks=loss_guard"]
        + ["optimizer.lr=1e20", "failure.max_failures=2"],
        cwd=str(tmp_path),
    )
    assert done.returncode != 0
    assert re.search(r"StopTraining: the training loss is (nan|inf) at epoch 1, optimizer step [12]:", done.stderr)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    [failure] = summary["failures"]
    assert summary["status"] == "failed" and failure["retried"] is False and summary["epochs_completed"] == 0


def test_fsdp_shards_on_a_gpu_in_bf16(ray_address, tmp_path):
    """FSDP2 over NCCL with bfloat16 parameters (a mixed precision policy), batch norm kept in float32."""
    _, summary = gpu_run(
        ray_address,
        tmp_path,
        "debug=smoke",
        "scaling.num_workers=1",
        "model=resnet18",
        "trainer.parallel_strategy=fsdp",
        "fsdp.shard_modules=[BasicBlock]",
    )
    assert summary["final"]["param_bytes"] > 0


def test_a_lightning_module_trains_on_a_gpu_worker_in_bf16(ray_address, tmp_path):
    """task=lightning: lightning.Trainer with accelerator=gpu on Ray's device, NCCL, bf16-mixed."""
    _, summary = gpu_run(
        ray_address,
        tmp_path,
        "experiment=digits_lightning",
        "scaling.num_workers=1",
        "trainer.max_epochs=2",
        sync_debug_mode=None,  # a setting Lightning runs do not take
    )
    assert summary["epochs_completed"] == 2 and summary["final"]["val_accuracy"] > 0.3  # it trains (chance: 0.1)


def test_task_metrics_and_ema_weights_on_a_gpu_worker(ray_address, tmp_path):
    """task.metrics' states summed on the GPU over NCCL (no torchmetrics sync of its own) and the EMA copy updated
    after each optimizer step without making the step wait for the GPU."""
    done, summary = gpu_run(
        ray_address,
        tmp_path,
        "scaling.num_workers=1",
        "trainer.max_epochs=2",
        "+task.metrics=[f1,auroc,top3_accuracy]",
        "trainer.ema.decay=0.9",
        "trainer.monitor=val_f1",
    )
    final = summary["final"]
    assert summary["epochs_completed"] == 2 and 0.3 < final["val_f1"] <= 1 and 0.5 < final["val_auroc"] <= 1
    assert final["val_top3_accuracy"] >= final["val_accuracy"]


def test_a_causal_lm_selects_its_supervised_positions_on_a_gpu_worker_without_waiting_for_it(ray_address, tmp_path):
    """The output head on the supervised positions only: the collate makes them on the host, so no step waits for
    the GPU (a boolean mask on the device would); bf16, LoRA, gradient checkpointing."""
    from tests.helpers.text import text_overrides

    text_run = [o for o in text_overrides(tmp_path / "text") if not o.startswith("trainer.precision")]
    done, summary = gpu_run(
        ray_address,
        tmp_path,
        *text_run,
        "scaling.num_workers=1",
        "peft=lora",
        "model.gradient_checkpointing=true",
    )
    assert summary["epochs_completed"] == 2 and summary["final"]["train_tokens"] > 0
