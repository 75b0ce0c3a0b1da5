"""Memory: each rank's parameter and optimizer-state bytes under DDP and FSDP, and the activations that activation
checkpointing frees.

    .venv/bin/python benchmarks/memory.py            # or: make bench-memory

1. Per rank, from the runs' own metrics (``param_bytes``, ``optimizer_state_bytes``: rank 0's share): resnet18 on
   64x64 fake images, AdamW, 2 CPU workers, one short epoch each with DDP and with FSDP (``BasicBlock`` units),
   each a fresh CLI process on its own local cluster.
2. Activations, in this process: resnet18, a batch of 32 64x64 images, one forward and backward, without and with
   ``trainer.activation_checkpointing=full`` on ``BasicBlock`` (the runner's own ``checkpoint_activations``). Every
   tensor that the ops allocate is tracked until freed (a TorchDispatchMode): printed are the bytes still held when
   the forward ends (what the backward needs: the activations), the peak over forward and backward (gradients
   included), and the time of the step (recomputation is the cost).
"""

from __future__ import annotations

import os
import sys
import time
import weakref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.cli_run import epoch_metrics  # noqa: E402

COMMON = [
    "model=resnet18",
    "dataset=fake",
    "dataset.input_shape=[3,64,64]",
    "optimizer=adamw",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.batch_size=32",
    "scaling.num_workers=2",
    "trainer.progress_bar=false",
]
STRATEGIES = {
    "DDP": [],
    "FSDP": ["trainer.parallel_strategy=fsdp", "fsdp.shard_modules=[BasicBlock]"],
}
MIB = 2**20


def per_rank_bytes(overrides: list[str]) -> dict[str, float]:
    last = epoch_metrics([*COMMON, *overrides])[0][-1]
    return {name: last[name] for name in ("param_bytes", "optimizer_state_bytes")}


def live_bytes_mode():
    """A TorchDispatchMode that adds up the bytes of every storage an op returns while a tensor still holds it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.holders: dict[int, int] = {}  # storage address -> tensors alive on it
            self.live = self.peak = 0

        def track(self, tensor: torch.Tensor, key: int, size: int) -> None:
            if key not in self.holders:
                self.holders[key] = 0
                self.live += size
                self.peak = max(self.peak, self.live)
            self.holders[key] += 1
            weakref.finalize(tensor, self.release, key, size)

        def release(self, key: int, size: int) -> None:
            self.holders[key] -= 1
            if not self.holders[key]:
                del self.holders[key]
                self.live -= size

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().nbytes():
                    storage = leaf.untyped_storage()
                    self.track(leaf, storage.data_ptr(), storage.nbytes())
            return out

    return LiveBytes()


def activation_bytes(recompute: bool) -> tuple[float, float, float]:
    """Bytes held after the forward, peak bytes, seconds of forward + backward."""
    import torch

    from hydra_raytrain.models import torchvision_resnet
    from hydra_raytrain.recipe.parallel import checkpoint_activations

    torch.manual_seed(0)
    model = torchvision_resnet("resnet18", [3, 64, 64], 10)
    if recompute:
        checkpoint_activations(model, ["BasicBlock"])
    images, labels = torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))
    torch.nn.functional.cross_entropy(model(images), labels).backward()  # warm-up
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    with live_bytes_mode() as mode:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        held = mode.live
        loss.backward()
    return held, mode.peak, time.perf_counter() - started


def main() -> None:
    figures = {label: per_rank_bytes(overrides) for label, overrides in STRATEGIES.items()}
    for label, values in figures.items():
        print(
            f"{label:5} per rank: parameters {values['param_bytes'] / MIB:6.1f} MiB, "
            f"optimizer state {values['optimizer_state_bytes'] / MIB:6.1f} MiB"
        )
    for name in ("param_bytes", "optimizer_state_bytes"):
        print(f"FSDP / DDP {name}: {figures['FSDP'][name] / figures['DDP'][name]:.3f}")
    plain, recomputed = activation_bytes(False), activation_bytes(True)
    for label, (held, peak, seconds) in (("no recompute", plain), ("BasicBlock recomputed", recomputed)):
        print(
            f"{label:22} activations held after forward {held / MIB:6.1f} MiB, peak {peak / MIB:6.1f} MiB, "
            f"step {seconds * 1000:5.0f} ms"
        )
    print(
        f"activation checkpointing: activations {recomputed[0] / plain[0]:.2f}x, peak {recomputed[1] / plain[1]:.2f}x, "
        f"step time {recomputed[2] / plain[2]:.2f}x"
    )


if __name__ == "__main__":
    main()
