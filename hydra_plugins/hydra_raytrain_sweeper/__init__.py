"""Hydra discovers plugins in the ``hydra_plugins`` namespace: this one adds ``hydra/sweeper=ray_tune``."""
