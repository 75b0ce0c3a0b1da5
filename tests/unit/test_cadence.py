"""When a mid-epoch checkpoint is due (one rank: the decision is rank 0's; the integration tests cover the
broadcast to the other ranks with two workers)."""

import time

from hydra_raytrain.recipe.cadence import Cadence, Decision


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_every_n_steps_counts_optimizer_steps():
    cadence = Cadence(3, None, None, rank=0, world_size=1)
    assert [cadence.after_step(step).checkpoint for step in range(1, 8)] == [False, False, True] * 2 + [False]


def test_every_n_minutes_counts_from_the_last_checkpoint_of_either_kind():
    clock = Clock()
    cadence = Cadence(None, 0.5, None, rank=0, world_size=1, clock=clock)
    clock.now += 29
    assert cadence.after_step(1) == Decision()
    clock.now += 1
    assert cadence.after_step(2) == Decision(checkpoint=True)
    cadence.saved()  # mid-epoch or epoch-end: the next is due 30 s from now
    clock.now += 29
    assert not cadence.after_step(3).checkpoint


def test_a_preemption_notice_checkpoints_and_stops():
    notices = iter([False, False, True])
    cadence = Cadence(None, None, lambda: next(notices), rank=0, world_size=1, watch_notice=True)
    assert [cadence.after_step(step) for step in (1, 2, 3)] == [
        Decision(),
        Decision(),
        Decision(checkpoint=True, stop=True),
    ]


def test_nothing_is_due_without_settings():
    cadence = Cadence(None, None, None, rank=0, world_size=1)
    assert not any(cadence.after_step(step).checkpoint for step in range(1, 100))


def test_a_node_drain_is_a_notice_naming_the_node_and_its_deadline():
    from ray.train import PreemptionInfo

    from hydra_raytrain.messages.notice import drain_notice

    assert drain_notice(None) is None
    assert drain_notice(PreemptionInfo(None, {"b2": [1], "a1": [0]})) == "Ray drains node a1, b2"
    deadline = 1_700_000_000_000
    clock = time.strftime("%H:%M:%S", time.localtime(deadline / 1000))
    assert drain_notice(PreemptionInfo(deadline, {"a1": [0, 1]})) == f"Ray drains node a1, deadline {clock}"


def test_rank_zero_reads_a_drain_from_ray_trains_preemption_context(monkeypatch):
    """Where Ray Train's PreemptionWatcher leaves a drain (its mark_preempt on every worker), by Ray's own names:
    a Ray that renames them fails here, not silently in a run."""
    import dataclasses
    import types

    from ray.train import PreemptionInfo
    from ray.train.v2._internal.execution import context
    from ray.train.v2._internal.execution.preemption import PreemptionContext

    from hydra_raytrain.messages.notice import drain_notice, preemption_context

    assert "preemption_context" in {field.name for field in dataclasses.fields(context.TrainContext)}
    assert preemption_context() is None  # outside a worker: no train context, drains not watched (a warning)
    marked = PreemptionContext()
    monkeypatch.setattr(context, "get_train_context", lambda: types.SimpleNamespace(preemption_context=marked))
    seen = preemption_context()
    assert drain_notice(seen.preemption_info) is None
    marked.preemption_info = PreemptionInfo(None, {"n1": [1]})  # what the watcher's mark_preempt sets
    assert drain_notice(seen.preemption_info) == "Ray drains node n1"
