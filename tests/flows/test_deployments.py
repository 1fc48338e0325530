"""prefect.yaml and flows.serve describe deployments of the real flows with valid parameters."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml
from prefect import Flow
from prefect.client.schemas.schedules import CronSchedule

from flows.serve import deployments

ROOT = Path(__file__).resolve().parents[2]
RUN_TIME = {"tuple_id": "k3t-" + "0" * 24}


def load_entrypoint(entrypoint: str) -> Flow:
    path, _, name = entrypoint.partition(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    flow = getattr(module, name)
    assert isinstance(flow, Flow), entrypoint
    return flow


def test_prefect_yaml_deploys_every_flow_with_valid_parameters():
    spec = yaml.safe_load((ROOT / "flows" / "prefect.yaml").read_text())
    names = {}
    for dep in spec["deployments"]:
        flow = load_entrypoint(dep["entrypoint"])
        required = set(flow.parameters.required or [])
        assert required <= set(RUN_TIME) | set(dep.get("parameters", {})), required
        # Deployment parameters are defaults; what a run must add is filled in here.
        run_time = {k: v for k, v in RUN_TIME.items() if k in required}
        flow.validate_parameters(run_time | dep.get("parameters", {}))
        for schedule in dep.get("schedules", []):
            CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])
        assert dep["work_pool"]["job_variables"]["image"] == "{{ $K3A_WORKER_IMAGE }}"
        names[f"{flow.name}/{dep['name']}"] = dep
    assert set(names) == {"watch-upstream/hourly", "stage-release/default", "promote/default",
                          "rollback/default", "refresh-freshness/daily"}
    assert names["refresh-freshness/daily"]["schedules"]
    watcher = names["watch-upstream/hourly"]
    assert watcher["schedules"] and watcher["parameters"]["deployment"] in names


def test_serve_builds_the_same_five_deployments():
    deps = deployments(store_url="file:///srv/k3a", cron="0 * * * *")
    assert sorted(d.name for d in deps) == ["daily", "default", "default", "default", "hourly"]
    assert all("k3a" in d.tags and any(t.startswith("step:") for t in d.tags) for d in deps)
    (watcher,) = [d for d in deps if d.name == "hourly"]
    assert watcher.schedules[0].schedule.cron == "0 * * * *"
    assert watcher.parameters["store_url"] == "file:///srv/k3a"


def test_deployed_runs_are_named_by_their_parameters_and_tagged_by_step():
    from flows.naming import promote_name, rollback_name, stage_name

    spec = yaml.safe_load((ROOT / "flows" / "prefect.yaml").read_text())
    named = {"stage-release": stage_name, "promote": promote_name, "rollback": rollback_name}
    for dep in spec["deployments"]:
        flow = load_entrypoint(dep["entrypoint"])
        assert "k3a" in dep["tags"] and any(t.startswith("step:") for t in dep["tags"]), dep
        if flow.name in named:
            assert flow.flow_run_name is named[flow.name]
