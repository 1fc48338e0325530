"""Evidence is signed by who made it and read only through the store's policy in force
(k3artifacts/policy/signed.py), on a file store and on SeaweedFS: every forgery issue 34 found,
written as an insider with write access to the store writes it (``open()`` on the tree,
``PutObject`` on S3, no k3a code), is refused by name where it is read, and its absence passes
nothing.

The people are tests/fixtures/people.py's, each with every role, but ``rita`` (who may only
review) and ``eval-ci`` (a service that may only evaluate: a KMS key on moto server)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.policy.approvals import Decision, decision_key
from k3artifacts.policy.document import PolicyDocument
from k3artifacts.policy.loosening import loosening
from k3artifacts.policy.model import InfrastructurePolicy, TrafficPolicy
from k3artifacts.policy.record import in_force
from k3artifacts.policy.signed import read_signed, store_id
from k3artifacts.preflight.model import CHECKS, CheckOutcome, PreflightReport
from k3artifacts.promotion.evidence_migration import migrate_evidence
from k3artifacts.releases.analyses import MetricResult, TrafficAnalysis, record_analysis
from k3artifacts.releases.channels import history
from k3artifacts.releases.evaluations import EVALUATIONS, evaluations_prefix, record_run
from k3artifacts.releases.preflights import record_preflight
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.releases.reviews import Review, review_key
from k3artifacts.releases.scans import ImageScan, record_scan
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.envelope import sign_record
from k3artifacts.trust.identities import ROLES, Identities, Identity, KeyEntry, identities_yaml
from tests.fixtures.moves import check_gate, check_gates, use_policy
from tests.fixtures.people import ME, PEOPLE, key_file, person, signer_of
from tests.fixtures.releases import REPO_ROOT, passing_report, staged_for
from tests.support.cli import invoke
from tests.support.releases import Releases

#: What production's eleven gates need, each family of evidence under its own name.
FAMILIES = ("evaluation", "scan", "preflight", "traffic")


def write_identities(policies: Path, **extra: Identity) -> None:
    """The people of tests/fixtures/people.py with every role, ``rita`` a reviewer only, and
    ``extra`` (a service's key), as the store's ``identities.yaml``."""
    named = {name: Identity(roles=list(ROLES), keys=[KeyEntry.for_signer(signer_of(name))])
             for name in PEOPLE}
    named["rita"] = Identity(about="reviews only", roles=["review"],
                             keys=[KeyEntry.for_signer(signer_of("rita"))])
    me = person(ME).signer
    named[ME] = Identity(roles=list(ROLES), keys=[KeyEntry.for_signer(me)])
    (policies / "identities.yaml").write_text(identities_yaml(Identities(
        identities=named | extra)))


@pytest.fixture
def full_policies(policies: Path) -> Path:
    """The checkout's production channel with all eleven gates (the live ones too), no release
    signature required (the signature gate has its own tests), and the identities above."""
    shutil.copy(REPO_ROOT / "policies" / "promotion-gates.yaml",
                policies / "promotion-gates.yaml")
    write_identities(policies)
    return policies


@pytest.fixture(params=["file", pytest.param("seaweed", marks=pytest.mark.s3)])
def judged(request, tmp_path, k3a_env):
    """(store, the environment of a `k3a` on it, how an insider writes a key of it)."""
    if request.param == "file":
        store = FileStore(tmp_path / "store")

        def insider(key: str, data: bytes) -> None:
            path = store.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                path.chmod(0o644)  # the tree's owner may; k3a left it read-only
            with open(path, "wb") as out:
                out.write(data)

        return store, dict(k3a_env, K3A_STORE=store.url), insider
    seaweed = request.getfixturevalue("seaweed")
    store = request.getfixturevalue("seaweed_store")
    s3 = seaweed.client()

    def put_object(key: str, data: bytes) -> None:
        s3.put_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}", Body=data)

    env = dict(k3a_env, **seaweed.env, K3A_STORE=store.url)
    env.pop("AWS_SESSION_TOKEN", None)
    return store, env, put_object


def k3a(env: dict[str, str], who: str, tmp_path: Path, *args: str, expect: int = 0):
    """`k3a ARGS --json` signing with ``who``'s key; the one JSON document it prints."""
    env = dict(env, K3A_IDENTITY_KEY=str(key_file(who, tmp_path)))
    return invoke(*args, "--json", env=env, expect=expect).json


def unsigned(data: bytes) -> bytes:
    """A signed record's body as a record was written before k3a signed them: what someone
    writes by hand."""
    return canonical_json(json.loads(data)["body"])


def production_evidence(store, release, policies: Path, *, cluster: str = "ops"
                        ) -> dict[str, list[str]]:
    """Records a run, a scan, a preflight and every canary step's analysis that pass
    production's gates, the run and the scan signed by ``ci``, the preflight and the analyses
    by ``cluster`` (the packaged policy keeps the two apart); their keys by family."""
    channel = yaml.safe_load((policies / "promotion-gates.yaml").read_text())["channels"][
        "production"]
    ci, ops, now = person("ci"), person(cluster), datetime.now(UTC)
    keys: dict[str, list[str]] = {family: [] for family in FAMILIES}
    record, _ = record_run(store, passing_report(release), by=ci)
    keys["evaluation"].append(f"{evaluations_prefix(release.id)}{record.report_sha256}.json")
    scan = ImageScan(tuple_id=release.id, image_digest=release.binding.image.digest,
                     scanner="trivy", counts=dict.fromkeys(
                         ("CRITICAL", "HIGH", "MEDIUM", "LOW", "UNKNOWN"), 0), critical=[])
    record_scan(store, scan, by=ci)
    keys["scan"].append(f"releases/scans/{release.id}/{canonical_digest(scan)}.json")
    report = PreflightReport(
        tuple_id=release.id, channel="production", at=now,
        policy=InfrastructurePolicy.model_validate(channel["infrastructure"]),
        checks=[CheckOutcome(name=name, passed=True, reason="ok", evidence={})
                for name in CHECKS]).model_dump(mode="json")
    record_preflight(store, release.id, "production", report, by=ops)
    keys["preflight"].append(
        f"releases/preflight/{release.id}/production/{canonical_digest(report)}.json")
    traffic = TrafficPolicy.model_validate(channel["traffic"])
    for step, rule in enumerate(traffic.steps):
        analysis = TrafficAnalysis(
            tuple_id=release.id, channel="production", step=step, weight=rule.weight,
            window=traffic.window, thresholds=traffic.thresholds, at=now,
            prometheus="http://127.0.0.1:9090", metrics=[
                MetricResult(name="requests", query="q", bound="min", limit=20, value=500,
                             passed=True),
                MetricResult(name="e2e_latency", query="q", bound="max", limit=30, value=4.0,
                             passed=True),
                MetricResult(name="time_to_first_token", query="q", bound="max", limit=2.5,
                             value=0.3, passed=True),
                MetricResult(name="error_rate", query="q", bound="max", limit=0.01, value=0.0,
                             passed=True)])
        record_analysis(store, analysis, by=ops)
        keys["traffic"].append(f"releases/traffic/{release.id}/production/{step}/"
                               f"{canonical_digest(analysis)}.json")
    return keys


def reviewed_and_staged(store, policies: Path, tmp_path: Path):
    """A tuple under ``policies``, reviewed by rita and on staging long enough: what production
    asks of it before its evidence."""
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    review_license(store, release.id, by=person("rita"))
    review_code(store, release.id, by=person("rita"))
    staged_for(store, release, policies)
    return release


def test_hand_written_evidence_moves_no_gate_and_the_signed_evidence_passes_all_eleven(
        judged, full_policies, tmp_path):
    """The issue's case: a run, a scan, a preflight and an analysis for every canary step,
    written by hand, made all eleven production gates pass. Each is refused by name, alone or
    together; the same records signed by an identity that may make them pass."""
    store, env, insider = judged
    release = reviewed_and_staged(store, full_policies, tmp_path)
    keys = production_evidence(store, release, full_policies)
    signed = {key: store.read(key).data for family in FAMILIES for key in keys[family]}

    for forged in (FAMILIES, *((f,) for f in FAMILIES)):
        for family in FAMILIES:
            for key in keys[family]:
                insider(key, unsigned(signed[key]) if family in forged else signed[key])
        for command in (["gates", release.id, "production"],
                        ["promote", release.id, "production", "--why", "all gates pass"]):
            refused = k3a(env, "pat", tmp_path, *command, expect=4)
            assert refused["exit_code"] == 4, forged
            named = next(k for k in (k for f in forged for k in keys[f])
                         if refused["error"].startswith(f"{k}: "))
            assert f"{named}: refused (unsigned): no signature on this " in refused["error"]
            assert "k3a trust migrate" in refused["next"]
        with pytest.raises(Exception, match="never been promoted"):
            history(store, "production")

    for key, data in signed.items():
        insider(key, data)
    moved = k3a(env, "pat", tmp_path, "promote", release.id, "production", "--why", "signed")
    assert moved["changed"] and moved["entry"]["tuple_id"] == release.id
    gates = {g["name"]: g for g in moved["entry"]["gates"]}
    assert len(gates) == 11 and all(g["passed"] and not g["overridden"] for g in gates.values())


def test_one_stolen_ci_key_does_not_pass_every_evidence_gate(judged, full_policies, tmp_path):
    """The issue's case: the documented CI identity held evaluate, scan, preflight and traffic,
    so with its key forged records of all four passed every evidence gate together. Under the
    packaged production policy (evidence.apart) records that all verify, all signed by ``ci``,
    pass the evaluation and scan gates' own checks but not the rule: the move is refused (exit
    5) naming it; the same records with the cluster's half signed by ``ops`` move."""
    store, env, _ = judged
    release = reviewed_and_staged(store, full_policies, tmp_path)
    production_evidence(store, release, full_policies, cluster="ci")

    refused = k3a(env, "pat", tmp_path, "promote", release.id, "production", "--why", "forged",
                  expect=5)
    assert refused["exit_code"] == 5 and "4 gate(s) failed" in refused["error"]
    for kind in ("evaluation", "scan", "preflight", "traffic"):
        assert f"{kind} evidence passes as signed by ci only" in refused["error"]
    report = check_gates(store, release.id, "production", actor="pat")
    gates = {g.name: g for g in report.results}
    for name in ("evaluation", "image_scan", "infrastructure", "traffic"):
        assert not gates[name].passed, name
        assert "signed by ci only" in gates[name].reason
        assert "evidence.apart keeps evaluation, scan | preflight, traffic" in gates[name].reason
    assert [g.name for g in report.failed] == ["evaluation", "image_scan", "infrastructure",
                                                "traffic"]

    production_evidence(store, release, full_policies)
    moved = k3a(env, "pat", tmp_path, "promote", release.id, "production", "--why", "apart")
    assert moved["changed"] and all(g["passed"] for g in moved["entry"]["gates"])


def test_evidence_signers_asks_distinct_identities_and_relaxing_it_loosens(
        policies, tmp_path):
    """``evidence.signers: {scan: 2}``: one identity's passing scan is not enough, a second
    identity's makes it; lowering the number back is a loosening (two root identities)."""
    from k3artifacts.policy.document import PolicyDocument
    from k3artifacts.policy.loosening import loosening
    store = FileStore(tmp_path / "store")
    gates = {"schema_version": 1, "channels": {"staging": {
        "gates": ["image_scan"], "evidence": {"signers": {"scan": 2}}}}}
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump(gates))
    write_identities(policies)
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    scan = ImageScan(tuple_id=release.id, image_digest=release.binding.image.digest,
                     scanner="trivy", counts=dict.fromkeys(
                         ("CRITICAL", "HIGH", "MEDIUM", "LOW", "UNKNOWN"), 0), critical=[])
    record_scan(store, scan, by=person("ci"))
    report = check_gates(store, release.id, "staging")
    assert not report.passed
    assert "signed by 1 identity (ci); the channel's evidence.signers asks 2" \
        in report.results[0].reason
    record_scan(store, scan.model_copy(update={"scanner": "grype"}), by=person("ops"))
    assert check_gates(store, release.id, "staging").passed

    stricter = PolicyDocument.from_dir(policies)
    gates["channels"]["staging"]["evidence"] = {"signers": {"scan": 1}}
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump(gates))
    assert loosening(stricter, PolicyDocument.from_dir(policies)) == [
        "changes channel staging: evidence.signers ({scan: 2} -> {scan: 1})"]
    gates["channels"]["staging"]["evidence"] = {"signers": {"scan": 3}}
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump(gates))
    assert loosening(stricter, PolicyDocument.from_dir(policies)) == []


