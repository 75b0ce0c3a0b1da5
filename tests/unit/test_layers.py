"""The house's floors (docs/architecture.md): a module imports only from its own floor or the floors below it, no
files import each other in a circle, and config's ground floor imports neither torch nor Ray.

Imports are read from the source, as Ray's own circular-import test does: every ``import`` statement, at module
level or inside a function, so that an import hidden in a function to dodge a cycle counts as the cycle it is.
What is loaded by name at run time is no import statement: a config's ``_target_`` (Hydra's instantiate), the
package's lazy exports (``hydra_raytrain/__init__.py``, PEP 562) and Hydra's plugin discovery of ``hydra_plugins``.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Where each module's source lies: conf/ and tasks/ install inside the package (pyproject's package-dir).
SOURCES = {"hydra_raytrain": "hydra_raytrain", "hydra_raytrain.conf": "conf", "hydra_raytrain.tasks": "tasks"}
SOURCES["hydra_plugins"] = "hydra_plugins"

# From the ground up; a module belongs to the floor of the longest prefix that names it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    (
        "ground: the schema, errors, path markers, run names, the sweeper's settings; run outcomes and notices"
        " (messages/); the one door to Ray, the host's facts, Ray's private names, lazy exports (runtime/); the"
        " commands' shell: their options, their end, the command line's keys (shell/)",
        (
            "hydra_raytrain.config",
            "hydra_raytrain.messages",
            "hydra_raytrain.runtime",
            "hydra_raytrain.shell",
        ),
    ),
    (
        "the worker side's parts: data, models, tasks, loggers, callbacks; the run dir's files, logs and hold, "
        "storage that retries (storage/)",
        (
            "hydra_raytrain.data",
            "hydra_raytrain.models",
            "hydra_raytrain.tasks",
            "hydra_raytrain.loggers",
            "hydra_raytrain.callbacks",
            "hydra_raytrain.storage",
        ),
    ),
    ("the recipe: what every Ray Train worker runs", ("hydra_raytrain.recipe",)),
    ("preflight: the config's checks, which build what the floors below define", ("hydra_raytrain.preflight",)),
    (
        "inference: a finished run read, scored, exported, predicted with and served",
        ("hydra_raytrain.inference",),
    ),
    ("the driver: train(cfg)", ("hydra_raytrain.driver",)),
    ("sweeps: Hydra multirun as Ray Tune trials", ("hydra_raytrain.sweep",)),
    (
        "entry points: the CLI, check, the commands' addresses (evaluate, export, predict, serve), the config files, "
        "Hydra's plugin, the package's face",
        (
            "hydra_raytrain",
            "hydra_raytrain.__main__",
            "hydra_raytrain.cli",
            "hydra_raytrain.check",
            "hydra_raytrain.evaluate",
            "hydra_raytrain.export",
            "hydra_raytrain.predict",
            "hydra_raytrain.serve",
            "hydra_raytrain.conf",
            "hydra_plugins",
        ),
    ),
]


def source_modules() -> dict[str, pathlib.Path]:
    """Every module of ours, by dotted name, with its source file."""
    modules = {}
    for package, folder in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT / folder)
            parts = relative.with_suffix("").parts
            name = ".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts))
            modules[name] = path
    return modules


def imported(path: pathlib.Path, name: str, modules: dict[str, pathlib.Path]) -> set[str]:
    """The modules of ours that ``path`` imports, wherever the statement stands."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:  # `from package import module` imports that module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in found if module in modules}


def floor_of(module: str) -> int:
    named = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(FLOORS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert named, f"{module} stands on no floor: add it to FLOORS (and to docs/architecture.md)"
    return max(named)[1]  # the longest prefix names it


MODULES = source_modules()
IMPORTS = {name: imported(path, name, MODULES) for name, path in MODULES.items()}


def test_every_module_is_read():
    assert {"hydra_raytrain.preflight.validate", "hydra_raytrain.tasks.base", "hydra_raytrain.conf"} <= set(MODULES)
    assert "hydra_raytrain.recipe.step" in IMPORTS["hydra_raytrain.recipe.loop"]  # imports are read


# The package root is the front door: what a user runs with python -m (and the package's face); every other
# module lives in a folder that says what it serves.
ROOT_MODULES = {"__init__", "__main__", "cli", "check", "evaluate", "export", "predict", "serve"}


def test_the_package_root_holds_only_what_a_user_runs():
    at_root = {path.stem for path in (ROOT / "hydra_raytrain").glob("*.py")}
    assert at_root == ROOT_MODULES, f"at the root, not a command: {sorted(at_root - ROOT_MODULES)}"
    for folder in sorted(path.parent for path in (ROOT / "hydra_raytrain").glob("*/__init__.py")):
        assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), f"{folder.name}/ says nothing"


def test_no_import_climbs_a_floor():
    climbing = [
        f"{module} (floor {floor_of(module)}) imports {target} (floor {floor_of(target)}: "
        f"{FLOORS[floor_of(target)][0]})"
        for module, targets in sorted(IMPORTS.items())
        for target in sorted(targets)
        if floor_of(target) > floor_of(module)
    ]
    assert not climbing, "\n".join(climbing)


def test_no_import_circle():
    """Package ``__init__`` files are passed through: ``from hydra_raytrain.recipe import checkpoint`` is an edge
    to ``recipe/checkpoint.py``, not through ``recipe/__init__.py``."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(IMPORTS[module]):
            if target != module and state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (circle := visit(target)):
                return circle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(IMPORTS):
        if module not in state:
            circle = visit(module)
            assert circle is None, " -> ".join(circle)


@pytest.mark.parametrize(
    "module",
    sorted(name for name in MODULES if name.startswith(("hydra_raytrain.config", "hydra_raytrain.messages.outcome"))),
)
def test_the_ground_floor_imports_neither_torch_nor_ray(module):
    code = (
        f"import sys, {module}; heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {{'torch', 'ray'}}); "
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


def test_registering_the_configs_loads_neither_torch_nor_ray():
    """Hydra imports ``hydra_raytrain.conf`` to compose (and reports a failing import as a missing config
    module): it registers the schema and the resolvers from the ground floor and ``preflight/resolvers.py``."""
    code = (
        "import sys, hydra_raytrain.conf; from omegaconf import OmegaConf; assert OmegaConf.has_resolver('run_name'); "
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'pyarrow'}); assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_run_dirs_composed_config_resolves_outside_hydra(tmp_path):
    """``evaluate`` of a run dir without config.json reads ``.hydra/config.yaml``, whose values may use our
    resolvers: they are registered there too, in a process that never composed a config."""
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("dataset:\n  name: ${sweep_name:[a]}\n")
    code = "from hydra_raytrain.inference.finished import load_config; "
    code += f"print(load_config({str(tmp_path)!r})['dataset']['name'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("sweep-"), done.stdout
