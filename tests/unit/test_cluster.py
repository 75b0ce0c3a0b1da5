"""Sizing a local cluster and refusing what cannot be served (pure functions)."""

import os

import pytest

from hydra_raytrain.config import ConfigError
from hydra_raytrain.config.schema import RayConfig, ScalingConfig, cluster_address
from hydra_raytrain.driver.cluster import (
    ResourceRequest,
    check_fits,
    machine_share,
    plan_local_cpus,
    resource_request,
)

RAY = RayConfig(num_cpus=None, max_cpu_oversubscription=4.0)
GIB = 2**30


def scaling(num_workers, use_gpu=False, resources=None, max_workers=None):
    return ScalingConfig(num_workers, max_workers=max_workers, use_gpu=use_gpu, resources_per_worker=resources)


def test_request_follows_rays_defaults():
    assert resource_request(scaling(4)).total == {"CPU": 4.0}
    assert resource_request(scaling(2, use_gpu=True)).total.get("GPU") == 2.0
    assert resource_request(scaling(2, resources={"CPU": 3})).total == {"CPU": 6.0}


def test_four_workers_on_two_cores_get_four_logical_cpus():
    assert plan_local_cpus(resource_request(scaling(4)), cores=2, free_memory=20 * GIB, ray_cfg=RAY) == 4


def test_small_runs_get_the_whole_machine():
    assert plan_local_cpus(resource_request(scaling(1)), cores=2, free_memory=20 * GIB, ray_cfg=RAY) == 2


def test_too_many_workers_are_refused_with_the_limit():
    with pytest.raises(ConfigError) as caught:
        plan_local_cpus(resource_request(scaling(64)), cores=2, free_memory=20 * GIB, ray_cfg=RAY)
    message = str(caught.value)
    assert caught.value.key == "scaling.num_workers" and "=64" in message
    assert "2 cores" in message and "at most 8" in message and "scaling.num_workers <= 8" in message


def test_workers_that_would_not_fit_in_memory_are_refused():
    with pytest.raises(ConfigError, match="GiB"):
        plan_local_cpus(resource_request(scaling(8)), cores=2, free_memory=2 * GIB, ray_cfg=RAY)


def test_explicit_num_cpus_must_cover_the_request():
    with pytest.raises(ConfigError, match="ray.num_cpus"):
        plan_local_cpus(resource_request(scaling(4)), cores=2, free_memory=20 * GIB, ray_cfg=RayConfig(num_cpus=2))


def test_gpu_request_without_gpus_names_use_gpu():
    with pytest.raises(ConfigError) as caught:
        check_fits(ResourceRequest(2, {"GPU": 1.0}), {"GPU": 0}, "this machine")
    assert caught.value.key == "scaling.use_gpu" and "scaling.use_gpu=false" in str(caught.value)


def test_cluster_too_small():
    with pytest.raises(ConfigError, match="needs 6 CPU; the cluster has 4"):
        check_fits(ResourceRequest(3, {"CPU": 2.0}), {"CPU": 4.0}, "the cluster")
    check_fits(ResourceRequest(2, {"CPU": 2.0}), {"CPU": 4.0}, "the cluster")


def test_elastic_local_cluster_is_sized_for_the_maximum_and_existing_ones_must_fit_the_minimum():
    request = resource_request(scaling(2, max_workers=6))
    assert plan_local_cpus(request, cores=2, free_memory=20 * GIB, ray_cfg=RAY) == 6
    check_fits(request, {"CPU": 2.0}, "the cluster")  # 2 of at most 6 fit: enough to start


def test_a_new_local_cluster_names_its_own_state_api_and_drops_the_preemption_watcher_until_a_cluster_is_joined(
    monkeypatch,
):
    import socket

    from hydra_raytrain.runtime.reach import DASHBOARD_PORT, joined_cluster_environment, local_cluster_environment

    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", raising=False)
    with socket.socket() as busy:  # Ray's default port taken, as by another cluster's dashboard
        try:
            busy.bind(("127.0.0.1", DASHBOARD_PORT))
        except OSError:
            pass  # already taken by something else: the same situation
        busy.listen()
        options = local_cluster_environment(include_dashboard=None)
    assert options["dashboard_port"] != DASHBOARD_PORT
    assert os.environ["RAY_API_SERVER_ADDRESS"] == f"http://127.0.0.1:{options['dashboard_port']}"
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
    joined_cluster_environment()  # a cluster joined later in the process: the watcher back on
    assert "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER" not in os.environ
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")  # the user's choice stays, either way
    assert local_cluster_environment(include_dashboard=False) == {}
    joined_cluster_environment()
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"


def test_a_local_cluster_lists_parquet_files_with_one_footer_reader_unless_the_environment_says(monkeypatch):
    from hydra_raytrain.runtime import reach
    from hydra_raytrain.runtime.reach import FOOTER_READERS_ENV, local_cluster_environment

    monkeypatch.setattr(os, "environ", dict(os.environ))  # what else it sets stays in this test
    monkeypatch.setattr(reach, "_watcher_turned_off", reach._watcher_turned_off)
    monkeypatch.delenv(FOOTER_READERS_ENV, raising=False)
    local_cluster_environment(include_dashboard=False)
    assert os.environ[FOOTER_READERS_ENV] == "1"  # Ray Data's 32 are for a large cluster's thousands of files
    monkeypatch.setenv(FOOTER_READERS_ENV, "8")
    local_cluster_environment(include_dashboard=False)
    assert os.environ[FOOTER_READERS_ENV] == "8"


