"""The one exception a user's own mistake turns into: a paragraph naming the key, the value and what is valid."""

from __future__ import annotations

import difflib
from typing import Any, Iterable


class ConfigError(ValueError):
    """A setting that cannot work, caught on the driver before any worker starts.

    The CLI prints ``str(error)`` alone (no traceback) and exits with status 2.
    """

    def __init__(self, key: str, value: Any, problem: str, valid: str | None = None):
        self.key, self.value, self.problem, self.valid = key, value, problem, valid
        message = f"Invalid config: {key}={value!r}: {problem}"
        if valid:
            message += f" Valid: {valid}"
        super().__init__(message)

    def __reduce__(self):  # Ray copies and pickles exceptions raised in its processes (a sweep trial's train())
        return type(self), (self.key, self.value, self.problem, self.valid)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a close match exists, else an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
