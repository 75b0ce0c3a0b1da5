"""Throughput and start-up of hydra_raytrain against a raw PyTorch loop and a hand-written Ray Train script.

    .venv/bin/python benchmarks/throughput.py            # or: make bench
    .venv/bin/python benchmarks/throughput.py --gpu      # on a machine with a CUDA GPU (make bench-gpu)

Each contender runs in a fresh process with the same model (SimpleCNN), data (FakeData 3x32x32, 2,048 train /
256 val images), global batch (64) and epochs, each as its user gets it by default: the raw loop with torch's
threads (one per core), the same model as a LightningModule in a plain ``lightning.Trainer`` (the peer
lightning-hydra-template users run: one process, no Ray), the hand-written script on one Ray Train worker (Ray's
one CPU, so one thread), ours on one worker sized to the machine. Printed: steady-state training samples/s
(median over epochs after the first, training phase only) and the time from launching the process to the end of
the first optimizer step, with ratios against the baselines. Then the default experiment (SimpleCNN on the
bundled digits, 2 workers) with its data on the device against the same run reading through DataLoaders.

``--gpu``: one GPU worker against a raw PyTorch loop on the same GPU, in a plain process and in a hand-written
Ray Train script's worker, all in bf16-mixed (torch.autocast) and channels_last, on the default experiment
(SimpleCNN on the bundled digits) and on resnet18 (FakeData 3x32x32, batch 256, 8 loader processes with pinned
memory). The raw loop builds its data, model and optimizer from the same composed config; its epoch ends with a
CUDA synchronize, as ours ends with the metrics' all-reduce. Then resnet18 with the CIFAR-shaped data on the device
(``trainer.data_on_device=true``, crops and flips there) against the raw DataLoader loop, and two workers sharing
the GPU.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from hydra_raytrain.runtime.host import TIMELINE_ENV, mark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS, BATCH, TRAIN, VAL, SHAPE = 6, 64, 2048, 256, (3, 32, 32)
GPU_EPOCHS = 8
GPU = [
    "scaling.num_workers=1",
    "scaling.use_gpu=true",
    "trainer.precision=bf16-mixed",
    "trainer.channels_last=true",
    f"trainer.max_epochs={GPU_EPOCHS}",
    f"checkpoint.every_n_epochs={GPU_EPOCHS}",
]
GPU_WORKLOADS = {
    "default experiment": [],  # SimpleCNN on the bundled digits, batch 64: the embedded default
    "resnet18": [
        "model=resnet18",
        "dataset=fake",
        "dataset.train_size=25600",
        "dataset.val_size=1024",
        "trainer.batch_size=256",
        "trainer.dataloader.num_workers=8",
        "trainer.dataloader.pin_memory=true",
        "trainer.dataloader.persistent_workers=true",
    ],
}


def _setup():
    import torch

    from hydra_raytrain.data import fake
    from hydra_raytrain.models import SimpleCNN

    torch.manual_seed(0)
    return fake(SHAPE, 10, TRAIN, VAL), SimpleCNN(SHAPE, 10)


def _epoch(model, optimizer, loader, record_to, state, device=None, autocast=None, memory_format=None):
    """One training epoch of the plain loop every baseline shares; returns training samples/s. On a GPU:
    inputs copied asynchronously (``memory_format`` for images), the forward under ``autocast`` (a dtype), and
    a synchronize before the clock stops."""
    import contextlib

    import torch
    import torch.nn.functional as F

    model.train()
    started, seen = time.perf_counter(), 0
    for inputs, labels in loader:
        if device is not None:
            inputs = inputs.to(device, non_blocking=True, memory_format=memory_format or torch.preserve_format)
            labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext():
            loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        seen += len(labels)
        if not state.get("recorded"):
            with open(record_to, "w") as file:
                json.dump({"first_step": time.time()}, file)
            state["recorded"] = True
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return seen / (time.perf_counter() - started)


def raw(record_to: str, out: str) -> None:
    import torch
    from torch.utils.data import DataLoader

    splits, model = _setup()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.002)
    loader = DataLoader(splits.train, batch_size=BATCH, shuffle=True)
    state: dict = {}
    rates = [_epoch(model, optimizer, loader, record_to, state) for _ in range(EPOCHS)]
    with open(out, "w") as file:
        json.dump({"rates": rates}, file)


def plain_lightning(record_to: str, out: str) -> None:
    """The peer lightning-hydra-template users run: the same model, data, batch and optimizer as a LightningModule
    in a plain ``lightning.Trainer``, one process, no Ray (one CPU device, torch's threads: Lightning's defaults)."""
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    splits, net = _setup()
    rates: list[float] = []

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, index):
            inputs, labels = batch
            return F.cross_entropy(self.net(inputs), labels)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.002)

    class Clock(pl.Callback):
        """Training samples/s per epoch, and the first optimizer step's time, as ``_epoch`` measures them."""

        recorded = False

        def on_train_epoch_start(self, trainer, module):
            self.started, self.seen = time.perf_counter(), 0

        def on_train_batch_end(self, trainer, module, outputs, batch, index):
            self.seen += len(batch[1])
            if not self.recorded:
                with open(record_to, "w") as file:
                    json.dump({"first_step": time.time()}, file)
                self.recorded = True

        def on_train_epoch_end(self, trainer, module):
            rates.append(self.seen / (time.perf_counter() - self.started))

    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer = pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, callbacks=[Clock()], **quiet)
    trainer.fit(Module(), DataLoader(splits.train, batch_size=BATCH, shuffle=True))
    with open(out, "w") as file:
        json.dump({"rates": rates}, file)


