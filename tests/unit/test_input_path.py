"""The input paths: the device-resident loader slices the DataLoader's batches, tensor augmentations are a function
of each sample's position (so of nothing a worker count or a resume changes), loader sizing, prefetching."""

import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.schema import DataLoaderConfig
from hydra_raytrain.data import fake
from hydra_raytrain.recipe.augment import Augment, position_hash
from hydra_raytrain.recipe.device_data import DeviceLoader, in_memory_tensors, load_tensors
from hydra_raytrain.recipe.loaders import (
    build_loader,
    copies_ahead,
    loader_processes,
    prefetched,
    sharded_sampler,
    worker_cpus,
)
from hydra_raytrain.recipe.sampler import ShardedSampler

CPU = torch.device("cpu")


def dataset(n=50):
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 3, 4, 5, generator=generator), torch.arange(n))


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("train", [True, False])
def test_the_device_loader_yields_the_dataloaders_batches(world, train):
    data = dataset()
    for rank in range(world):
        shard = dict(rank=rank, world_size=world, seed=4)
        loader = build_loader(data, 8, train=train, options=DataLoaderConfig(), **shard)
        resident = DeviceLoader(tuple(data.tensors), 8, sharded_sampler(len(data), train=train, **shard), CPU)
        for epoch, start in ((0, 0), (1, 16 * world)):  # a new order; a mid-epoch resume
            for sampler in (loader.sampler, resident.sampler):
                sampler.set_epoch(epoch, start=start if train else 0)
            expected, got = list(loader), list(resident)
            assert len(got) == len(expected) and len(resident) == len(loader)
            for a, b in zip(expected, got, strict=True):
                assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_device_loader_holds_floats_in_the_runs_dtype():
    data = dataset()
    resident = DeviceLoader(tuple(data.tensors), 8, ShardedSampler(len(data)), CPU, torch.float64)
    images, labels = next(iter(resident))
    assert images.dtype == torch.float64 and labels.dtype == torch.long


def test_in_memory_tensors_are_found_behind_subsets_only_in_tensor_datasets():
    data = dataset()
    images, labels = in_memory_tensors(Subset(Subset(data, [5, 3, 9]), [2, 0]))
    assert labels.tolist() == [9, 5] and torch.equal(images[0], data.tensors[0][9])
    assert in_memory_tensors(fake((3, 8, 8), 10, 4, 2).train) is None


def test_any_dataset_of_tensors_loads_whole_and_in_order():
    splits = fake((3, 8, 8), 10, 20, 4)
    images, labels = load_tensors(splits.train, 0, "train")
    assert images.shape == (20, 3, 8, 8) and labels.shape == (20,)
    for index in (0, 7, 19):
        assert torch.equal(images[index], splits.train[index][0]) and labels[index] == splits.train[index][1]


def test_a_dataset_of_other_things_is_refused_by_name():
    class Words(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, index):
            return "word", index

    with pytest.raises(
        ConfigError, match="train split's samples collate into tuple, Tensor, not tensors only"
    ) as caught:
        load_tensors(Words(), 0, "train")
    assert caught.value.key == "trainer.data_on_device"


def reference(images, hashes, padding):
    """Flip and crop, one image at a time."""
    out = []
    size = 2 * padding + 1
    for image, h in zip(images, hashes.tolist(), strict=True):
        image = image.flip(2) if h & 1 else image
        dy, dx = (h >> 1) % size, (h >> 17) % size
        out.append(F.pad(image, (padding,) * 4)[:, dy : dy + image.shape[1], dx : dx + image.shape[2]])
    return torch.stack(out)


@pytest.mark.parametrize("channels_last", [False, True])
def test_batched_crop_and_flip_match_one_image_at_a_time(channels_last):
    images, labels = dataset(16).tensors
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    positions = torch.arange(40, 56)
    augmented, same_labels = Augment(2, True, seed=3)([images, labels], 1, positions)
    assert torch.equal(augmented, reference(images, position_hash(3, 1, positions), 2))
    assert same_labels is labels
    assert augmented.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    flips = position_hash(3, 1, positions) & 1
    assert 0 < int(flips.sum()) < 16  # some flipped, some not


