"""Where a run came from, recorded with it: the command line, the launch folder's git commit (and whether it had
uncommitted changes), the versions of what trained it, Python, the host and the accelerator. ``summary.json``'s
``provenance``, and the loggers' (W&B's config, a TensorBoard text entry).

Each part that cannot be found (no git, not a repository, a package without metadata) is null: provenance never
fails a run."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import socket
import subprocess
import sys
from typing import Any

from hydra_raytrain.config.redact import redact_text

PACKAGES = {"torch": "torch", "ray": "ray", "hydra": "hydra-core", "hydra_raytrain": "hydra_raytrain"}


def provenance(model_target: str | None = None, launch_dir: str | None = None) -> dict[str, Any]:
    """The run's provenance; ``model_target``: the model's ``_target_`` (its package's version is recorded)."""
    import torch

    folder = launch_dir or os.getcwd()
    versions = {name: _version(distribution) for name, distribution in PACKAGES.items()}
    versions["torch"] = torch.__version__  # with its build's local tag (+cu130): which CUDA it was built for
    top = (model_target or "").split(".", 1)[0]
    if top and top not in ("hydra_raytrain", "torch", "tests"):
        versions[top] = _distribution_version(top)
    return {
        "command": command_line(sys.argv),
        "launch_dir": folder,
        "git": git_state(folder),
        "versions": versions,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "accelerator": accelerator(),
    }


def command_line(argv: list[str]) -> str:
    """The command as typed: ``python -m hydra_raytrain ...`` for the module's entry point; its secrets written
    ``***`` (config/redact.py)."""
    program = argv[0] if argv else ""
    if program.endswith(os.path.join("hydra_raytrain", "__main__.py")):
        return redact_text(shlex.join(["python", "-m", "hydra_raytrain", *argv[1:]]))
    return redact_text(shlex.join([os.path.basename(program), *argv[1:]] if program else argv))


def git_state(folder: str) -> dict[str, Any] | None:
    """The commit checked out in ``folder``'s repository and whether the work tree has uncommitted changes; None
    outside a repository or without git."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def accelerator() -> str:
    """The first GPU's name where torch sees one, else the CPU's."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (x{torch.cuda.device_count()})"
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _distribution_version(module: str) -> str | None:
    """The version of the distribution that provides the top-level ``module`` (timm, transformers, a user's)."""
    for distribution in importlib.metadata.packages_distributions().get(module, []):
        found = _version(distribution)
        if found:
            return found
    return _version(module)