def _gpu_loop(record_to: str, overrides, report) -> None:
    """The raw loop on one GPU, its data, model and optimizer built from the config ``overrides`` compose;
    ``report(samples_per_second)`` after each epoch."""
    import torch
    from hydra import compose, initialize_config_module
    from hydra.utils import instantiate
    from torch.utils.data import DataLoader

    from hydra_raytrain.recipe.step import AUTOCAST_DTYPES

    with initialize_config_module("hydra_raytrain.conf", version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    torch.manual_seed(cfg.trainer.seed)
    device = torch.device("cuda", torch.cuda.current_device())
    memory_format = torch.channels_last if cfg.trainer.channels_last else torch.preserve_format
    splits = instantiate(cfg.dataset, _convert_="all")
    model = instantiate(cfg.model, _convert_="all").to(device, memory_format=memory_format)
    optimizer = instantiate(cfg.optimizer)(model.parameters())
    options = cfg.trainer.dataloader
    loader = DataLoader(
        splits.train,
        batch_size=cfg.trainer.batch_size,
        shuffle=True,
        num_workers=options.num_workers or 0,
        pin_memory=bool(options.pin_memory),
        persistent_workers=options.persistent_workers and bool(options.num_workers),
    )
    state: dict = {}
    for _ in range(cfg.trainer.max_epochs):
        report(
            _epoch(
                model,
                optimizer,
                loader,
                record_to,
                state,
                device,
                AUTOCAST_DTYPES[cfg.trainer.precision],
                memory_format,
            )
        )


def raw_gpu(record_to: str, out: str, *overrides: str) -> None:
    rates: list = []
    _gpu_loop(record_to, overrides, rates.append)
    with open(out, "w") as file:
        json.dump({"rates": rates}, file)


def handwritten(record_to: str, out: str, *overrides: str) -> None:
    """A hand-written TorchTrainer script: the CPU loop, or with ``overrides`` the raw GPU loop on one GPU worker."""
    import ray
    import ray.train
    import ray.train.torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_func(config):
        mark("worker")
        import torch
        from torch.utils.data import DataLoader

        if config["overrides"]:
            _gpu_loop(
                config["record_to"], config["overrides"], lambda rate: ray.train.report({"samples_per_second": rate})
            )
            return None

        splits, model = _setup()
        model = ray.train.torch.prepare_model(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.002)
        loader = ray.train.torch.prepare_data_loader(DataLoader(splits.train, batch_size=BATCH, shuffle=True))
        mark("setup")
        state = {}
        for _ in range(EPOCHS):
            rate = _epoch(model, optimizer, loader, config["record_to"], state)
            ray.train.report({"samples_per_second": rate})
        return None

    storage = tempfile.mkdtemp()
    mark("composed")  # its imports: nothing to compose or check
    mark("checked")
    ray.init(address="local", logging_level="WARNING")
    mark("ray")

    class Rates(ray.train.UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            with open(out, "a") as file:
                file.write(json.dumps(metrics[0]) + "\n")

    TorchTrainer(
        train_func,
        train_loop_config={"record_to": record_to, "overrides": list(overrides)},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=bool(overrides)),
        run_config=RunConfig(storage_path=storage, callbacks=[Rates()]),
    ).fit()
    with open(out) as file:
        rates = [json.loads(line)["samples_per_second"] for line in file]
    with open(out, "w") as file:
        json.dump({"rates": rates}, file)


def ours(record_to: str, out: str, *overrides: str) -> None:
    """hydra_raytrain's CLI, in this process: the given overrides (a GPU workload) or the CPU one."""
    overrides = list(overrides) or [
        "model=simple_cnn",
        "dataset=fake",
        f"dataset.input_shape=[{','.join(map(str, SHAPE))}]",
        f"dataset.train_size={TRAIN}",
        f"dataset.val_size={VAL}",
        "scaling.num_workers=1",
        f"trainer.max_epochs={EPOCHS}",
        f"trainer.batch_size={BATCH}",
        # Checkpoint at the end only: the baselines write no checkpoints (per-epoch ones, our default, cost
        # about 5% on this workload on 2 cores: the controller handles each one during the next epoch).
        f"checkpoint.every_n_epochs={EPOCHS}",
    ]
    timed = [
        "task._target_=benchmarks.timing.TimedClassification",
        f"+task.record_to={record_to}",
        f"hydra.run.dir={out}.run",
    ]
    sys.argv = ["hydra_raytrain", *overrides, *timed]
    from hydra_raytrain.cli import main

    try:
        main()
    except SystemExit as exit_:  # Hydra's main may end with sys.exit(0); an error's exit status stays
        if exit_.code:
            raise
    with open(f"{out}.run/metrics.jsonl") as file:
        metrics = [json.loads(line) for line in file]
    with open(out, "w") as file:  # with trainer.profile=true, rank 0's seconds per epoch waiting for batches too
        json.dump(
            {"rates": [m["samples_per_second"] for m in metrics], "data": [m.get("time_data") for m in metrics]}, file
        )


# Where the time from launch to the first optimizer step goes (``HYDRA_RAYTRAIN_TIMELINE``: hydra_raytrain's marks,
# the hand-written script's own): each part ends at its mark.
PARTS = (
    ("composed", "imports, composition"),
    ("checked", "checks"),
    ("ray", "Ray started"),
    ("worker", "Ray Train workers"),
    ("setup", "setup in the worker"),
    ("first_step", "first step"),
)


def measure(name: str, overrides: tuple = ()) -> dict:
    folder = tempfile.mkdtemp()
    record_to, out = os.path.join(folder, "first_step.json"), os.path.join(folder, "rates.json")
    timeline = os.path.join(folder, "timeline.txt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    env[TIMELINE_ENV] = timeline
    launched = time.time()
    done = subprocess.run(
        [sys.executable, __file__, name, record_to, out, *overrides], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"{name} {' '.join(overrides)} failed:\n{done.stderr[-3000:]}")
    with open(record_to) as file:
        first_step = json.load(file)["first_step"] - launched
    with open(out) as file:
        figures = json.load(file)
    data = [seconds for seconds in figures.get("data", [])[1:] if seconds is not None]
    marks = {"first_step": first_step}
    if os.path.exists(timeline):
        with open(timeline) as file:
            for line in file:
                at, event = line.split()
                marks.setdefault(event, float(at) - launched)  # the first of each (a run marks each once)
    return {
        "samples_per_second": statistics.median(figures["rates"][1:]),
        "first_step_seconds": first_step,
        "data_seconds": statistics.median(data) if data else None,
        "marks": marks,
    }


def parts(marks: dict) -> list:
    """The seconds of each start-up part (``PARTS``) from a run's marks; None where it marked none."""
    seconds, last = [], 0.0
    for event, _ in PARTS:
        at = marks.get(event)
        seconds.append(None if at is None else at - last)
        last = at if at is not None else last
    return seconds


def alternate(contenders: dict, rounds: int) -> dict:
    """Every contender (label -> (runner, overrides)) ``rounds`` times, the order reversed every other round (this
    machine's run-to-run noise is larger than the differences being measured); each run's figures printed as it
    ends."""
    runs: dict = {label: [] for label in contenders}
    for round_ in range(rounds):
        for label in list(contenders) if round_ % 2 == 0 else reversed(list(contenders)):
            runs[label].append(measure(*contenders[label]))
            print(
                f"round {round_ + 1} {label:34} {runs[label][-1]['samples_per_second']:8.0f} samples/s "
                f"{runs[label][-1]['first_step_seconds']:6.1f} s to first step",
                flush=True,
            )
    return runs


def best(runs: dict) -> dict:
    """Per contender, the best samples/s and the shortest time to the first step over its rounds (with that
    round's start-up marks)."""
    return {
        label: {
            "samples_per_second": max(r["samples_per_second"] for r in rs),
            "first_step_seconds": min(r["first_step_seconds"] for r in rs),
            "marks": min(rs, key=lambda r: r["first_step_seconds"]).get("marks", {}),
        }
        for label, rs in runs.items()
    }


def print_parts(results: dict, labels: list) -> None:
    """Launch to first step, part by part, for the contenders that mark theirs (the fastest round of each)."""
    print(f"\n{'launch to first step (s)':26}" + "".join(f"{label:>24}" for label in labels))
    rows = list(zip(*(parts(results[label]["marks"]) for label in labels), strict=True))
    for (_, part), row in zip(PARTS, rows, strict=True):
        print(f"{part:26}" + "".join(f"{'-' if s is None else f'{s:.1f}':>24}" for s in row))
    print(f"{'total':26}" + "".join(f"{results[label]['first_step_seconds']:>24.1f}" for label in labels))


# The default experiment (SimpleCNN on the bundled digits, 2 workers) long enough for steady epochs, with the
# seconds per epoch rank 0 waits for its batches (trainer.profile: no synchronisation on CPU workers).
DEFAULT_EXPERIMENT = ("trainer.max_epochs=12", "checkpoint.every_n_epochs=12", "trainer.profile=true")


def main(rounds: int = 3) -> None:
    """Each figure is the best over rounds (about +-10% of noise on 2 shared cores)."""
    raw, lit, hand, ours = "raw PyTorch loop", "plain lightning.Trainer", "hand-written Ray Train", "hydra_raytrain"
    contenders = {raw: ("raw", ()), lit: ("plain_lightning", ()), hand: ("handwritten", ()), ours: ("ours", ())}
    results = best(alternate(contenders, rounds))
    print(f"\nbest of {rounds} rounds       {'samples/s':>12}{'first step (s)':>16}")
    for label, result in results.items():
        print(f"{label:22}{result['samples_per_second']:12.0f}{result['first_step_seconds']:16.1f}")
    speed, start = "samples_per_second", "first_step_seconds"
    print(f"throughput vs raw PyTorch:          {results[ours][speed] / results[raw][speed]:.3f}x  (target >= 1.0)")
    print(f"throughput vs hand-written Ray:     {results[ours][speed] / results[hand][speed]:.3f}x  (target >= 1.0)")
    print(f"throughput vs plain Lightning:      {results[ours][speed] / results[lit][speed]:.3f}x")
    print(
        f"first step vs hand-written Ray:     {results[ours][start] / results[hand][start]:.3f}x time  (target <= 1.0)"
    )
    print_parts(results, [hand, ours])

    resident, loaded = "default experiment, data on device", "default experiment, DataLoaders"
    runs = alternate(
        {
            resident: ("ours", DEFAULT_EXPERIMENT),
            loaded: ("ours", (*DEFAULT_EXPERIMENT, "trainer.data_on_device=false")),
        },
        rounds,
    )
    results = best(runs)
    waits = {label: min(r["data_seconds"] for r in rs) for label, rs in runs.items()}
    print(
        f"default experiment (2 workers, best of {rounds}): data on the device {results[resident][speed]:.0f} "
        f"samples/s, through DataLoaders {results[loaded][speed]:.0f} -> "
        f"{results[resident][speed] / results[loaded][speed]:.2f}x (target > 1); waiting for batches "
        f"{waits[resident] * 1000:.0f} ms vs {waits[loaded] * 1000:.0f} ms per epoch",
        flush=True,
    )


GPU_PARTS = ("default", "resnet18", "resident", "shared")  # --only: the default experiment, resnet18, resnet18 on the
# device, two workers sharing the GPU (the last two each against the raw DataLoader loop)


def main_gpu(rounds: int, extra: list, parts: tuple = GPU_PARTS) -> None:
    """One GPU worker against the raw loop on the same GPU, per workload; then resnet18 with its data on the
    device against the raw DataLoader loop, and two workers on the one GPU."""
    speed = "samples_per_second"
    for part, (workload, overrides) in zip(GPU_PARTS, GPU_WORKLOADS.items(), strict=False):
        if part not in parts:
            continue
        overrides = (*GPU, *overrides, *extra)
        labels = {name: f"{workload}: {name}" for name in ("raw_gpu", "handwritten", "ours")}
        results = best(alternate({labels[name]: (name, overrides) for name in labels}, rounds))
        raw_, hand, ours_ = (results[labels[name]][speed] for name in ("raw_gpu", "handwritten", "ours"))
        print(
            f"{workload} (bf16-mixed, channels_last, best of {rounds}): raw PyTorch {raw_:.0f} samples/s, "
            f"the same loop in a hand-written Ray Train script {hand:.0f}, hydra_raytrain {ours_:.0f} -> "
            f"{ours_ / raw_:.3f}x raw (target >= 0.98), {ours_ / hand:.3f}x hand-written Ray Train",
            flush=True,
        )
    if not {"resident", "shared"} & set(parts):
        return
    resnet = (*GPU, *GPU_WORKLOADS["resnet18"], *extra)
    on_device = (*resnet, "trainer.data_on_device=true", *AUGMENT)
    shared = (*on_device, "scaling.num_workers=2", "scaling.resources_per_worker={GPU: 0.5}")
    raw_label = "resnet18: raw DataLoader loop"
    runs = {
        "resident": ("resnet18: data on the device", on_device),
        "shared": ("resnet18: 2 workers on the GPU", shared),
    }
    labels = {part: label for part, (label, _) in runs.items() if part in parts}
    contenders = {raw_label: ("raw_gpu", resnet), **{label: ("ours", runs[part][1]) for part, label in labels.items()}}
    results = best(alternate(contenders, rounds))
    raw_ = results[raw_label][speed]
    line = f"resnet18 CIFAR-shaped (best of {rounds}): raw DataLoader loop {raw_:.0f} samples/s"
    if "resident" in labels:
        resident = results[labels["resident"]][speed]
        line += f", data on the device {resident:.0f} -> {resident / raw_:.2f}x (target >= 2)"
    if "shared" in labels:
        two = results[labels["shared"]][speed]
        line += f", two workers sharing the GPU {two:.0f} -> {two / raw_:.2f}x"
    print(line, flush=True)


AUGMENT = ("trainer.augment.random_crop_padding=4", "trainer.augment.horizontal_flip=true")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] in ("raw", "raw_gpu", "plain_lightning", "handwritten", "ours"):
        globals()[sys.argv[1]](*sys.argv[2:])
    else:
        import argparse

        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument(
            "--gpu",
            action="store_true",
            help="one GPU worker against a raw loop on the same GPU (bf16-mixed, channels_last)",
        )
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument(
            "--override",
            action="append",
            default=[],
            help="a config override added to every GPU run, e.g. ray.include_dashboard=false",
        )
        parser.add_argument("--only", action="append", choices=GPU_PARTS, help="a part of the --gpu runs (repeatable)")
        args = parser.parse_args()
        if (args.override or args.only) and not args.gpu:
            parser.error("--override and --only apply to --gpu runs")
        if args.gpu:
            main_gpu(args.rounds, args.override, tuple(args.only or GPU_PARTS))
        else:
            main(args.rounds)
