"""hydra_raytrain: Hydra configs in, PyTorch DDP runs on Ray Train out.

    python -m hydra_raytrain                      # the embedded default: digits, a small CNN, 2 CPU workers
    python -m hydra_raytrain model=resnet18 scaling.num_workers=4

The exports load on first use: Ray Train's controller and Tune's trial processes unpickle our callbacks
(hydra_raytrain.rundir ...) and should not pay for torch, Hydra and rich through this file.
"""

from hydra_raytrain.lazy import lazy_exports

__all__ = ["ConfigError", "TrainingFailed", "evaluate", "load_model", "train"]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ConfigError": "config",
        "TrainingFailed": "driver.run",
        "train": "driver.run",
        "evaluate": "evaluate",
        "load_model": "evaluate",
    },
)
