"""pyproject lists packages explicitly (conf/ and tasks/ are mapped into the package): keep the list whole."""

import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_python_package_folder_is_listed():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    folder_of = {package: folder for package, folder in setup["package-dir"].items()}
    for package, folder in folder_of.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((package, *relative)) in listed, init


def test_the_package_exports_load_lazily_and_stay_functions():
    """Ray Train's controller unpickles our callbacks (hydra_raytrain.storage.rundir): that must not import torch.
    The function ``evaluate`` stays a function although a submodule has the same name."""
    import subprocess
    import sys

    code = (
        "import sys, hydra_raytrain.storage.rundir; assert 'torch' not in sys.modules, 'torch imported'; "
        "from hydra_raytrain import load_model, evaluate; assert callable(evaluate) and callable(load_model), evaluate"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_extension_api_is_importable_from_the_package():
    """What docs/own-task.md, own-data.md and architecture.md have users import, from one place."""
    import hydra_raytrain
    from hydra_raytrain import ExistingDir, LocalPath, Logger, Splits, Step, StepOutput, Sums, Task
    from hydra_raytrain.config import paths
    from hydra_raytrain.data.splits import Splits as splits
    from hydra_raytrain.loggers.base import Logger as logger
    from hydra_raytrain.tasks import base

    assert (Task, StepOutput, Sums, Step) == (base.Task, base.StepOutput, base.Sums, base.Step)
    assert (Splits, Logger, ExistingDir, LocalPath) == (splits, logger, paths.ExistingDir, paths.LocalPath)

    assert set(hydra_raytrain.__all__) <= set(dir(hydra_raytrain))
