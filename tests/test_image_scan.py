"""The serving image's scan recorded with the tuple: Trivy and Grype JSON reports (in the
formats those tools write) and ECR's scan findings through boto3 against moto; the
image_scan gate fails on critical findings unless overridden with a reason."""

from __future__ import annotations

import json
import subprocess
import uuid

import urllib3
import yaml

from k3artifacts.policy.gates import apply_overrides, overridable
from k3artifacts.policy.record import in_force
from k3artifacts.promotion.gates import channel_policy
from k3artifacts.releases.binding import create_tuple
from k3artifacts.releases.scans import list_scans
from k3artifacts.releases.tuples import ImageRef
from k3artifacts.serving.profiles import load_profile, serving_spec
from tests.fixtures.moves import check_gate, check_gates, use_policy

VERIFIER = "registry.example.com/k3a-worker@sha256:" + "2" * 64


def _release(published, image: ImageRef):
    spec = serving_spec(load_profile("p6-b300-tp8"), verifier_image=VERIFIER)
    p = published
    return create_tuple(p.store, p.repo_id, p.commit, image, spec).release


def trivy(image: ImageRef, vulns: list[tuple[str, str]]) -> dict:
    return {"SchemaVersion": 2, "ArtifactName": image.reference,
            "ArtifactType": "container_image",
            "Metadata": {"RepoDigests": [f"{image.repository}@{image.digest}"]},
            "Results": [{"Target": "vllm (ubuntu 24.04)", "Class": "os-pkgs", "Type": "ubuntu",
                         "Vulnerabilities": [{"VulnerabilityID": v, "PkgName": "openssl",
                                              "InstalledVersion": "3.0.13", "Severity": s}
                                             for v, s in vulns]}]}


def grype(image: ImageRef, vulns: list[tuple[str, str]]) -> dict:
    return {"matches": [{"vulnerability": {"id": v, "severity": s},
                         "artifact": {"name": "torch", "version": "2.9.0"}} for v, s in vulns],
            "source": {"type": "image", "target": {"userInput": image.reference,
                                                   "manifestDigest": image.digest,
                                                   "repoDigests": []}},
            "descriptor": {"name": "grype", "version": "0.92.0"}}


def test_critical_findings_fail_until_overridden(published_revision, policies, tmp_path,
                                                 k3a_cmd, k3a_env):
    image = ImageRef(repository="registry.example.com/vllm", digest="sha256:" + "3" * 64)
    release = _release(published_revision, image)
    store = published_revision.store

    def attach(report: dict):
        path = tmp_path / f"report-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(report))
        return subprocess.run([*k3a_cmd, "scan", "attach", release.id, "--report", str(path),
                               "--json", "--store", store.url],
                              env=k3a_env, capture_output=True, text=True, timeout=120)

    gate_file = policies / "promotion-gates.yaml"
    doc = yaml.safe_load(gate_file.read_text())
    doc["channels"]["production"]["gates"].append("image_scan")
    gate_file.write_text(yaml.safe_dump(doc))
    use_policy(store, policies)
    chan = channel_policy(in_force(store), "production")

    def gate():
        return check_gate(store, release, "production", "image_scan")

    assert "no scan of registry.example.com/vllm@sha256:333" in gate().reason
    other = ImageRef(repository=image.repository, digest="sha256:" + "4" * 64)
    refused = attach(trivy(other, []))
    assert refused.returncode == 9 and "not the tuple's image" in refused.stderr
    run = attach(trivy(image, [("CVE-2026-0001", "CRITICAL"), ("CVE-2026-0002", "HIGH"),
                               ("CVE-2026-0003", "MEDIUM")]))
    assert run.returncode == 0, run.stderr
    scan = json.loads(run.stdout)["scan"]
    assert scan["critical"] == ["CVE-2026-0001"] and scan["counts"]["HIGH"] == 1
    failed = gate()
    assert not failed.passed and "trivy found 1 critical: CVE-2026-0001" in failed.reason
    # only an override with a reason lets it through, and the override is what is recorded
    assert overridable("image_scan")
    report = check_gates(store, release.id, "production")
    scan_only = report.model_copy(update={"results": [r for r in report.results
                                                      if r.name == "image_scan"]})
    verdict = apply_overrides(chan.gates, scan_only, {"image_scan": "CVE-2026-0001 is in a tool "
                                                "vLLM never loads; fix in next image"})
    assert [o.gate for o in verdict.used] == ["image_scan"]
    # a later scan of a rebuilt image's report without criticals: the newest decides
    run = attach(grype(image, [("GHSA-xxxx-yyyy-zzzz", "High"), ("CVE-2026-0009", "Negligible")]))
    assert run.returncode == 0, run.stderr
    assert gate().passed and "grype: no critical (1 high, 1 low)" in gate().reason
    assert len(list_scans(store, release.id)) == 2


def test_ecr_scan_findings(published_revision, policies, moto_ecr, moto_endpoint, k3a_cmd,
                           k3a_env):
    use_policy(published_revision.store, policies)
    name = f"vllm-{uuid.uuid4().hex[:8]}"
    pushed = moto_ecr.push(name, "k3")
    image = ImageRef(repository=f"{moto_ecr.registry}/{name}", digest=pushed.digest)
    release = _release(published_revision, image)
    result = {"imageScanFindings": {
        "findings": [{"name": "CVE-2026-1111", "severity": "CRITICAL"},
                     {"name": "CVE-2026-2222", "severity": "LOW"}],
        "findingSeverityCounts": {"CRITICAL": 1, "LOW": 1}},
        "registryId": moto_ecr.account, "repositoryName": name,
        "imageId": {"imageDigest": pushed.digest},
        "imageScanStatus": {"status": "COMPLETE", "description": "done"}}
    cli = [*k3a_cmd, "scan", "ecr", release.id, "--json", "--store",
           published_revision.store.url]
    env = {**k3a_env, **moto_ecr.env()}
    unscanned = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert unscanned.returncode == 7 and "start-image-scan" in unscanned.stderr, unscanned.stderr
    moto_ecr.client().start_image_scan(repositoryName=name,
                                       imageId={"imageDigest": pushed.digest})
    urllib3.request("POST", f"{moto_endpoint}/moto-api/static/ecr/scan-finding-results",
                    json={"results": [result], "region": moto_ecr.region})
    run = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    scan = json.loads(run.stdout)["scan"]
    assert scan["scanner"] == "ecr" and scan["critical"] == ["CVE-2026-1111"]
    assert scan["counts"]["LOW"] == 1
