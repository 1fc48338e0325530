"""Every move is planned before it acts: with one check failing, the move is refused with its
named error and exit code, nothing in the store changed (every file under the store's root,
hidden ones too, with its bytes) and nothing outside was asked anything (the registry, the
Kubernetes API, the endpoint, Prometheus, AWS and the Hub are a recording stand-in on
127.0.0.1; a refused staging downloads no file from a real local hub)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import (
    ConfigError,
    Conflict,
    GatesRefused,
    K3AError,
    NotFound,
    ReleaseRefused,
    UnsafeCacheEntry,
    UntrustedRecord,
)
from k3artifacts.policy.approvals import InvalidApproval, request_approval
from k3artifacts.policy.change import apply, init_policy, propose
from k3artifacts.policy.decide import decide
from k3artifacts.policy.document import PolicyDocument
from k3artifacts.preflight.kube import KubeAPI
from k3artifacts.preflight.run import preflight
from k3artifacts.promotion.moves import ApprovalNeeded, promote
from k3artifacts.promotion.requests import request_move
from k3artifacts.promotion.rollback import rollback
from k3artifacts.promotion.single_node import rollback_single_node
from k3artifacts.readiness.record import attach, evaluate, smoke
from k3artifacts.readiness.suite import SmokeSettings
from k3artifacts.releases.channels import history_key, pointer_key
from k3artifacts.releases.retention import plan_gc
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.releases.scanning import scan_attach, scan_ecr
from k3artifacts.releases.signing import sign
from k3artifacts.serving.tuple_create import create_release_tuple
from k3artifacts.staging.engine import StageOptions, stage
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.file import FileStore
from k3artifacts.traffic.analysis import analyze
from k3artifacts.warm.capture import capture, parse_roots
from k3artifacts.warm.retention import gc
from tests.fixtures.moves import as_acting, use_policy
from tests.fixtures.people import person
from tests.support.releases import REPO_ID, Releases
from tests.support.witness import RecordingServer, tree_snapshot

UNKNOWN_TUPLE = "k3t-" + "0" * 24
ME = as_acting("oncall")


@dataclass
class Ctx:
    store: FileStore
    rel: Releases
    policies: Path
    outside: RecordingServer
    tmp: Path
    request: pytest.FixtureRequest
    monkeypatch: pytest.MonkeyPatch

    def reviewed(self, n: int = 1):  # type: ignore[no-untyped-def]
        made = []
        for _ in range(n):
            t = self.rel.release()
            review_license(self.store, t.id, by=person("rita"))
            review_code(self.store, t.id, by=person("rita"))
            made.append(t)
        return made

    def served(self):  # type: ignore[no-untyped-def]
        """staging served a, then b; c never served it."""
        a, b, c = self.reviewed(3)
        for t in (a, b):
            promote(self.store, t.id, "staging", acting=as_acting("ci"))
        return a, b, c

    def aws_at_the_stand_in(self) -> None:
        self.monkeypatch.setenv("AWS_ENDPOINT_URL", self.outside.url)
        for var, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s"),
                           ("AWS_DEFAULT_REGION", "us-east-1")):
            self.monkeypatch.setenv(var, value)


@dataclass
class Case:
    run: Callable[[], object]
    error: type[K3AError]
    exit_code: int
    #: What was asked of the outside world; the recording stand-in's calls by default.
    asked: Callable[[], list] | None = None


def _stage_bad_key(ctx: Ctx) -> Case:
    key = ctx.tmp / "not-a-key.pem"
    key.write_text("not a key\n")
    return Case(lambda: stage(HubSource(endpoint=ctx.outside.url, token=False), ctx.store,
                              REPO_ID, "main", ctx.store.root / ".k3a-quarantine",
                              StageOptions(signing_key=str(key))), ConfigError, 9)


def _stage_pickle(ctx: Ctx) -> Case:
    hub = ctx.request.getfixturevalue("local_hub")
    hub.hub.add_commit(REPO_ID, {"config.json": b"{}", "LICENSE": b"MIT\n",
                                 "pytorch_model.bin": b"\x80\x04K\x01."})
    return Case(lambda: stage(HubSource(endpoint=hub.endpoint, token=False), ctx.store, REPO_ID,
                              "main", ctx.store.root / ".k3a-quarantine"), ReleaseRefused, 3,
                asked=lambda: [r.url for r in hub.hub.requests if "/resolve/" in r.url])


def _sign_unpublished(ctx: Ctx) -> Case:
    key = ctx.tmp / "release.pem"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    key.chmod(0o600)  # a private key as its owner keeps it (k3a refuses one others can read)
    return Case(lambda: sign(ctx.store, f"{REPO_ID}@{'a' * 40}", str(key)), NotFound, 7)


def _tuple_unpublished(ctx: Ctx) -> Case:
    return Case(lambda: create_release_tuple(
        ctx.store, f"{REPO_ID}@{'b' * 40}", f"{ctx.outside.host}/k3a/vllm:k3", "p6-b300-tp8"),
        NotFound, 7)


def _review_license_none(ctx: Ctx) -> Case:
    t = ctx.rel.release(license_text=None)
    return Case(lambda: review_license(ctx.store, t.id, by=person("rita")),
                NotFound, 7)


def _review_code_unknown(ctx: Ctx) -> Case:
    return Case(lambda: review_code(ctx.store, UNKNOWN_TUPLE, by=person("rita")),
                NotFound, 7)


def _approve_own(ctx: Ctx) -> Case:
    (t,) = ctx.reviewed()
    asked = request_approval(ctx.store, action="promote", by=ME, channel="staging",
                             tuple_id=t.id)
    return Case(lambda: decide(ctx.store, asked.id, by=ME, approve=True),
                InvalidApproval, 5)


def _request_promotion_gate(ctx: Ctx) -> Case:
    t = ctx.rel.release()  # never reviewed
    return Case(lambda: request_move(ctx.store, "promote", "staging", tuple_id=t.id,
                                     requested_by=ME), GatesRefused, 5)


def _request_rollback_never_served(ctx: Ctx) -> Case:
    _, _, c = ctx.served()
    return Case(lambda: request_move(ctx.store, "rollback", "staging", tuple_id=c.id,
                                     requested_by=ME), NotFound, 7)


def _promote_gate(ctx: Ctx) -> Case:
    t = ctx.rel.release()
    return Case(lambda: promote(ctx.store, t.id, "staging", acting=ME), GatesRefused, 5)


def _rollback_unapproved(ctx: Ctx) -> Case:
    ctx.served()
    gates = ctx.policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n",
        "    gates: [artifact, license, remote_code]\n    rollback_approval: true\n", 1))
    use_policy(ctx.store, ctx.policies)
    return Case(lambda: rollback(ctx.store, "staging", acting=ME), ApprovalNeeded, 5)


def _single_node_never_served(ctx: Ctx) -> Case:
    _, _, c = ctx.served()
    kube = KubeAPI(ctx.outside.kubeconfig(ctx.tmp / "kubeconfig"))
    return Case(lambda: rollback_single_node(
        ctx.store, "staging", kube=kube, name=None, namespace="serving",
        endpoint=f"{ctx.outside.url}/v1", metrics_url=f"{ctx.outside.url}/metrics", acting=ME,
        to=c.id), NotFound, 7)


def _policy_init_again(ctx: Ctx) -> Case:
    return Case(lambda: init_policy(ctx.store, None, by=ME), Conflict, 6)


def _policy_propose_same(ctx: Ctx) -> Case:
    return Case(lambda: propose(ctx.store, PolicyDocument.from_dir(ctx.policies), by=ME),
                ConfigError, 9)


def _policy_apply_unapproved(ctx: Ctx) -> Case:
    gates = ctx.policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n", "    gates: [artifact, license]\n", 1))
    asked, _ = propose(ctx.store, PolicyDocument.from_dir(ctx.policies), by=ME)
    assert asked.needs  # it loosens staging: a second identity must approve it first
    return Case(lambda: apply(ctx.store, asked.id, by=ME), InvalidApproval, 5)


def _preflight_no_policy(ctx: Ctx) -> Case:
    ctx.aws_at_the_stand_in()
    t = ctx.rel.release()
    config = ctx.outside.kubeconfig(ctx.tmp / "kubeconfig")
    return Case(lambda: preflight(ctx.store, t.id, "staging", kubeconfig=config,
                                  aws_profile=None, by=person("ci")), ConfigError, 9)


def _traffic_no_such_step(ctx: Ctx) -> Case:
    t = ctx.rel.release()
    return Case(lambda: analyze(ctx.store, t.id, "production", 7,
                                prometheus_url=ctx.outside.url, by=person("ci")), ConfigError, 9)


def _scan_another_image(ctx: Ctx) -> Case:
    t = ctx.rel.release()
    other = f"{t.binding.image.repository}@sha256:{'e' * 64}"
    report = json.dumps({"SchemaVersion": 2, "Metadata": {"RepoDigests": [other]},
                         "Results": []}).encode()
    return Case(lambda: scan_attach(ctx.store, t.id, report, "trivy.json", by=person("ci")),
                ConfigError, 9)


def _scan_ecr_unknown(ctx: Ctx) -> Case:
    ctx.aws_at_the_stand_in()
    return Case(lambda: scan_ecr(ctx.store, UNKNOWN_TUPLE, repository=None, region="us-east-1",
                                 by=person("ci")), NotFound, 7)


def _eval_bad_suite(ctx: Ctx) -> Case:
    t = ctx.rel.release()
    suite = ctx.tmp / "suite.yaml"
    suite.write_text("cases: [not closed\n")
    return Case(lambda: evaluate(ctx.store, ctx.outside.url, t.id, suite, channel="production",
                                 by=person("ci")), ConfigError, 9)


def _smoke_empty_channel(ctx: Ctx) -> Case:
    return Case(lambda: smoke(ctx.store, ctx.outside.url, "staging", SmokeSettings(), by=person("ci")),
                NotFound, 7)


def _attach_not_a_report(ctx: Ctx) -> Case:
    t = ctx.rel.release()
    return Case(lambda: attach(ctx.store, t.id, b"{}", "report.json", by=person("ci")), ConfigError, 9)


def _warm_capture_link(ctx: Ctx) -> Case:
    t = ctx.rel.release()
    cache = ctx.tmp / "triton"
    cache.mkdir()
    (cache / "kernel.cubin").write_bytes(b"\x7fELF")
    (cache / "planted").symlink_to("/etc/passwd")
    return Case(lambda: capture(ctx.store, t, gpu="NVIDIA H100 80GB HBM3", tensor_parallel=8,
                                pipeline_parallel=1, roots=parse_roots([f"triton={cache}"]),
                                by=person("ci")), UnsafeCacheEntry, 9)


def _gc_pointer_set_back(ctx: Ctx) -> Case:
    ctx.served()
    ctx.rel.publish()  # a revision no channel reaches: what gc would retire
    # The pointer set back to entry #1 as signed: its log goes on past it.
    (ctx.store.root / pointer_key("staging")).write_bytes(
        (ctx.store.root / history_key("staging", 1)).read_bytes())
    return Case(lambda: gc(ctx.store, plan_gc(ctx.store, keep=1, keep_days=0), by=ME.actor),
                UntrustedRecord, 4)


CASES: dict[str, Callable[[Ctx], Case]] = {
    "stage: a signing key that is no key": _stage_bad_key,
    "stage: a pickle file upstream": _stage_pickle,
    "sign: a revision not published": _sign_unpublished,
    "tuple create: a revision not published": _tuple_unpublished,
    "review license: a tuple without a license": _review_license_none,
    "review code: an unknown tuple": _review_code_unknown,
    "approve: by the requester": _approve_own,
    "approval request of a promotion: a gate fails": _request_promotion_gate,
    "approval request of a rollback: a target never served": _request_rollback_never_served,
    "promote: a gate fails": _promote_gate,
    "rollback: no approval where the policy wants one": _rollback_unapproved,
    "single-node rollback: a target never served": _single_node_never_served,
    "policy init: the store has one": _policy_init_again,
    "policy propose: the policy in force": _policy_propose_same,
    "policy apply: a loosening nobody approved": _policy_apply_unapproved,
    "preflight: no infrastructure policy": _preflight_no_policy,
    "traffic analysis: a step the channel does not have": _traffic_no_such_step,
    "image scan attach: a report of another image": _scan_another_image,
    "image scan ecr: an unknown tuple": _scan_ecr_unknown,
    "evaluation run: a malformed suite": _eval_bad_suite,
    "smoke: a channel nothing was promoted to": _smoke_empty_channel,
    "evaluation attach: not a report": _attach_not_a_report,
    "warm capture: a link in a cache directory": _warm_capture_link,
    "gc: a channel pointer set back by hand": _gc_pointer_set_back,
}


@pytest.fixture
def ctx(tmp_path, policies, request, monkeypatch):
    store = FileStore(tmp_path / "store")
    use_policy(store, policies)
    with RecordingServer() as outside:
        yield Ctx(store, Releases(store, tmp_path / "scratch"), policies, outside, tmp_path,
                  request, monkeypatch)


@pytest.mark.parametrize("move", list(CASES))
def test_a_refused_move_writes_nothing_and_asks_nothing(move, ctx):
    case = CASES[move](ctx)
    before = tree_snapshot(ctx.store.root)
    with pytest.raises(case.error) as refused:
        case.run()
    assert refused.value.exit_code == case.exit_code, refused.value
    after = tree_snapshot(ctx.store.root)
    assert sorted(after.keys() ^ before.keys()) == []
    assert [k for k in after if after[k] != before[k]] == []
    asked = case.asked() if case.asked else ctx.outside.calls
    assert asked == []
