"""What a person sees of a finished run: ``curves.png`` in the run dir and a summary table on the terminal."""

from __future__ import annotations

from typing import Any, Dict, List

CURVES_FILE = "curves.png"


def plot_curves(history: List[Dict[str, Any]], path: str) -> None:
    """Loss, then each other metric the task reports, against epoch; train and validation on the same axes."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

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
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def summary_table(summary: Dict[str, Any]):
    """A rich Table: status, epochs, best and final metrics, wall time, throughput; the storage under it
    (the run dir follows on its own line, ``Run dir: ...``)."""
    from rich.table import Table

    final, best, monitor = summary["final"], summary["best"], summary["monitor"]
    table = Table(title=f"hydra_raytrain: {summary['status']}", show_header=True, title_justify="left")
    table.add_column("metric")
    table.add_column("final", justify="right")
    table.add_column(f"best ({monitor}, epoch {best.get('epoch', '-')})", justify="right")
    for name in sorted(key for key in final if key.startswith(("train_", "val_"))):
        table.add_row(name, f"{final[name]:.4f}", f"{best[name]:.4f}" if name in best else "-")
    table.add_section()
    table.add_row("epochs", str(summary["epochs_completed"]), "")
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s", "")
    if "samples_per_second" in final:
        table.add_row("throughput", f"{final['samples_per_second']:.0f} samples/s", "")
    table.caption = f"storage: {summary['storage']}"  # paths stay whole: rich wraps a caption, not a cell
    table.caption_justify = "left"
    return table