def test_relaxing_evidence_apart_loosens_the_policy(policies):
    """Kinds kept apart stay apart in a stricter policy: merging the two groups, dropping a
    kind or the rule loosens; splitting a group or adding a kind to one does not."""
    shutil.copy(REPO_ROOT / "policies" / "promotion-gates.yaml",
                policies / "promotion-gates.yaml")
    packaged = PolicyDocument.from_dir(policies)
    gates = yaml.safe_load((policies / "promotion-gates.yaml").read_text())

    def change(evidence):
        gates["channels"]["production"]["evidence"] = evidence
        (policies / "promotion-gates.yaml").write_text(yaml.safe_dump(gates))
        return loosening(packaged, PolicyDocument.from_dir(policies))

    assert change({"apart": [["evaluation"], ["scan"], ["preflight", "traffic"]]}) == []
    assert change({"apart": [["evaluation", "scan"], ["preflight", "traffic"]],
                   "signers": {"traffic": 2}}) == []
    merged = change({"apart": [["evaluation", "scan", "preflight"], ["traffic"]]})
    assert merged and merged[0].startswith("changes channel production: evidence.apart")
    assert change({"apart": [["evaluation"], ["preflight", "traffic"]]})
    dropped = change(None)
    assert len(dropped) == 1 and dropped[0].startswith("changes channel production: evidence (")
    assert dropped[0].endswith("-> null)")


