"""What a person sees of a finished run: ``curves.png`` in the run dir and a summary table on the terminal."""

from __future__ import annotations

import sys
from typing import Any

CURVES_FILE = "curves.png"


def plot_curves(history: list[dict[str, Any]], path: str) -> None:
    """Loss, then each other metric the task reports, against epoch; train and validation on the same axes. No
    file when the run logged no train_/val_ metric (a LightningModule that logs nothing); a plot that fails
    warns: the run's results are written already."""
    if not any(key.startswith(("train_", "val_")) for metrics in history for key in metrics):
        return
    try:
        import matplotlib.pyplot as plt

        figure = curves_figure(history)
        figure.savefig(path, dpi=110)
        plt.close(figure)
    except Exception as error:
        print(f"WARNING: {CURVES_FILE} was not drawn: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


def curves_figure(history: list[dict[str, Any]]):
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = sorted({key.split("_", 1)[1] for m in history for key in m if key.startswith(("train_", "val_"))})
    names.sort(key=lambda name: name != "loss")  # loss first
    figure, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    epochs = [m["epoch"] for m in history]
    for axis, name in zip(axes[0], names, strict=True):
        for split, style in (("train", "-o"), ("val", "-s")):
            values = [m.get(f"{split}_{name}") for m in history]
            if any(v is not None for v in values):
                axis.plot(epochs, values, style, markersize=3, label=split)
        axis.set_title(name)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    return figure


def storage_line(summary: dict[str, Any]) -> str:
    return f"Storage: {summary['storage']}"


def summary_table(summary: dict[str, Any]):
    """A rich Table: status, epochs, best and final metrics, wall time, throughput. The storage and run dir
    paths follow as plain lines (``storage_line``): rich folds anything wider than the console (80 columns
    when piped, as in CI logs), and a path folded mid-name cannot be copied."""
    from rich.table import Table

    final, best, monitor = summary["final"], summary["best"], summary["monitor"]
    table = Table(title=f"hydra_raytrain: {summary['status']}", show_header=True, title_justify="left")
    table.add_column("metric")
    table.add_column("final", justify="right")
    table.add_column(f"best ({monitor}, epoch {best.get('epoch', '-')})", justify="right")
    test = {k: v for k, v in (summary.get("test") or {}).items() if k.startswith("test_")}
    if test:  # the best checkpoint on the test split: beside each val_ metric
        table.add_column("test (best checkpoint)", justify="right")
    for name in sorted(key for key in final if key.startswith(("train_", "val_"))):
        scored = test.get(name.replace("val_", "test_", 1)) if name.startswith("val_") else None
        row = [name, f"{final[name]:.4f}", f"{best[name]:.4f}" if name in best else "-"]
        table.add_row(*row, *([f"{scored:.4f}" if scored is not None else ""] if test else []))
    table.add_section()
    table.add_row("epochs", str(summary["epochs_completed"]), "")
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s", "")
    if "samples_per_second" in final:
        table.add_row("throughput", f"{final['samples_per_second']:.0f} samples/s", "")
    return table
