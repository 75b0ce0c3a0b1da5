"""A GAN: two models, two optimizers, and a task that owns its step (RaySGD's custom ``train_batch``).

The runner still wraps both models in DDP, runs autocast and the fp16 scaler, accumulates, clips,
checkpoints and resumes both models and both optimizers. Metrics: ``loss_d``, ``loss_g`` and the
discriminator's mean belief that real / generated images are real (``d_real``, ``d_fake``). After each
epoch, rank 0 writes a grid of samples from fixed noise to ``<run dir>/samples/epoch_NNNN.png``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import Step, Sums, Task

SAMPLES_DIR = "samples"


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """No gradients into ``module``'s parameters (the generator's loss goes through the discriminator)."""
    flags = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for parameter, flag in zip(module.parameters(), flags, strict=True):
            parameter.requires_grad_(flag)


class GAN(Task):
    monitor = "val_loss_g"
    mode = "min"

    def __init__(self, latent_dim: int = 32, num_samples: int = 64, sample_seed: int = 0):
        self.latent_dim, self.num_samples, self.sample_seed = latent_dim, num_samples, sample_seed

    def _noise(self, count: int, device: torch.device) -> torch.Tensor:
        return torch.randn(count, self.latent_dim, device=device)

    def _losses(self, generator: nn.Module, discriminator: nn.Module, real: torch.Tensor):
        """Generated images, the discriminator's loss (one forward over real and detached fakes: one DDP
        forward per backward), its logits."""
        fake = generator(self._noise(len(real), real.device))
        logits = discriminator(torch.cat([real, fake.detach()]))
        targets = torch.cat([torch.ones(len(real), device=real.device), torch.zeros(len(real), device=real.device)])
        return fake, F.binary_cross_entropy_with_logits(logits.float(), targets), logits.detach().float()

    def _sums(self, loss_d: torch.Tensor, loss_g: torch.Tensor, logits: torch.Tensor, count: int) -> Sums:
        real_logits, fake_logits = logits.chunk(2)
        return {
            "loss_d": loss_d.detach() * count,
            "loss_g": loss_g.detach() * count,
            "d_real": torch.sigmoid(real_logits).sum(),
            "d_fake": torch.sigmoid(fake_logits).sum(),
            "count": logits.new_full((), count),
        }

    def train_batch(self, step: Step, batch: Any) -> Sums:
        real = batch[0]
        generator, discriminator = step.models["generator"], step.models["discriminator"]
        with step.forward():
            fake, loss_d, logits = self._losses(generator, discriminator, real)
        step.optimize(loss_d, "discriminator")
        # The generator's step: through the discriminator outside DDP (its gradients are not wanted, and a
        # second DDP forward before the next backward would confuse DDP's reducer).
        with frozen(step.unwrapped["discriminator"]), step.forward():
            outputs = step.unwrapped["discriminator"](fake).float()
            loss_g = F.binary_cross_entropy_with_logits(outputs, torch.ones_like(outputs))
        step.optimize(loss_g, "generator")
        return self._sums(loss_d, loss_g, logits, len(real))

    def validation_step(self, models: dict[str, nn.Module], batch) -> Sums:
        real = batch[0]
        fake, loss_d, logits = self._losses(models["generator"], models["discriminator"], real)
        outputs = models["discriminator"](fake).float()
        loss_g = F.binary_cross_entropy_with_logits(outputs, torch.ones_like(outputs))
        return self._sums(loss_d, loss_g, logits, len(real))

    @torch.no_grad()
    def on_epoch_end(self, models: dict[str, nn.Module], epoch: int, run_dir: str) -> None:
        from torchvision.utils import save_image

        generator = models["generator"]
        device = next(generator.parameters()).device
        noise = torch.randn(
            self.num_samples, self.latent_dim, generator=torch.Generator().manual_seed(self.sample_seed)
        ).to(device)
        was_training = generator.training
        generator.eval()
        images = generator(noise).float().cpu()
        generator.train(was_training)
        if images.shape[-1] < 32:  # tiny images (8x8 digits) upscaled, so the grid is readable
            images = F.interpolate(images, scale_factor=32 // images.shape[-1], mode="nearest")
        os.makedirs(os.path.join(run_dir, SAMPLES_DIR), exist_ok=True)
        save_image(
            images,
            os.path.join(run_dir, SAMPLES_DIR, f"epoch_{epoch:04d}.png"),
            nrow=int(self.num_samples**0.5),
            padding=1,
        )