def test_a_local_cluster_starts_at_least_8_worker_processes_at_once_unless_the_environment_says(monkeypatch):
    from hydra_raytrain.runtime import reach
    from hydra_raytrain.runtime.host import machine_cores
    from hydra_raytrain.runtime.reach import STARTUP_CONCURRENCY_ENV, local_cluster_environment

    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(reach, "_watcher_turned_off", reach._watcher_turned_off)
    monkeypatch.delenv(STARTUP_CONCURRENCY_ENV, raising=False)
    local_cluster_environment(include_dashboard=False)
    assert os.environ[STARTUP_CONCURRENCY_ENV] == str(max(machine_cores(), 8))
    monkeypatch.setenv(STARTUP_CONCURRENCY_ENV, "2")
    local_cluster_environment(include_dashboard=False)
    assert os.environ[STARTUP_CONCURRENCY_ENV] == "2"


def test_a_local_cluster_without_its_dashboard_quiets_the_placement_group_cleaner_unless_the_user_has_a_hook():
    import importlib
    import logging

    from hydra_raytrain.runtime.reach import QUIET_CLEANER_HOOK, local_runtime_env

    user = {"env_vars": {"A": "1"}}
    assert local_runtime_env(None, None) is None and local_runtime_env(user, True) is user
    assert local_runtime_env(None, False) == {"worker_process_setup_hook": QUIET_CLEANER_HOOK}
    assert local_runtime_env(user, False) == {"worker_process_setup_hook": QUIET_CLEANER_HOOK, "env_vars": {"A": "1"}}
    assert local_runtime_env({"worker_process_setup_hook": "mine.setup"}, False) == {
        "worker_process_setup_hook": "mine.setup"
    }
    # The hook is what Ray will import in every worker process: it resolves and quiets the cleaner's logger.
    module, name = QUIET_CLEANER_HOOK.rsplit(".", 1)
    cleaner = logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner")
    before = cleaner.level
    try:
        getattr(importlib.import_module(module), name)()
        assert cleaner.getEffectiveLevel() == logging.ERROR
    finally:
        cleaner.setLevel(before)


@pytest.mark.parametrize(
    "workers, max_workers, resources, cores, cpu",
    [
        (1, None, None, 16, 16),  # one worker: the whole machine
        (2, None, None, 16, 8),
        (3, None, None, 16, 5),  # floored
        (4, None, None, 2, 1),  # oversubscribed: Ray's default of one CPU each
        (1, 4, None, 16, 4),  # elastic: the share of the largest group
        (2, None, {"GPU": 1}, 16, 8),  # a GPU worker gets its CPUs as well
        (2, None, {"CPU": 3}, 16, 3),  # the config's own CPUs stay
    ],
)
def test_a_local_cluster_gives_each_worker_its_share_of_the_cores(workers, max_workers, resources, cores, cpu):
    given = scaling(
        workers, use_gpu=bool(resources and "GPU" in resources), resources=resources, max_workers=max_workers
    )
    sized = machine_share(given, cores)
    assert resource_request(sized).per_worker["CPU"] == cpu
    assert {k: v for k, v in (sized.resources_per_worker or {}).items() if k != "CPU"} == {
        k: v for k, v in (resources or {}).items() if k != "CPU"
    }


def test_local_mode_is_not_sized():
    assert machine_share(scaling(0), 16) == scaling(0)


def test_the_workers_share_the_cores_up_to_the_clusters_cpus(monkeypatch):
    import hydra_raytrain.driver.cluster as cluster

    monkeypatch.setattr(cluster, "machine_cores", lambda: 8)
    assert not cluster.started_here()  # no Ray in this process
    assert cluster.local_cpus(RayConfig(num_cpus=None)) == 8
    assert cluster.local_cpus(RayConfig(num_cpus=2)) == 2  # a smaller cluster: its CPUs
    assert cluster.local_cpus(RayConfig(num_cpus=32)) == 8  # oversubscribed: no more threads than cores


def test_the_cluster_is_ray_address_else_the_environments_ray_address_and_local_is_a_cluster_of_the_runs_own():
    job = {"RAY_ADDRESS": "10.0.0.5:6379"}  # what `ray job submit` sets for every job
    assert cluster_address(None, job) == "10.0.0.5:6379"
    assert cluster_address("auto", job) == "auto" and cluster_address("local", job) is None
    assert cluster_address(None, {}) is None and cluster_address(None, {"RAY_ADDRESS": ""}) is None
    assert cluster_address(None, {"RAY_ADDRESS": "local"}) is None


def test_start_up_marks_go_to_the_timeline_file_only_when_one_is_named(tmp_path, monkeypatch):
    from hydra_raytrain.runtime.host import TIMELINE_ENV, mark

    monkeypatch.delenv(TIMELINE_ENV, raising=False)
    mark("composed")  # nothing named: nothing written, no error
    monkeypatch.setenv(TIMELINE_ENV, str(tmp_path / "timeline.txt"))
    mark("composed")
    mark("checked")
    lines = [line.split() for line in (tmp_path / "timeline.txt").read_text().splitlines()]
    assert [event for _, event in lines] == ["composed", "checked"] and float(lines[0][0]) <= float(lines[1][0])