def test_evidence_copied_from_another_tuples_key_is_refused(judged, full_policies, tmp_path):
    """A record's statement names the key it was signed for: one copied beside another tuple
    counts for nothing there."""
    store, env, insider = judged
    use_policy(store, full_policies)
    releases = Releases(store, tmp_path / "scratch")
    ran, other = releases.release(), releases.release()
    keys = production_evidence(store, ran, full_policies)
    for family in FAMILIES:
        key = keys[family][0]
        elsewhere = key.replace(ran.id, other.id)
        insider(elsewhere, store.read(key).data)
        gate = {"evaluation": "evaluation", "scan": "image_scan", "preflight": "infrastructure",
                "traffic": "traffic"}[family]
        refused = k3a(env, "pat", tmp_path, "gates", other.id, "production", expect=4)
        assert refused["error"].startswith(f"{elsewhere}: refused (wrong-key): signed for "
                                           f"['{key}']"), (gate, refused)
        store.delete(elsewhere)


def _review(store, release, *, maker: str, signer: str | None, edited_to: str | None = None
            ) -> bytes:
    """The bytes of a license review of ``release`` naming ``maker``, signed by ``signer``'s
    key (None: unsigned), its reviewer edited to ``edited_to`` after signing."""
    key = review_key("license", release.binding.license_sha256)
    w = release.binding.weights
    body = Review(kind="license", sha256=release.binding.license_sha256, reviewed_by=maker,
                  reviewer_source="key", reviewed_at=datetime.now(UTC), tuple_id=release.id,
                  repo_id=w.repo_id, commit=w.commit).model_dump(mode="json")
    if signer is None:
        return canonical_json(body)
    data = sign_record(key=key, kind="review", body=body, signer=signer_of(signer),
                       identity=signer, store_id=store_id(store))
    if edited_to is None:
        return data
    record = json.loads(data)
    record["body"]["reviewed_by"] = edited_to
    return canonical_json(record)


