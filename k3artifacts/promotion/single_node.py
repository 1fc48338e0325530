"""Rolling one serving node back to the channel's previous tuple, planned, then acted.

The plan is the pointer move's own (:func:`k3artifacts.promotion.rollback.plan_rollback`: the
target served the channel, the approval the store's policy requires is present and valid, the
target's weights are in the store with the manifest digest the tuple binds) and the target's
render for one Deployment pod; a refusal there touches neither the cluster nor the store. The
act then takes each step, recorded:

1. ``stop_admitting``: the Service selects no pod (a selector key no pod carries), so the load
   balancer stops sending new requests while the running ones continue;
2. ``drain``: wait, bounded, until the pod's ``vllm:num_requests_running`` is 0;
3. ``apply``: the previous tuple's ``eks`` render (all but the Service), server-side applied;
4. ``ready``: wait, bounded, until the Deployment has rolled out and is available;
5. ``smoke``: ``k3a smoke`` of the previous tuple against the pod, recorded as every smoke is;
6. ``reopen``: the selector key removed and the Service applied: traffic flows again;
7. ``pointer``: the channel moved back (history records who and why).

A step that fails stops the procedure and says what state the node is in. If draining times
out nothing was changed, so admission is reopened on the tuple that was serving. The steps are
recorded create-once under ``releases/single-node/<channel>/``, completed or not, a signed
record of who rolled back (role ``promote``; ``policy/signed.py``). The smoke step's report is
an evaluation record signed by the same identity, so the plan asks for the role ``evaluate``
too.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import BadAnswer, ConfigError, K3AError
from k3artifacts.net.calls import Peer, call
from k3artifacts.net.redact import redact_url
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.signed import Family, create_signed, require_role
from k3artifacts.preflight.kube import KubeAPI
from k3artifacts.promotion.rollback import RollbackPlan, act_rollback, plan_rollback
from k3artifacts.readiness.record import smoke
from k3artifacts.readiness.suite import SmokeSettings
from k3artifacts.serving.render import render
from k3artifacts.serving.render.common import default_name
from k3artifacts.stores.base import Store

CLOSED_KEY = "k3a.io/admitting"
MANAGER = "k3a"
RECORDS_PREFIX = "releases/single-node/"
#: API path prefix and plural of each kind the ``eks`` target renders for one node.
KINDS = {
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Service": ("/api/v1", "services", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "PersistentVolume": ("/api/v1", "persistentvolumes", False),
    "ConfigMap": ("/api/v1", "configmaps", True),
}
StepName = Literal["stop_admitting", "drain", "apply", "ready", "smoke", "reopen", "pointer"]


class Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: StepName
    passed: bool
    detail: str
    started_at: datetime
    seconds: float


class SingleNodeRollback(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    channel: str
    from_tuple: str
    to_tuple: str
    name: str
    namespace: str
    steps: list[Step]
    #: The identity whose key signed the record (the reader checks they agree).
    by: str

    @property
    def completed(self) -> bool:
        return len(self.steps) == 7 and all(s.passed for s in self.steps)


SINGLE_NODE = Family(RECORDS_PREFIX, "single-node-rollback", SingleNodeRollback, "by")


#: One sample of the gauge in Prometheus's text format: the name, its labels (quoted values
#: may hold any character), the value; a timestamp may follow.
_RUNNING = re.compile(r'^vllm:num_requests_running(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?[ \t]+(\S+)')
#: A vLLM /metrics page is tens of KB.
_MAX_METRICS_PAGE = 16 << 20


def running_requests(metrics_url: str) -> float:
    """Sum of ``vllm:num_requests_running`` on a vLLM ``/metrics`` page (through the network
    layer: the whole page within the deadline; a value that is not a finite count refused)."""
    shown = redact_url(metrics_url)
    answer = call("GET", metrics_url, Peer(f"vLLM metrics at {shown}",
                                           hint="point --metrics at the vLLM pod's /metrics"),
                  limit=_MAX_METRICS_PAGE)
    if answer.status != 200:
        raise ConfigError(f"{shown} answered HTTP {answer.status}")
    values = []
    for line in answer.body.decode("utf-8", errors="replace").splitlines():
        sample = _RUNNING.match(line)
        if sample is None:
            continue
        try:
            value = float(sample.group(1))
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise BadAnswer(f"{shown}: vllm:num_requests_running is "
                            f"{sample.group(1)[:40]!r}, not a count of requests")
        values.append(value)
    if not values:
        raise ConfigError(f"{shown} exports no vllm:num_requests_running",
                          hint="point --metrics at the vLLM pod's /metrics")
    return sum(values)


def _path(doc: dict[str, Any], namespace: str) -> str:
    base, plural, namespaced = KINDS[doc["kind"]]
    where = f"/namespaces/{namespace}" if namespaced else ""
    return f"{base}{where}/{plural}/{doc['metadata']['name']}"


def _apply(kube: KubeAPI, doc: dict[str, Any], namespace: str) -> None:
    body = json.loads(json.dumps(doc))
    if KINDS[doc["kind"]][2]:
        body["metadata"]["namespace"] = namespace
    kube.call("PATCH", f"{_path(doc, namespace)}?fieldManager={MANAGER}&force=true",
              json.dumps(body).encode(), "application/apply-patch+yaml")


def _selector_patch(kube: KubeAPI, name: str, namespace: str, value: str | None) -> None:
    kube.call("PATCH", f"/api/v1/namespaces/{namespace}/services/{name}",
              json.dumps({"spec": {"selector": {CLOSED_KEY: value}}}).encode(),
              "application/merge-patch+json")


def _wait(check: Callable[[], tuple[bool, str]], timeout_s: float, what: str,
          interval: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        done, detail = check()
        if done:
            return detail
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s:g} s ({detail})")
        time.sleep(interval)


@dataclass(frozen=True)
class SingleNodePlan:
    """The pointer move planned and the node's objects rendered; nothing touched yet."""

    rollback: RollbackPlan
    name: str
    namespace: str
    #: The target's ``eks`` render for this node.
    documents: tuple[dict[str, Any], ...]
    endpoint: str
    metrics_url: str
    settings: SmokeSettings
    drain_timeout_s: float
    ready_timeout_s: float
    poll_s: float

    @property
    def from_tuple(self) -> str:
        assert self.rollback.state.tuple_id is not None
        return self.rollback.state.tuple_id

    @property
    def to_tuple(self) -> str:
        return self.rollback.tuple_id

    def document(self, kind: str) -> dict[str, Any]:
        return next(d for d in self.documents if d["kind"] == kind)


