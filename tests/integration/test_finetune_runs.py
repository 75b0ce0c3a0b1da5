"""Fine-tuning: a warm start whose frozen modules keep their weights and whose param groups train at their own
learning rates (``finetune.freeze``, ``finetune.param_groups``). Nothing here is about Ray: Ray Train's local mode."""

import json

import pytest
import torch

from hydra_raytrain import load_model, train
from tests.conftest import compose_config

pytestmark = pytest.mark.integration

RUN = ("scaling.num_workers=0", "trainer.max_epochs=1")


def test_frozen_modules_and_a_zero_lr_group_keep_the_start_weights_and_the_rest_trains(tmp_path):
    train(compose_config(*RUN), run_dir=str(tmp_path / "start"))
    tuned = (
        f"run.init_from={tmp_path / 'start'}",
        "finetune.freeze=[features.0]",  # SimpleCNN: features.0 and .2 are convolutions, head.0 and .2 linear
        "finetune.param_groups=[{modules: [head.0], lr: 0.0}, {modules: ['head.2'], lr: 0.01}]",
    )
    summary = train(compose_config(*RUN, *tuned), run_dir=str(tmp_path / "tuned"))
    assert summary["status"] == "completed" and summary["final"]["world_size"] == 1
    start, after = (load_model(str(tmp_path / run)).state_dict() for run in ("start", "tuned"))
    unchanged = {name for name in start if torch.equal(start[name], after[name])}
    assert unchanged == {"features.0.weight", "features.0.bias", "head.0.weight", "head.0.bias"}
    # The LR a run reports is the optimizer's own (the parameters no group names: features.2)
    epoch = json.loads((tmp_path / "tuned" / "metrics.jsonl").read_text().splitlines()[-1])
    assert epoch["lr"] == pytest.approx(0.002)
