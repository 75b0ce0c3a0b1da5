"""Is a config value plainly of the wrong type for a callable's parameter? Judged from the parameter's annotation
where it is a plain one (numbers, bool, str, None, lists and tuples of them, ``torch.Tensor``), else from its
default's type. "Cannot tell" passes: a nested ``_target_`` node, a type we do not know, no hint and no default.

``optimizer.lr=abc`` is then a config error naming its key, instead of torch's ``'<=' not supported between
instances of 'float' and 'str'`` from inside every worker.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

NUMBER = "a number"
_PLAIN = {bool: "true or false", int: "an integer", float: NUMBER, str: "a string", type(None): "null"}
_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def wrong_type(value: Any, hint: Any, default: Any = inspect.Parameter.empty) -> str | None:
    """What the parameter takes, in words, when ``value`` plainly does not fit it; None when it fits or we cannot
    tell."""
    if isinstance(value, dict) and "_target_" in value:
        return None  # Hydra instantiates it first
    if value is None and default is None:
        return None  # `x: int = None`: an implicit Optional
    if hint is not None:
        verdict = _fits(value, _strip_annotated(hint))
        return None if verdict is not False else describe(_strip_annotated(hint))
    return _wrong_for_default(value, default)


def _fits(value: Any, hint: Any) -> bool | None:
    """True, False, or None (cannot tell)."""
    if hint is Any or isinstance(hint, typing.TypeVar):
        return True
    if hint in (bool, int, float, str, type(None)):
        return _fits_plain(value, hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        verdicts = [_fits(value, arg) for arg in args]
        return True if True in verdicts else (None if None in verdicts else False)
    if origin in (tuple, list) or _is_sequence(origin):
        return _fits_sequence(value, origin, args)
    if _is_tensor(hint):
        return False if isinstance(value, (bool, int, float, str, list, dict)) else None
    return None


def _fits_plain(value: Any, hint: type) -> bool:
    if isinstance(value, bool) and hint in (int, float):
        return False
    if hint is float:
        return isinstance(value, (int, float))
    if hint is int:  # 1e4 is an int written as a float
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return isinstance(value, hint)


def _fits_sequence(value: Any, origin: Any, args: tuple[Any, ...]) -> bool | None:
    if not isinstance(value, (list, tuple)):
        return False
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            return False
        verdicts = [_fits(item, arg) for item, arg in zip(value, args, strict=False)]
    else:
        verdicts = [_fits(item, args[0]) for item in value] if args else []
    return False if False in verdicts else (None if None in verdicts else True)


def _wrong_for_default(value: Any, default: Any) -> str | None:
    """No usable hint: a string or a mapping where the default is a number or a bool (a list may be a per-group
    value, as CyclicLR's base_momentum; a number may stand for a bool)."""
    if default is inspect.Parameter.empty or default is None or not isinstance(value, (str, dict)):
        return None
    if isinstance(default, bool):
        return _PLAIN[bool]
    if isinstance(default, (int, float)):
        return NUMBER
    return None


def describe(hint: Any) -> str:
    if hint in _PLAIN:
        return _PLAIN[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        words = [describe(arg) for arg in args if arg is not type(None) and not _is_tensor(arg)]
        return " or ".join(dict.fromkeys(words)) + (" or null" if type(None) in args else "")
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)}: [{', '.join(describe(arg) for arg in args)}]"
    if origin in (tuple, list) or _is_sequence(origin):
        return f"a list of {_PLURAL.get(args[0], describe(args[0]))}" if args else "a list"
    return getattr(hint, "__name__", str(hint))


def _strip_annotated(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def _is_sequence(origin: Any) -> bool:
    import collections.abc

    return origin in (collections.abc.Sequence, collections.abc.MutableSequence)


def _is_tensor(hint: Any) -> bool:
    return getattr(hint, "__module__", "") == "torch" and getattr(hint, "__name__", "") == "Tensor"
