"""Every command ends without its interpreter's last garbage collection (hydra_raytrain.shell.program)."""

import json
import subprocess
import sys

COMMANDS = [
    "hydra_raytrain",
    "hydra_raytrain.check",
    "hydra_raytrain.evaluate",
    "hydra_raytrain.export",
    "hydra_raytrain.predict",
    "hydra_raytrain.serve",
]

# In one fresh process: each command's main run with --help, as `python -m` runs it; then, at exit, whether the
# objects alive were frozen (a handler registered first runs last) and the exit code the process still gets.
SCRIPT = """
import atexit, gc, json, runpy, sys
atexit.register(lambda: print("FROZEN", gc.get_freeze_count() > 0, flush=True))
from hydra_raytrain.shell import program
asked = {}
for module in json.loads(sys.argv[1]):
    program._ending_quickly = False
    sys.argv = [module, "--help"]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        assert stop.code in (0, None), (module, stop.code)
    assert gc.get_freeze_count() == 0, module  # at exit only: a long-lived process keeps collecting
    asked[module] = program._ending_quickly
print("ASKED", json.dumps(asked), flush=True)
sys.exit(3)
"""


def test_every_command_ends_frozen_and_keeps_its_exit_code():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(COMMANDS)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr[-3000:]
    [asked] = [line[len("ASKED ") :] for line in done.stdout.splitlines() if line.startswith("ASKED ")]
    assert json.loads(asked) == dict.fromkeys(COMMANDS, True)
    assert done.stdout.rstrip().endswith("FROZEN True"), done.stdout[-2000:]


def test_a_count_below_one_is_refused_by_name_before_anything_starts(tmp_path):
    """predict's --batch-size and serve's counts: argparse's one line and exit 2, before the run dir is looked at."""
    for module, option in (("hydra_raytrain.predict", "--batch-size"), ("hydra_raytrain.serve", "--max-batch-size")):
        extra = ["rows.parquet", "--output", "out"] if module.endswith("predict") else []
        command = [sys.executable, "-m", module, "run", *extra, option, "0"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert done.returncode == 2, done.stderr
        assert f"argument {option}: '0': a whole number >= 1" in done.stderr.splitlines()[-1], done.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def _command(body, **fields):
    from hydra_raytrain.shell.program import Command

    def options(parser):
        parser.add_argument("run")

    return Command("demo", "Demo a run.\n\nMore.", options, body, refused="Cannot demo this run", **fields)


def test_the_command_shell_maps_refusals_and_failures_to_their_exit_codes(tmp_path, capsys):
    """One shell for every command: a missing run folder (argparse's refusal, 2), a config error in the command's
    own words (2), a failure it declares (1), a body's own exit code, and success (no exit)."""
    import pytest

    from hydra_raytrain.config import ConfigError

    class Refused(Exception):
        pass

    def refuse(options):
        raise ConfigError("--format", "x", "is no format.", "onnx")

    def fail(options):
        raise Refused("differs by 1e-3")

    with pytest.raises(SystemExit) as stop:
        _command(lambda options: None).run([str(tmp_path / "nowhere")], prog="hydra-raytrain demo")
    assert stop.value.code == 2
    assert f"hydra-raytrain demo: error: {tmp_path / 'nowhere'}: no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        _command(refuse).run([str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "Cannot demo this run: --format='x': is no format. Valid: onnx\n"
    with pytest.raises(SystemExit) as stop:
        _command(fail, failed="Demo refused", failures=(Refused,)).run([str(tmp_path)])
    assert (stop.value.code, capsys.readouterr().err) == (1, "Demo refused: differs by 1e-3\n")
    with pytest.raises(Refused):  # an exception it does not declare is no refusal: its traceback shows
        _command(fail).run([str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        _command(lambda options: 75).run([str(tmp_path)])
    assert stop.value.code == 75
    assert _command(lambda options: print("done", options.run)).run([str(tmp_path)]) is None
    assert capsys.readouterr().out == f"done {tmp_path}\n"
