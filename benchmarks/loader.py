"""The training DataLoader a worker builds (``recipe.loaders.build_loader``) against torch's own, on one dataset.

    .venv/bin/python benchmarks/loader.py            # or: make bench-loader
    .venv/bin/python benchmarks/loader.py --rounds 1 --processes 8

What bench-gpu's resnet18 DataLoader path waits on, without a GPU or a model: FakeData 3x32x32 (25,600 images,
resnet18's workload there), batch 256, ``--processes`` loader processes (default: one per core, at most 8),
persistent. Ours samples through ShardedSampler's ``(index, seed)`` pairs and seeds each sample (exact augmentations
after a mid-epoch resume); torch's is ``DataLoader(shuffle=True)``. Both are iterated in this process, alternating,
one epoch each per round after a warm-up epoch. Printed: samples/s per round and the ratio of the best of each.
What ours adds per sample is seeding torch's CPU generator, numpy and random (~12 us on a 2-core AMD EPYC, where
a FakeData image takes ~300 us, a third of it FakeData's own ``torch.manual_seed``): the GPU benchmark holds ours to
0.98x the raw loop, and its loader must not be why.
"""

from __future__ import annotations

import argparse
import time

SIZE, BATCH = 25_600, 256


def epoch(loader) -> float:
    """Samples/s of one pass over ``loader``."""
    started, samples = time.perf_counter(), 0
    for images, _ in loader:
        samples += len(images)
    return samples / (time.perf_counter() - started)


def main() -> None:
    from hydra import compose, initialize_config_module
    from hydra.utils import instantiate
    from torch.utils.data import DataLoader

    from hydra_raytrain.recipe.loaders import build_loader
    from hydra_raytrain.runtime.host import machine_cores

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=min(8, machine_cores()))
    options = parser.parse_args()
    if options.processes < 1:
        parser.error("--processes: at least 1 (what is measured is loader processes)")
    overrides = ["dataset=fake", f"dataset.train_size={SIZE}", "dataset.val_size=256"]
    overrides += [f"trainer.dataloader.num_workers={options.processes}", "trainer.dataloader.persistent_workers=true"]
    with initialize_config_module("hydra_raytrain.conf", version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    train = instantiate(cfg.dataset, _convert_="all").train
    loaders = {
        "torch's DataLoader": DataLoader(
            train, batch_size=BATCH, shuffle=True, num_workers=options.processes, persistent_workers=True
        ),
        "ours (build_loader)": build_loader(
            train, BATCH, train=True, rank=0, world_size=1, seed=0, options=cfg.trainer.dataloader
        ),
    }
    for loader in loaders.values():
        epoch(loader)  # the loader processes start
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for round_ in range(options.rounds):
        for name in list(loaders) if round_ % 2 == 0 else reversed(list(loaders)):
            rates[name].append(epoch(loaders[name]))
            print(f"round {round_ + 1} {name:20s} {rates[name][-1]:8,.0f} samples/s", flush=True)
    torch_, ours = (max(values) for values in rates.values())
    print(
        f"{options.processes} loader processes, best of {options.rounds}: torch's DataLoader {torch_:,.0f} samples/s, "
        f"ours {ours:,.0f} -> {ours / torch_:.2f}x",
        flush=True,
    )


if __name__ == "__main__":
    main()