@pytest.mark.parametrize(("forged", "reason"), [
    ({"maker": "rita", "signer": "alice"}, "signer-mismatch"),
    ({"maker": "rita", "signer": "mallory"}, "untrusted-key"),
    ({"maker": "rita", "signer": None}, "unsigned"),
    ({"maker": "alice", "signer": "alice", "edited_to": "rita"}, "tampered"),
])
def test_a_review_under_another_name_is_refused(judged, policies, tmp_path, forged, reason):
    """alice would promote what she reviewed herself, under rita's name: signed by her own
    key, by a key the policy does not know, unsigned, or her own review edited after signing.
    Each is refused by name at the license gate; her own review, as hers, fails separation of
    duties; rita's passes."""
    store, env, insider = judged
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump({"channels": {
        "production": {"gates": ["artifact", "license", "separation_of_duties"],
                       "duties": {"not_reviewer_of": ["license"]}}}}))
    write_identities(policies)
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    key = review_key("license", release.binding.license_sha256)
    insider(key, _review(store, release, **forged))
    for command in (["gates", release.id, "production"], ["promote", release.id, "production"]):
        refused = k3a(env, "alice", tmp_path, *command, expect=4)
        assert refused["error"].startswith(f"{key}: refused ({reason}): "), refused
    insider(key, _review(store, release, maker="alice", signer="alice"))
    duties = k3a(env, "alice", tmp_path, "promote", release.id, "production", expect=5)
    assert "alice reviewed the license" in duties["error"]
    insider(key, _review(store, release, maker="rita", signer="rita"))
    assert k3a(env, "alice", tmp_path, "promote", release.id, "production")["changed"]


