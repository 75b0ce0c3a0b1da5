"""The exception a user's own mistake turns into: a paragraph naming the key, the value and what is valid."""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Iterable, Iterator
from typing import Any


class ConfigError(ValueError):
    """A setting that cannot work, caught on the driver before any worker starts.

    The CLI prints ``str(error)`` alone (no traceback) and exits with status 2.
    """

    def __init__(self, key: str, value: Any, problem: str, valid: str | None = None):
        self.key, self.value, self.problem, self.valid = key, value, problem, valid
        super().__init__(f"Invalid config: {self.detail}")

    @property
    def detail(self) -> str:
        """The message without its "Invalid config: " opening."""
        return f"{self.key}={self.value!r}: {self.problem}" + (f" Valid: {self.valid}" if self.valid else "")

    @property
    def errors(self) -> list[ConfigError]:
        return [self]

    def within(self, context: str) -> ConfigError:
        """The same error with ``context`` (e.g. which sweep trial) added to its problem."""
        return ConfigError(self.key, self.value, f"{self.problem} ({context})", self.valid)

    def __reduce__(self):  # Ray copies and pickles exceptions raised in its processes (a sweep trial's train())
        return type(self), (self.key, self.value, self.problem, self.valid)


class ConfigErrors(ConfigError):
    """Several problems found in one pass, reported together: the user fixes them in one go, not one run each."""

    def __init__(self, errors: Iterable[ConfigError]):
        self._errors = [single for error in errors for single in error.errors]
        first = self._errors[0]
        self.key, self.value, self.problem, self.valid = first.key, first.value, first.problem, first.valid
        lines = "\n".join(f"  - {error.detail}" for error in self._errors)
        ValueError.__init__(self, f"Invalid config: {len(self._errors)} problems\n{lines}")

    @property
    def errors(self) -> list[ConfigError]:
        return list(self._errors)

    def within(self, context: str) -> ConfigError:
        return ConfigErrors(error.within(context) for error in self._errors)

    def __reduce__(self):
        return type(self), (self._errors,)


class Problems:
    """Collects config errors from independent checks, so that one run reports every problem it finds."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    @contextlib.contextmanager
    def collect(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as error:
            self.errors += error.errors

    def add(self, error: ConfigError) -> None:
        self.errors.append(error)

    def failed(self, *sections: str) -> bool:
        """Whether a problem was found in one of these top-level sections: a check that reads them then waits."""
        return any(error.key.split(".")[0].split("[")[0] in sections for error in self.errors)

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ConfigErrors(self.errors)


def one_line(error: BaseException) -> str:
    """An exception's message on one line, without Hydra's and OmegaConf's ``full_key:`` lines."""
    lines = (line.strip() for line in str(error).splitlines())
    return " ".join(line for line in lines if line and not line.startswith("full_key:"))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a close match exists, else an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def redacted(text: str) -> str:
    """Credentials out of the URIs in ``text``: ``http://user:secret@host`` -> ``http://***@host``."""
    return re.sub(r"(\w+://)[^/@\s]+@", r"\1***@", text)
