"""curves.png and the summary table, from a history like the one a run writes."""

import io

from PIL import Image
from rich.console import Console

from hydra_raytrain.driver import report
from hydra_raytrain.storage import rundir


def history(n=4):
    return [
        {
            "epoch": e,
            "train_loss": 1 / e,
            "val_loss": 1.2 / e,
            "train_accuracy": 1 - 0.5 / e,
            "val_accuracy": 1 - 0.6 / e,
            "lr": 0.01,
            "world_size": 2,
            "samples_per_second": 1000.0 + e,
            "epoch_seconds": 0.5,
        }
        for e in range(1, n + 1)
    ]


def test_curves_png_is_a_picture_with_a_panel_per_metric(tmp_path):
    path = tmp_path / "curves.png"
    report.plot_curves(history(), str(path))
    image = Image.open(path)
    assert image.format == "PNG" and image.width > 2 * image.height  # loss and accuracy side by side


def test_summary_table_shows_best_final_throughput_and_run_dir(tmp_path):
    summary = rundir.make_summary("completed", history(), "val_accuracy", "max", str(tmp_path), "/storage/x", 12.5)
    console = Console(file=io.StringIO(), width=200)
    console.print(report.summary_table(summary))
    text = console.file.getvalue()
    assert "hydra_raytrain: completed" in text and "val_accuracy" in text and "0.8500" in text
    assert "best (val_accuracy, epoch 4)" in text and "1004 samples/s" in text and "12.5 s" in text


def test_the_storage_path_is_a_plain_line_that_a_narrow_console_does_not_fold(tmp_path):
    storage = "/a/long/storage/folder/" + "x" * 90 + "/simplecnn-digits-0123456789"
    summary = rundir.make_summary("completed", history(), "val_accuracy", "max", str(tmp_path), storage, 12.5)
    console = Console(file=io.StringIO(), width=80)
    console.print(report.summary_table(summary))
    print(report.storage_line(summary), file=console.file)
    assert f"Storage: {storage}\n" in console.file.getvalue()


def test_curves_have_whole_epoch_ticks():
    import matplotlib.pyplot as plt

    figure = report.curves_figure(history(3))
    ticks = [tick for axis in figure.axes for tick in axis.get_xticks()]
    plt.close(figure)
    assert ticks and all(float(tick).is_integer() for tick in ticks)
