"""The run dir's files: the metrics log keeps one history across resumes; finished runs are recognised."""

import json

from hydra_raytrain.driver.epoch_log import EpochLog
from hydra_raytrain.storage import rundir


def metrics(epoch, accuracy):
    return {"epoch": epoch, "val_accuracy": accuracy, "samples_per_second": 1.0, "epoch_seconds": 1.0}


def test_an_epoch_trained_again_replaces_the_entries_from_it_on(tmp_path):
    log = EpochLog(str(tmp_path), max_epochs=4)
    for epoch in (1, 2, 3):
        log.write(metrics(epoch, 0.1 * epoch))
    log.write(metrics(3, 0.9))  # resumed from the epoch-2 checkpoint: epoch 3 again
    log.write(metrics(4, 0.95))
    history = rundir.read_history(str(tmp_path))
    assert [m["epoch"] for m in history] == [1, 2, 3, 4] and history[2]["val_accuracy"] == 0.9


def test_best_epoch_respects_mode_and_ignores_nan():
    history = [metrics(1, 0.5), metrics(2, float("nan")), metrics(3, 0.7), metrics(4, 0.6)]
    assert rundir.best_epoch(history, "val_accuracy", "max")["epoch"] == 3
    assert rundir.best_epoch(history, "val_accuracy", "min")["epoch"] == 1
    assert rundir.best_epoch([], "val_accuracy", "max") is None


def test_only_a_completed_summary_counts_as_finished(tmp_path):
    assert rundir.finished_summary(str(tmp_path)) is None
    summary = rundir.make_summary(
        "failed", [metrics(1, 0.5)], "val_accuracy", "max", str(tmp_path), "s", 1.0, error="boom"
    )
    rundir.write_json(str(tmp_path / "summary.json"), summary)
    assert rundir.finished_summary(str(tmp_path)) is None
    summary = rundir.make_summary("completed", [metrics(1, 0.5)], "val_accuracy", "max", str(tmp_path), "s", 1.0)
    rundir.write_json(str(tmp_path / "summary.json"), summary)
    assert rundir.finished_summary(str(tmp_path))["epochs_completed"] == 1
    assert "Run already complete: 1 epochs, best val_accuracy 0.5000" in rundir.already_complete(summary)
    assert (
        not list(tmp_path.glob("*.partial"))
        and json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
    )


def test_a_last_line_cut_short_is_read_without_it_and_the_next_epoch_does_not_glue_onto_it(tmp_path):
    """A run killed while appending (an older version, or a full disk): the history reads without the cut line,
    with a warning naming the file; the next epoch rewrites the file whole, so every line parses again. A bad line
    before the last is an error naming it."""
    import pytest

    path = tmp_path / rundir.METRICS_FILE
    path.write_text(json.dumps(metrics(1, 0.1)) + "\n" + json.dumps(metrics(2, 0.2))[:25])
    with pytest.warns(UserWarning, match=r"metrics.jsonl: its last line is cut short .* read without it"):
        assert [m["epoch"] for m in rundir.read_history(str(tmp_path))] == [1]
    with pytest.warns(UserWarning):
        EpochLog(str(tmp_path), max_epochs=3).write(metrics(2, 0.25))  # resumed: epoch 2 again
    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [1, 2]
    assert not (tmp_path / (rundir.METRICS_FILE + ".partial")).exists()
    path.write_text("{not json\n" + json.dumps(metrics(1, 0.1)) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 1 is not JSON"):
        rundir.read_history(str(tmp_path))