def test_augmentations_do_not_depend_on_the_worker_count_or_the_batching():
    """Global batch 12: one worker's batch of 12 is two workers' batches of 6, interleaved by position."""
    images = dataset(12).tensors[0]
    augment = Augment(3, True, seed=0)
    whole = augment(images, 5, torch.arange(12))
    for rank in range(2):
        positions = rank + 2 * torch.arange(6)
        assert torch.equal(augment(images[positions], 5, positions), whole[positions])
    assert not torch.equal(augment(images, 6, torch.arange(12)), whole)  # another epoch, other draws


def test_augmenting_a_batch_without_images_names_the_setting():
    with pytest.raises(ConfigError, match=r"this one is \[4, 10\]") as caught:
        Augment(4, False, seed=0)([torch.randn(4, 10), torch.zeros(4)], 0, torch.arange(4))
    assert caught.value.key == "trainer.augment"


def test_position_hashes_are_spread():
    hashes = position_hash(0, 0, torch.arange(10_000))
    assert hashes.min() >= 0 and len(set(hashes.tolist())) == 10_000
    crops = ((hashes >> 1) % 9).bincount(minlength=9)
    assert crops.min() > 900  # every one of the 9 offsets about 1,111 times


@pytest.mark.parametrize(
    "configured, cpus, in_memory, on_gpu, processes",
    [
        (None, 1, False, True, 0),
        (None, 4, False, True, 3),
        (None, 64, False, True, 8),
        (None, 16, True, True, 0),  # tensors in memory: no process
        (None, 16, False, False, 0),  # a CPU worker's CPUs compute
        (2, 1, True, False, 2),  # the config's word stands
    ],
)
def test_loader_processes_follow_the_workers_cpus(configured, cpus, in_memory, on_gpu, processes):
    assert loader_processes(configured, cpus, in_memory, on_gpu) == processes


def test_prefetched_batches_arrive_moved_and_in_order_on_cpu():
    batches = [torch.full((2,), float(i)) for i in range(5)]
    moved = list(prefetched(iter(batches), lambda b: b * 10, CPU, ahead=False))
    assert [b.tolist() for b in moved] == [[0.0, 0.0], [10.0, 10.0], [20.0, 20.0], [30.0, 30.0], [40.0, 40.0]]


def test_batches_are_copied_ahead_only_from_loader_processes_to_a_gpu():
    dataset = TensorDataset(torch.zeros(8, 2))
    with_processes = DataLoader(dataset, batch_size=2, num_workers=2)
    in_process = DataLoader(dataset, batch_size=2)
    on_device = DeviceLoader((torch.zeros(8, 2),), 2, ShardedSampler(8, 1, 0, shuffle=False), CPU)
    cuda = torch.device("cuda", 0)  # a device object only: nothing is allocated
    assert copies_ahead(with_processes, cuda)
    assert not copies_ahead(in_process, cuda)  # in-process loading draws from the checkpointed RNG
    assert not copies_ahead(on_device, cuda) and not copies_ahead(with_processes, CPU)


def test_outside_a_ray_worker_the_worker_has_the_processs_cores(monkeypatch):
    """Ray Train's local mode runs the loop in the driver, where Ray may be initialised: a driver has no
    assigned resources to ask for (Ray asserts)."""
    import ray

    class Driver:
        worker = type("Worker", (), {"mode": ray.SCRIPT_MODE})()

        def get_assigned_resources(self):
            raise AssertionError("only available in a worker")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", Driver)
    assert worker_cpus() == len(os.sched_getaffinity(0))


def test_a_resumed_rank_past_its_last_sample_has_no_indices():
    sampler = ShardedSampler(5, 2, 1, shuffle=False, pad=False)
    sampler.set_epoch(0, start=10)  # resumed after the end: an empty range whose start lies past its stop
    assert sampler.indices().tolist() == [] and list(sampler) == []
