"""The config files, installed as ``hydra_raytrain.conf``. Importing this package (Hydra does, for
``pkg://hydra_raytrain.conf``, as does ``initialize_config_module("hydra_raytrain.conf")``) registers what the files
name: the typed schema (``train_schema``, in Hydra's ConfigStore) and the resolvers (``${run_name:}``, ...)."""

from hydra_raytrain.config.schema import register_configs
from hydra_raytrain.preflight.resolvers import register_resolvers

register_configs()
register_resolvers()
