"""What is learned and how it is scored. Installed as ``hydra_raytrain.tasks``; see ``base.Task``."""

from hydra_raytrain.tasks.base import StepOutput, Task

__all__ = ["StepOutput", "Task"]
