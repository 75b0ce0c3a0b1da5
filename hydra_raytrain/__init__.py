"""hydra_raytrain: Hydra configs in, PyTorch DDP runs on Ray Train out.

    python -m hydra_raytrain                      # the embedded default: digits, a small CNN, 2 CPU workers
    python -m hydra_raytrain model=resnet18 scaling.num_workers=4

What a program or an extension imports, from this one place:

- running and reading runs: ``train``, ``evaluate``, ``load_model``, ``TrainingFailed``, ``ConfigError``;
- a task of your own (docs/own-task.md): ``Task``, ``StepOutput``, ``Sums``, ``Step`` (what ``train_batch`` gets);
- a dataset builder of your own (docs/own-data.md): ``Splits``, and the path markers ``ExistingDir`` /
  ``LocalPath`` for its arguments;
- a logger of your own (docs/architecture.md): the ``Logger`` protocol.

The exports load on first use: Ray Train's controller and Tune's trial processes unpickle our callbacks
(hydra_raytrain.storage.rundir ...) and should not pay for torch, Hydra and rich through this file.
"""

from hydra_raytrain.runtime.lazy import lazy_exports

_EXPORTS = {
    "train": "driver.run",
    "TrainingFailed": "driver.run",
    "evaluate": "inference.evaluate",
    "load_model": "inference.evaluate",
    "ConfigError": "config",
    "Task": "tasks.base",
    "StepOutput": "tasks.base",
    "Sums": "tasks.base",
    "Step": "tasks.base",
    "Splits": "data.splits",
    "ExistingDir": "config.paths",
    "LocalPath": "config.paths",
    "Logger": "loggers.base",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