def test_a_hand_written_approval_decision_is_refused(judged, policies, tmp_path):
    """A decision.json written by hand, signed by the requester, or signed by an identity
    without the role approve: none authorizes the move, or the loosening policy change, it
    answers. bob's answer, signed by bob, does."""
    store, env, insider = judged
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump({"channels": {
        "staging": {"gates": ["artifact"]}}}))
    write_identities(policies)
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    asked = k3a(env, "alice", tmp_path, "promote", release.id, "staging", "--request-approval")
    rid = asked["id"]

    def decision(who: str) -> dict:
        return Decision(request_id=rid, decision="approved", by=person(who).actor,
                        at=datetime.now(UTC)).model_dump(mode="json")

    key = decision_key(rid)
    forgeries = {
        "unsigned": canonical_json(decision("bob")),
        "wrong-role": sign_record(key=key, kind="approval-decision", body=decision("rita"),
                                  signer=signer_of("rita"), identity="rita",
                                  store_id=store_id(store)),
        "untrusted-key": sign_record(key=key, kind="approval-decision", body=decision("bob"),
                                     signer=signer_of("mallory"), identity="bob",
                                     store_id=store_id(store)),
    }
    for reason, data in forgeries.items():
        insider(key, data)
        refused = k3a(env, "alice", tmp_path, "promote", release.id, "staging",
                      "--approval", rid, expect=4)
        assert refused["error"].startswith(f"{key}: refused ({reason}): "), refused
    insider(key, sign_record(key=key, kind="approval-decision", body=decision("alice"),
                             signer=signer_of("alice"), identity="alice",
                             store_id=store_id(store)))
    own = k3a(env, "alice", tmp_path, "promote", release.id, "staging", "--approval", rid,
              expect=5)
    assert "approved by alice, who asked for it: approval needs a second identity" in \
        own["error"]
    store.delete(key)
    k3a(env, "bob", tmp_path, "approve", rid)
    assert k3a(env, "alice", tmp_path, "promote", release.id, "staging",
               "--approval", rid)["changed"]

    # The loosening policy change a hand-written decision let apply: under a root of two
    # identities, policy-admin's proposal needs policy-second's signature on the change, and a
    # decision.json in policy-second's name is not one.
    second = tmp_path / "policy-second.pub"
    second.write_bytes(signer_of("policy-second").private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    rotated = k3a(env, "policy-admin", tmp_path, "trust", "rotate", "--add",
                  f"policy-second={second}")
    assert rotated["published"] and rotated["root"]["threshold"] == 2
    loose = policies / "promotion-gates.yaml"
    loose.write_text(yaml.safe_dump({"channels": {"staging": {"gates": []}}}))
    proposed = k3a(env, "policy-admin", tmp_path, "policy", "propose", str(policies))
    pid = proposed["id"]
    insider(decision_key(pid), canonical_json(Decision(
        request_id=pid, decision="approved", by=person("policy-second").actor,
        at=datetime.now(UTC)).model_dump(mode="json")))
    refused = k3a(env, "policy-admin", tmp_path, "policy", "apply", pid, expect=5)
    assert "signed by policy-admin; nothing was written" in refused["error"], refused
    assert in_force(store).document.gates.channels["staging"].gates == ["artifact"]
    store.delete(decision_key(pid))
    k3a(env, "policy-second", tmp_path, "approve", pid)
    k3a(env, "policy-admin", tmp_path, "policy", "apply", pid)
    assert in_force(store).document.gates.channels["staging"].gates == []


def test_unsigned_evidence_is_read_in_the_policys_window_until_migrated(policies, tmp_path):
    """A store from before signed records: its evidence is read as written only while the
    policy's unsigned.read_evidence_before has not passed; `migrate_evidence` re-signs
    it (the migrator vouches for it), after which the window can close."""
    store = FileStore(tmp_path / "store")
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    legacy = {}
    for made in (review_license(store, release.id, by=person("rita")),):
        legacy[made.key] = unsigned(store.read(made.key).data)
    record, _ = record_run(store, passing_report(release), by=person("ci"))
    run_key = f"{evaluations_prefix(release.id)}{record.report_sha256}.json"
    legacy[run_key] = unsigned(store.read(run_key).data)
    for key, data in legacy.items():
        store.local_path(key).chmod(0o644)
        store.local_path(key).write_bytes(data)

    def license_gate():
        return check_gate(store, release, "staging", "license")

    with pytest.raises(Exception, match=r"refused \(unsigned\): no signature on this review "
                                        r"record \(written by hand, or before k3a signed "
                                        r"records\); the store's policy, version 1"):
        license_gate()
    gates = policies / "promotion-gates.yaml"
    text = gates.read_text()
    gates.write_text(text + "unsigned:\n  read_evidence_before: 2999-01-01T00:00:00Z\n")
    use_policy(store, policies)
    assert license_gate().passed and "reviewed by rita" in license_gate().reason
    assert check_gate(store, release, "production", "evaluation").passed

    done = migrate_evidence(store, person("policy-admin"))
    assert done.resigned == {"review": 1, "evaluation": 1} and not done.refused
    assert migrate_evidence(store, person("policy-admin")).resigned == {}  # nothing left
    gates.write_text(text)  # the window closed again: the migrated records stand
    use_policy(store, policies)
    passed = license_gate()
    assert passed.passed and "reviewed by policy-admin" in passed.reason
    assert check_gate(store, release, "production", "evaluation").passed
    assert read_signed(store, run_key, EVALUATIONS).attached_by == "policy-admin"


@pytest.mark.s3
def test_a_kms_service_identity_signs_an_evaluation_the_gate_accepts(
        judged, policies, tmp_path, moto_endpoint):
    """eval-ci, a service whose key is an AWS KMS ECC_NIST_P256 key (moto server), runs the
    suite against an endpoint serving the tuple and signs the report through KMS; the
    evaluation gate accepts it. The same record signed by rita, who may not evaluate, is
    refused."""
    import boto3

    from k3artifacts.serving.render.common import served_names
    from k3artifacts.trust.keys import KmsSigner
    from tests.support.openai_server import start

    store, env, insider = judged
    kms = boto3.client("kms", endpoint_url=moto_endpoint, region_name="us-east-1")
    arn = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    env = dict(env, K3A_KMS_ENDPOINT_URL=moto_endpoint, AWS_DEFAULT_REGION="us-east-1")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        eval_ci = KmsSigner(arn)
    write_identities(policies, **{"eval-ci": Identity(
        about="the evaluation job", roles=["evaluate"], keys=[KeyEntry.for_signer(eval_ci)])})
    suite = policies / "eval-suites" / "k3-core.yaml"  # a sweep small enough for a test
    fast = yaml.safe_load(suite.read_text())
    fast["smoke"] = {"request_timeout_s": 5, "max_retries": 1,
                     "slo": {"ttft_p99_s": 0.5, "e2e_p99_s": 2.0, "max_error_rate": 0.01},
                     "sweep": {"max_concurrency": 4, "requests_per_worker": 2, "max_tokens": 16}}
    suite.write_text(yaml.safe_dump(fast, sort_keys=False))
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    server = start(served_names(release), tmp_path / "openai.log")
    try:
        ran = invoke("eval", "run", server.url, "--tuple", release.id, "--json",
                     env=dict(env, K3A_IDENTITY_KEY=f"kms:{arn}"))
    finally:
        server.stop()
    key = f"{evaluations_prefix(release.id)}{ran.json['report_sha256']}.json"
    stored = json.loads(store.read(key).data)
    assert stored["body"]["attached_by"] == "eval-ci"
    accepted = check_gate(store, release, "production", "evaluation")
    assert accepted.passed, accepted.reason

    body = dict(stored["body"], attached_by="rita")
    insider(key, sign_record(key=key, kind="evaluation", body=body, signer=signer_of("rita"),
                             identity="rita", store_id=store_id(store)))
    refused = k3a(env, "pat", tmp_path, "gates", release.id, "production", expect=4)
    assert refused["error"].startswith(
        f"{key}: refused (wrong-role): a evaluation needs a signer with the role evaluate: rita "
        "holds review")


def test_a_move_whose_maker_lacks_the_role_is_refused_before_it_asks_anything(
        judged, policies, tmp_path):
    """rita may review and nothing else: her evaluation, scan, preflight, analysis, approval
    and capture are refused (exit 9) before a request is sent or a record written."""
    store, env, _ = judged
    write_identities(policies)
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"suite": "k3-core", "passed": 1, "total": 1}))
    before = sorted(store.list_keys("releases/"))
    for args, role in ((["eval", "attach", release.id, str(report)], "evaluate"),
                       (["smoke", "http://127.0.0.1:9", "--tuple", release.id], "evaluate"),
                       (["scan", "attach", release.id, "--report", str(report)], "scan"),
                       (["traffic", "analyze", release.id, "--channel", "production",
                         "--step", "0", "--prometheus", "http://127.0.0.1:9"], "traffic")):
        refused = k3a(env, "rita", tmp_path, *args, expect=9)
        assert f"is signed with the role {role}; rita holds review" in refused["error"], args
    assert sorted(store.list_keys("releases/")) == before
