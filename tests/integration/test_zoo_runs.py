"""Zoo models trained end to end, named as their zoos name them: through ``_target_`` on the command line with the
zoo's own argument names (a ``**kwargs`` builder is not handed the replaced option's ``input_shape``/``num_outputs``;
what is under test is the composition, so in Ray Train's local mode), and through the shipped options
``model=torchvision``, ``model=timm`` and ``model=huggingface``, which take the dataset's classes and channels. The
torchvision and timm runs train in local mode too: that none of their parameters is unused (DDP's problem, not local
mode's) is tests/unit/test_zoo.py's one_step; the Hugging Face ViT, whose output is a ModelOutput, trains under DDP on
2 workers of the session's cluster."""

import json

import pytest
import torch

from hydra_raytrain import evaluate, load_model, train
from tests.conftest import compose_config, run_cli

pytestmark = pytest.mark.integration

FAKE = ("dataset=fake", "dataset.train_size=64", "dataset.val_size=32", "trainer.batch_size=16")
# One epoch of 4 optimizer steps (a global batch of 16), watched by a callback that reports how far they moved the
# weights: a zoo model must train, not only build and run forward.
MOVED = "+callbacks.moved._target_=tests.helpers.callbacks.WeightsMoved"
RUN = ("trainer.max_epochs=1", MOVED)


def assert_trained_4_steps(summary, world_size):
    final = summary["final"]
    assert summary["status"] == "completed" and final["world_size"] == world_size, summary
    assert final["step"] == final["steps_seen"] == 4 and final["moved"] > 0, final


SMALL_VIT = ("patch_size=8", "hidden_size=64", "num_hidden_layers=2", "num_attention_heads=2", "intermediate_size=128")


@pytest.mark.parametrize(
    "channels, zoo",
    [
        (3, ["model._target_=torchvision.models.shufflenet_v2_x0_5", "+model.num_classes=10"]),
        (
            1,
            [
                "model._target_=timm.create_model",
                "+model.model_name=resnet10t",
                "+model.num_classes=10",
                "+model.in_chans=1",
            ],
        ),
    ],
    ids=["torchvision", "timm"],
)
def test_a_zoo_target_on_the_command_line_trains_with_the_zoos_own_argument_names(tmp_path, channels, zoo):
    shape = f"dataset.input_shape=[{channels},32,32]"
    done = run_cli([*FAKE, shape, *RUN, "scaling.num_workers=0", *zoo, "hydra.run.dir=run"], cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "takes **kwargs without naming input_shape, num_outputs: whether it consumes them cannot be told" in (
        done.stderr
    )
    assert_trained_4_steps(json.loads((tmp_path / "run" / "summary.json").read_text()), world_size=1)


@pytest.mark.long("the zoo in the gate: the CLI runs above and tests/unit/test_zoo.py")
@pytest.mark.workers
def test_the_shipped_zoo_options_take_the_datasets_classes_and_channels(ray_address, tmp_path):
    zoos = (  # (workers, the option)
        (0, ["model=torchvision", "model.name=mobilenet_v3_small"]),
        (0, ["model=timm", "model.name=lcnet_050"]),
        # a small ViT: the architecture's own settings pass through
        (2, ["model=huggingface", "model.model_type=vit", *(f"+model.{setting}" for setting in SMALL_VIT)]),
    )
    for workers, zoo in zoos:
        run_dir = tmp_path / zoo[0].split("=")[1]
        overrides = (*FAKE, "dataset.input_shape=[1,32,32]", *RUN, f"scaling.num_workers={workers}", *zoo)
        summary = train(compose_config(*overrides), run_dir=str(run_dir))
        assert_trained_4_steps(summary, world_size=max(workers, 1))
        # The driver rebuilds the zoo model from the run's config, with the run's weights: grey images in, 10 classes
        # out; it scores it as the workers did (to 1e-3: each worker validates with its own BatchNorm statistics).
        model = load_model(str(run_dir))
        first = next(module for module in model.modules() if isinstance(module, torch.nn.Conv2d))
        assert first.in_channels == 1 and model(torch.zeros(2, 1, 32, 32)).shape == (2, 10), zoo
        assert abs(evaluate(str(run_dir))["val_loss"] - summary["final"]["val_loss"]) < 1e-3, zoo
