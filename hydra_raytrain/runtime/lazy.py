"""Package exports resolved on first use (PEP 562), so a config's ``_target_`` imports only what it names."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for ``package``; ``exports`` maps a name to the submodule defining it."""

    def __getattr__(name: str):
        if name in exports:
            module = importlib.import_module(f"{package}.{exports[name]}")
            # Bind every export of that submodule on the package: importing a submodule binds its name there
            # (hydra_raytrain.evaluate, the module), which would otherwise hide the function of the same name.
            for other, where in exports.items():
                if where == exports[name]:
                    setattr(sys.modules[package], other, getattr(module, other))
            return getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(exports)

    return __getattr__, __dir__
