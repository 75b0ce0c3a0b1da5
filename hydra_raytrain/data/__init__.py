"""Dataset builders: each returns the train and validation splits (``Splits``) for the config's ``dataset`` node.
Exports resolve lazily: validating ``hydra_raytrain.data.digits`` on the driver does not import torchvision."""

from hydra_raytrain.runtime.lazy import lazy_exports

_EXPORTS = {
    "Splits": "splits",
    "digits": "bundled",
    "diabetes": "bundled",
    "fake": "vision",
    "imagefolder": "vision",
    "parquet": "streamed",
    "images": "streamed",
    "torchvision_builtin": "vision",
    "module_loaders": "module",
    "table": "tables",
    "text": "tokenized",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
