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
