"""The shell of every command of the package (``hydra-raytrain train|check|evaluate|export|predict|serve``, and
their ``python -m`` forms): its options, its refusals, its exit codes and its end.
Import-light (the standard library and the config's errors)."""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from hydra_raytrain.config.errors import ConfigError

_ending_quickly = False


def end_quickly() -> None:
    """The process skips its interpreter's garbage collections at exit (after the ``atexit`` handlers, and during
    the modules' teardown): an ``atexit`` handler freezes the objects alive then (``gc.freeze``) instead. With torch,
    Ray and Hydra imported those traversals take ~0.6-1 s of every command on 2 cores, for memory the operating system
    takes back anyway. The libraries' own ``atexit`` handlers run as before (Ray's shutdown, W&B's, MLflow's,
    logging's flush, ``weakref.finalize``'s), and so do the standard streams' flush and the exit code. What no longer
    happens: finalizing an object that only a reference cycle keeps at exit (its ``__del__``, weakref callbacks, the
    buffer of a file it holds open): Python does not promise those at exit either, and the package closes its files
    itself; code of a user's own running in the driver should too. A test that calls a command's ``main`` inside the
    pytest process freezes that process's exit the same way, and nothing earlier."""
    global _ending_quickly
    if not _ending_quickly:
        atexit.register(gc.freeze)
        _ending_quickly = True


def at_least_one(text: str) -> int:
    """An option's whole number >= 1 (``type=`` of argparse), else argparse's one-line refusal naming the option,
    before anything starts."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number >= 1")
    return int(text)


# The exit codes every command shares (the README's table): a config or input that cannot work, a command that
# was refused or failed, a run preempted (SIGTERM: the same command resumes it; notice.PREEMPTED_EXIT_CODE).
BAD_INPUT = 2
FAILED = 1


@dataclass(frozen=True)
class Command:
    """One command of the package that reads a finished run (evaluate, export, predict, serve): its options and its
    body, and what the shell around it owns. ``run`` parses the command line (argparse's one-line refusal, exit 2),
    checks that ``run_folder``'s argument is a folder, then calls ``body``: a ``ConfigError`` is printed with its
    opening "Invalid config" replaced by ``refused`` (exit 2), one of ``failures`` as ``failed: <message>`` (exit 1);
    what ``body`` returns is the exit code (None: 0)."""

    name: str  # python -m hydra_raytrain.<name>, hydra-raytrain <name>
    doc: str  # the module's docstring: its first paragraph is the description --help prints
    options: Callable[[argparse.ArgumentParser], None]
    body: Callable[[argparse.Namespace], int | None]
    refused: str  # "Cannot evaluate this run here"
    failed: str = ""  # "Export refused": the opening of a failure's line
    failures: tuple[type[BaseException], ...] = ()
    run_folder: str | None = "run"  # the option naming the run dir, checked before anything starts

    def parser(self, prog: str | None = None) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=prog or f"python -m hydra_raytrain.{self.name}", description=self.doc.split("\n\n")[0]
        )
        self.options(parser)
        return parser

    def run(self, argv: Sequence[str] | None = None, prog: str | None = None) -> None:
        end_quickly()
        parser = self.parser(prog)
        options = parser.parse_args(argv)
        if self.run_folder is not None and not os.path.isdir(getattr(options, self.run_folder)):
            parser.error(f"{getattr(options, self.run_folder)}: no such folder")
        try:
            code = self.body(options)
        except ConfigError as error:
            print(refusal(error, self.refused), file=sys.stderr)
            sys.exit(BAD_INPUT)
        except self.failures as error:
            print(f"{self.failed}: {error}", file=sys.stderr)
            sys.exit(FAILED)
        if code:
            sys.exit(code)


def refusal(error: ConfigError, opening: str = "Invalid config") -> str:
    """A config error as a command says it: its message opened by the command's own words."""
    return str(error).replace("Invalid config", opening, 1)


def refuse(error: ConfigError, opening: str = "Invalid config") -> NoReturn:
    """Print a config error as the command says it and exit with the bad-input code (2)."""
    print(refusal(error, opening), file=sys.stderr)
    sys.exit(BAD_INPUT)
