"""ShardedSampler: disjoint covering shards, new order per epoch, order independent of the worker count."""

import pytest

from hydra_raytrain.recipe.sampler import ShardedSampler


def shards(size, world, epoch=0, pad=True, shuffle=True, seed=0):
    samplers = [ShardedSampler(size, world, rank, shuffle=shuffle, seed=seed, pad=pad) for rank in range(world)]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return [list(sampler) for sampler in samplers]


@pytest.mark.parametrize("size, world", [(100, 1), (100, 2), (101, 3), (7, 4)])
def test_unpadded_shards_are_disjoint_and_cover_the_data(size, world):
    parts = shards(size, world, pad=False)
    flat = [i for part in parts for i in part]
    assert sorted(flat) == list(range(size))
    assert [len(p) for p in parts] == [
        len(s) for s in (ShardedSampler(size, world, r, pad=False) for r in range(world))
    ]


@pytest.mark.parametrize("size, world", [(100, 2), (101, 3), (7, 4)])
def test_padded_shards_are_equal_length_and_cover_the_data(size, world):
    parts = shards(size, world, pad=True)
    assert len({len(p) for p in parts}) == 1
    assert set(i for p in parts for i in p) == set(range(size))
    assert sum(map(len, parts)) - size < world  # at most world-1 samples repeated


def test_order_changes_between_epochs_and_repeats_for_the_same_epoch():
    assert shards(50, 2, epoch=0) != shards(50, 2, epoch=1)
    assert shards(50, 2, epoch=3) == shards(50, 2, epoch=3)
    assert shards(50, 2, epoch=0, seed=1) != shards(50, 2, epoch=0, seed=0)


def test_global_batches_do_not_depend_on_the_worker_count():
    size, global_batch = 96, 12
    for world in (1, 2, 3, 4):
        parts, per_worker = shards(size, world, epoch=5), global_batch // world
        batches = [
            sorted(i for p in parts for i in p[k * per_worker : (k + 1) * per_worker])
            for k in range(size // global_batch)
        ]
        if world == 1:
            reference = batches
        assert batches == reference


def test_no_shuffle_keeps_the_data_order():
    assert shards(6, 2, shuffle=False, pad=False) == [[0, 2, 4], [1, 3, 5]]


@pytest.mark.parametrize("size, world, batch, done", [(100, 2, 5, 3), (101, 3, 4, 8), (7, 4, 1, 1), (30, 1, 7, 4)])
def test_a_mid_epoch_start_yields_exactly_the_rest_of_the_epoch(size, world, batch, done):
    """Resuming after ``done`` batches: each rank continues its own sequence, no sample seen twice, none missed."""
    whole = shards(size, world, epoch=2)
    samplers = [ShardedSampler(size, world, rank) for rank in range(world)]
    for sampler in samplers:
        sampler.set_epoch(2, start=done * batch * world)
    rest = [list(sampler) for sampler in samplers]
    assert rest == [part[done * batch :] for part in whole]
    assert [len(s) for s in samplers] == [len(r) for r in rest]
    samplers[0].set_epoch(3)  # the next epoch starts from its beginning again
    assert list(samplers[0]) == shards(size, world, epoch=3)[0]


def test_seeded_positions_are_pairs_with_a_seed_per_position_and_epoch():
    sampler = ShardedSampler(10, 2, 1, seed=4, seeds=True)
    sampler.set_epoch(1)
    pairs = list(sampler)
    assert [index for index, _ in pairs] == shards(10, 2, epoch=1, seed=4)[1]
    assert len({seed for _, seed in pairs}) == len(pairs)
    sampler.set_epoch(1, start=4)  # a resumed epoch draws the same seeds for the same positions
    assert list(sampler) == pairs[2:]
    sampler.set_epoch(2)
    assert {seed for _, seed in sampler}.isdisjoint(seed for _, seed in pairs)


def test_seeded_samples_make_augmentations_depend_on_the_position_only():
    import random

    import numpy as np
    import torch

    from hydra_raytrain.recipe.sampler import SeededSamples

    class Noisy(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return [index + float(torch.rand(())), np.random.rand(), random.random()]

    data = SeededSamples(Noisy())
    first = data[(2, 123)]
    torch.rand(5), np.random.rand(3), random.random()  # whatever ran before in this process
    again, other = data[(2, 123)], data[(2, 124)]
    assert again == first and all(a != b for a, b in zip(other, first, strict=True))
