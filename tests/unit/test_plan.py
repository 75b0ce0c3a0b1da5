"""A run's plan (driver/plan.py): the checks decide once what the run takes — its config, name, data road and
resource request — and hand it on; nothing passes through a module's global state."""

import ast
import pathlib

from hydra_raytrain.driver.plan import preflight
from hydra_raytrain.preflight import rehearsal
from tests.conftest import compose_config
from tests.helpers.data import write_digits_parquet

ROOT = pathlib.Path(__file__).resolve().parents[2] / "hydra_raytrain"


def test_a_streamed_run_is_planned_with_the_dataset_its_rehearsal_built_once(tmp_path, monkeypatch):
    write_digits_parquet(tmp_path / "digits", files=5)
    built = []
    real = rehearsal._built_here
    monkeypatch.setattr(rehearsal, "_built_here", lambda node: built.append(node) or real(node))
    datasets = rehearsal.Datasets()
    cfg = compose_config("dataset=parquet", f"dataset.path={tmp_path / 'digits'}", "model=mlp")
    plan = preflight(cfg, str(tmp_path), datasets=datasets)
    assert len(built) == 1 and list(datasets.built.values()) == [plan.stream]  # the rehearsal's, not a second build
    assert plan.stream.rows["train"] + plan.stream.rows["val"] == 1797
    assert plan.request.data_cpus == plan.stream.cpus == 1 and plan.request.num_workers == 2
    assert plan.name == plan.resolved.run_name() and plan.notes == () and plan.replaced == ()
    again = preflight(cfg, str(tmp_path), datasets=datasets)  # a sweep's next trial: the same dataset, not rebuilt
    assert len(built) == 1 and again.stream is plan.stream


def test_a_table_run_says_how_it_reads_once_and_the_default_run_builds_its_splits_in_the_workers(tmp_path):
    plan = preflight(compose_config("model=mlp"), str(tmp_path))
    assert plan.stream is None and plan.request.data_cpus == 0 and plan.notes == ()
    table = tmp_path / "t.csv"
    table.write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40)))
    plan = preflight(compose_config("dataset=table", f"dataset.path={table}", "model=mlp"), str(tmp_path))
    assert (
        plan.stream is None
        and len(plan.notes) == 1
        and plan.notes[0].startswith(f"Data: {table} (0.0 MB in memory): read whole")
    )


def test_no_module_keeps_state_for_the_next_check():
    """No module of the checks, the driver or the sweeps starts an empty container at import that runs fill (the
    dataset the rehearsal built, the notes a sweep said): the plan, or the sweep's ``Shared``, carries them."""
    found = []
    for folder in ("preflight", "driver", "sweep"):
        for path in sorted((ROOT / folder).glob("*.py")):
            for node in ast.parse(path.read_text()).body:
                value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
                empty = (isinstance(value, ast.Dict) and not value.keys) or (
                    isinstance(value, (ast.List, ast.Set)) and not value.elts
                )
                called = isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("dict", "set", "list")
                if empty or (called and not value.args and not value.keywords):
                    found.append(f"{path.name}: {ast.unparse(node)}")
    assert found == []
