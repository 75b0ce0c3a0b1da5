"""Callbacks from config: code of the user's own (or the shipped ones) run at fixed points of the worker loop.

    python -m hydra_raytrain callbacks=[lr_monitor,loss_guard]

:class:`Callback` lists the hooks; ``conf/callbacks/`` the shipped ones.
"""

from hydra_raytrain.callbacks.base import Callback, RunState

__all__ = ["Callback", "RunState"]
