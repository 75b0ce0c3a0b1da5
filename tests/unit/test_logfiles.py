"""Logs on disk: the driver's tee, and links to Ray's process logs that become copies at the end."""

import os
import sys

from hydra_raytrain.preflight.validate import validate
from hydra_raytrain.storage.logfiles import keep_process_logs, tee_output
from tests.conftest import compose_config


def test_tee_copies_the_terminal_and_appends_across_runs(tmp_path, capsys):
    path = tmp_path / "driver.log"
    for attempt in (1, 2):
        with tee_output(str(path)):
            print(f"attempt {attempt}")
            sys.stderr.write("to stderr\n")
    assert path.read_text() == "attempt 1\nto stderr\nattempt 2\nto stderr\n"
    assert capsys.readouterr().out == "attempt 1\nattempt 2\n"  # the terminal still gets everything


def test_tee_copies_what_the_drivers_logging_handlers_write(tmp_path):
    """Hydra's console handler holds the stream it was configured with; the copy gets its lines too."""
    import logging

    handler = logging.StreamHandler(sys.stdout)
    logging.getLogger().addHandler(handler)
    try:
        with tee_output(str(tmp_path / "driver.log")):
            logging.getLogger("some.module").warning("a warning from the driver")
        assert handler.stream is sys.stdout  # restored
    finally:
        logging.getLogger().removeHandler(handler)
    assert "a warning from the driver" in (tmp_path / "driver.log").read_text()


def test_links_become_copies_and_dangling_links_stay(tmp_path):
    (tmp_path / "ray_session").mkdir()
    (tmp_path / "ray_session" / "worker-1.out").write_text("worker output\n")
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    os.symlink(tmp_path / "ray_session" / "worker-1.out", logs / "rank0-pid1.out")
    os.symlink("/elsewhere/on/another/node.out", logs / "rank1-pid2.out")
    keep_process_logs(str(tmp_path / "run"))
    assert not (logs / "rank0-pid1.out").is_symlink() and (logs / "rank0-pid1.out").read_text() == "worker output\n"
    assert (logs / "rank1-pid2.out").is_symlink()


def test_display_and_profiling_switches_keep_the_run_identity(tmp_path):
    plain = validate(compose_config(), str(tmp_path)).run_name()
    switches = ("trainer.progress_bar=true", "trainer.profile=true", "trainer.profiler_steps=3")
    assert validate(compose_config(*switches), str(tmp_path)).run_name() == plain
    assert validate(compose_config("trainer.precision=bf16-mixed"), str(tmp_path)).run_name() != plain
