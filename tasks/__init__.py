"""What is learned and how it is scored. Installed as ``hydra_raytrain.tasks``; see ``base.Task``."""

from .base import StepOutput, Task

__all__ = ["StepOutput", "Task"]
