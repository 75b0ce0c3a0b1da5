"""Config's ground floor: the typed schema of the framework's own settings (``schema.py``; a sweep's
``hydra.sweeper.*``: ``sweeper.py``), ``ConfigError``, the resolved config (``resolved.py``), path markers, the
monitored-metric rule and the run's name. It imports neither torch nor Ray nor anything of this package above it, so
anything may import it cheaply; the checks that build datasets, models and tasks are the floor above the worker side,
``hydra_raytrain/preflight/``."""

from hydra_raytrain.config.errors import ConfigError, ConfigErrors

__all__ = ["ConfigError", "ConfigErrors"]