@dataclass(frozen=True)
class SingleNodeResult:
    report: SingleNodeRollback
    #: Where the steps are recorded in the store.
    key: str


def plan_single_node(
    store: Store,
    channel: str,
    *,
    name: str | None,
    namespace: str,
    endpoint: str,
    metrics_url: str,
    acting: Acting,
    reason: str | None = None,
    approval: str | None = None,
    to: str | None = None,
    settings: SmokeSettings | None = None,
    drain_timeout_s: float = 600,
    ready_timeout_s: float = 5400,
    poll_s: float = 1.0,
) -> SingleNodePlan:
    """Plan the pointer move first, then the node's objects; raises whatever refuses the
    rollback (RoleRefused without the roles ``promote`` and ``evaluate``, NotFound,
    ApprovalNeeded, InvalidApproval, VerifyMismatch, RevisionRetiring) before anything is asked
    of the cluster. ``name``: the rendered objects' name (default: as ``k3a render`` names the
    target)."""
    require_role(acting, "evaluation", "the smoke report of a single-node rollback")
    rollback = plan_rollback(store, channel, to=to, acting=acting, approval=approval,
                             reason=reason or "single-node rollback")
    if rollback.release is None:
        raise ConfigError(f"{channel} already points at {rollback.tuple_id}; a node rollback "
                          "puts another tuple the channel served on the node",
                          hint=f"see `k3a channel history {channel}`; pass --to TUPLE")
    release = rollback.release
    docs = render(release, "eks", name=name or default_name(release),
                  namespace=namespace).documents
    if any(d["kind"] not in KINDS for d in docs):
        raise ConfigError(f"{release.id} renders a multi-node group; the single-node path "
                          "drains one Deployment pod",
                          hint="use `k3a rollback` and apply the render")
    return SingleNodePlan(rollback=rollback, name=name or default_name(release),
                          namespace=namespace, documents=tuple(docs), endpoint=endpoint,
                          metrics_url=metrics_url, settings=settings or SmokeSettings(),
                          drain_timeout_s=drain_timeout_s, ready_timeout_s=ready_timeout_s,
                          poll_s=poll_s)


