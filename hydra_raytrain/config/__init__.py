"""Config: typed schemas for the framework's own settings, and driver-side validation of the whole config."""

from hydra_raytrain.config.errors import ConfigError, ConfigErrors
from hydra_raytrain.config.identity import register_resolver, run_name
from hydra_raytrain.config.schema import register_configs
from hydra_raytrain.config.validate import validate

register_configs()
register_resolver()

__all__ = ["ConfigError", "ConfigErrors", "run_name", "validate"]
