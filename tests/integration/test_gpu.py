"""On a machine with a CUDA GPU (skipped elsewhere): a run on a GPU worker in bf16, through the real CLI."""

import json

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


def test_a_gpu_worker_trains_in_bf16(ray_address, tmp_path):
    done = run_cli(
        [
            f"ray.address={ray_address}",
            "debug=smoke",
            "scaling.num_workers=1",
            "scaling.use_gpu=true",
            "trainer.precision=bf16-mixed",
            "hydra.run.dir=run",
        ],
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_completed"] == 1
