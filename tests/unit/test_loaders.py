"""DataLoaders as configured (Ray's prepare_data_loader would drop some options), seeded per rank and worker."""

import dataclasses

import numpy as np
import torch
from torch.utils.data import Dataset

from hydra_raytrain.config.schema import DataLoaderConfig
from hydra_raytrain.recipe.loaders import build_loader


class Draws(Dataset):
    """Each item is what numpy's and torch's global RNGs give inside the loader worker that loads it."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor([float(np.random.randint(1 << 30)), float(torch.randint(1 << 30, ()).item())])


OPTIONS = DataLoaderConfig(num_workers=2, pin_memory=False, persistent_workers=True, prefetch_factor=3)


def test_loader_options_are_honoured():
    loader = build_loader(Draws(), 2, train=True, rank=0, world_size=2, seed=0, options=OPTIONS)
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (2, True, 3)
    assert len(loader) == 2  # 4 of 8 items for rank 0 of 2, batches of 2


def test_loader_workers_draw_differently_per_rank_and_per_worker():
    draws = []
    for rank in (0, 1):
        loader = build_loader(
            Draws(),
            1,
            train=True,
            rank=rank,
            world_size=2,
            seed=0,
            options=dataclasses.replace(OPTIONS, persistent_workers=False, prefetch_factor=None),
        )
        draws += [tuple(batch[0].tolist()) for batch in loader]
    numpy_draws, torch_draws = [d[0] for d in draws], [d[1] for d in draws]
    # 2 ranks x 4 positions, each sample seeded by its position in the epoch: no two draws repeat.
    assert len(set(numpy_draws)) == 8 and len(set(torch_draws)) == 8


def test_loader_processes_draw_the_same_per_position_however_many_there_are():
    """Each training sample is seeded by its position in the epoch (torch's CPU generator, numpy), in the loader
    process that loads it: one process or three, the same draws for the same positions."""
    draws = {}
    for processes in (1, 3):
        options = dataclasses.replace(OPTIONS, num_workers=processes, persistent_workers=False, prefetch_factor=None)
        loader = build_loader(Draws(), 1, train=True, rank=1, world_size=2, seed=5, options=options)
        draws[processes] = [tuple(batch[0].tolist()) for batch in loader]
    assert draws[1] == draws[3] and len(set(draws[1])) == 4
