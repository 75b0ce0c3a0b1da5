"""hydra_raytrain: Hydra configs in, PyTorch DDP runs on Ray Train out.

    python -m hydra_raytrain                      # the embedded default: digits, a small CNN, 2 CPU workers
    python -m hydra_raytrain model=resnet18 scaling.num_workers=4
"""

from hydra_raytrain.config import ConfigError
from hydra_raytrain.driver.run import TrainingFailed, train
from hydra_raytrain.evaluate import evaluate, load_model

__all__ = ["ConfigError", "TrainingFailed", "evaluate", "load_model", "train"]