def act_single_node(store: Store, plan: SingleNodePlan, *, kube: KubeAPI,
                    on_step: Callable[[Step], None] | None = None) -> SingleNodeResult:
    """Take the steps of ``plan`` on the node, stopping at the first that fails, and record
    them."""
    name, namespace, target = plan.name, plan.namespace, plan.to_tuple
    actor = plan.rollback.acting.actor
    steps: list[Step] = []

    def run(step: StepName, fn: Callable[[], str]) -> bool:
        started, t0 = datetime.now(UTC), time.monotonic()
        try:
            detail, ok = fn(), True
        except (K3AError, TimeoutError) as exc:
            detail, ok = str(exc), False
        done = Step(name=step, passed=ok, detail=detail, started_at=started,
                    seconds=round(time.monotonic() - t0, 3))
        steps.append(done)
        if on_step is not None:
            on_step(done)
        return ok

    def stop_admitting() -> str:
        _selector_patch(kube, name, namespace, "closed")
        return f"Service {namespace}/{name} selects no pod ({CLOSED_KEY}=closed)"

    seen: list[float] = []

    def drain() -> str:
        def idle() -> tuple[bool, str]:
            seen.append(running_requests(plan.metrics_url))
            return seen[-1] == 0, f"{seen[-1]:g} request(s) running"
        _wait(idle, plan.drain_timeout_s, "vllm:num_requests_running == 0", plan.poll_s)
        return f"in flight: {max(seen):g} at most, 0 after {len(seen)} reading(s)"

    def apply() -> str:
        applied = [d for d in plan.documents if d["kind"] != "Service"]
        for doc in applied:
            _apply(kube, doc, namespace)
        return f"{target} applied: " + ", ".join(f"{d['kind']}/{d['metadata']['name']}"
                                                 for d in applied)

    def ready() -> str:
        path = _path(plan.document("Deployment"), namespace)

        def rolled_out() -> tuple[bool, str]:
            d = kube.call("GET", path)
            want = d.get("spec", {}).get("replicas", 1)
            st = d.get("status", {})
            ok = (st.get("observedGeneration", 0) >= d.get("metadata", {}).get("generation", 0)
                  and st.get("updatedReplicas") == want and st.get("availableReplicas") == want)
            return ok, f"{st.get('availableReplicas', 0)}/{want} available, " \
                       f"{st.get('updatedReplicas', 0)} updated"
        return _wait(rolled_out, plan.ready_timeout_s, f"Deployment {name} rolled out",
                     plan.poll_s)

    def smoke_step() -> str:
        outcome = smoke(store, plan.endpoint, target, plan.settings, by=plan.rollback.acting)
        failed = [c.name for c in outcome.report.failed]
        if not outcome.report.passed:
            raise ConfigError(f"smoke of {target} failed: {', '.join(failed)}")
        return f"smoke passed (report {outcome.record.report_sha256[:12]})"

    def reopen() -> str:
        _selector_patch(kube, name, namespace, None)
        _apply(kube, plan.document("Service"), namespace)
        return f"Service {namespace}/{name} selects {target}'s pod again"

    def pointer() -> str:
        moved = act_rollback(store, plan.rollback)
        return f"{plan.rollback.channel} -> {moved.tuple_id} (history #{moved.entry.seq})"

    if run("stop_admitting", stop_admitting):
        if not run("drain", drain):
            # Nothing changed on the node: let the serving tuple take traffic again.
            run("reopen", lambda: (_selector_patch(kube, name, namespace, None),
                                   f"drain timed out; {plan.from_tuple} admitted again")[1])
        elif run("apply", apply) and run("ready", ready) and run("smoke", smoke_step) \
                and run("reopen", reopen):
            run("pointer", pointer)
    report = SingleNodeRollback(channel=plan.rollback.channel, from_tuple=plan.from_tuple,
                                to_tuple=target, name=name, namespace=namespace, steps=steps,
                                by=actor.name)
    return SingleNodeResult(report, record_single_node(store, report, by=plan.rollback.acting))


def rollback_single_node(store: Store, channel: str, *, kube: KubeAPI,
                         on_step: Callable[[Step], None] | None = None,
                         **planned: Any) -> SingleNodeResult:
    """The single-node rollback move: :func:`plan_single_node` (``planned`` are its
    arguments), then :func:`act_single_node`."""
    return act_single_node(store, plan_single_node(store, channel, **planned), kube=kube,
                           on_step=on_step)


def record_single_node(store: Store, report: SingleNodeRollback, *, by: Acting) -> str:
    """Store the procedure's record create-once, signed by ``by``; returns its key."""
    key = f"{RECORDS_PREFIX}{report.channel}/{canonical_digest(report)}.json"
    create_signed(store, key, SINGLE_NODE, report, by=by)
    return key
