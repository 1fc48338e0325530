"""The infrastructure preflight: each named check with its evidence, through boto3 against
moto in server mode (subnets, S3 gateway endpoints, FSx for Lustre, IAM roles and policies)
and a Kubernetes API on loopback answering /api/v1/nodes; then the infrastructure gate.

moto 5.2.5 does not implement EC2 DescribeCapacityReservations (nor SageMaker training plans):
the capacity check is tested with botocore's Stubber, which checks our request and the
answers against EC2's own service model, as AWS would shape them."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from k3artifacts.policy.rollout import InfrastructurePolicy
from k3artifacts.preflight import checks
from k3artifacts.preflight.kube import list_nodes
from k3artifacts.preflight.run import AwsClients, run_preflight
from k3artifacts.releases.binding import create_tuple
from k3artifacts.releases.preflights import list_preflights, record_preflight
from k3artifacts.releases.tuples import ImageRef, WeightsRef
from k3artifacts.serving.profiles import (
    FsxTarget,
    StorageTarget,
    load_profile,
    serving_resources,
    serving_spec,
)
from tests.fixtures.moves import check_gate, use_policy
from tests.fixtures.people import person

REGION, ZONE = "us-east-1", "us-east-1a"
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
IMAGE = ImageRef(repository="registry.example.com/vllm", digest="sha256:" + "1" * 64, tag="k3")
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "2" * 64
ROLE = "k3-inference"
WEIGHTS = "s3://k3a-releases/prod/models/moonshotai/Kimi-K3-tiny/"


def _client(service, endpoint):
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION)


@pytest.fixture
def site(moto_endpoint):
    """A VPC with one GPU subnet and an S3 gateway endpoint, and an FSx for Lustre file
    system of 4.8 TiB at 1000 MB/s/TiB, in moto."""
    ec2, fsx = _client("ec2", moto_endpoint), _client("fsx", moto_endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24",
                               AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    fs = fsx.create_file_system(
        FileSystemType="LUSTRE", StorageCapacity=4800, SubnetIds=[subnet],
        LustreConfiguration={"DeploymentType": "PERSISTENT_2",
                             "PerUnitStorageThroughput": 1000})["FileSystem"]["FileSystemId"]
    # moto's IAM is the session's: a role name of this test's own
    return {"ec2": ec2, "fsx": fsx, "iam": _client("iam", moto_endpoint), "vpc": vpc,
            "subnet": subnet, "fs": fs, "role": f"{ROLE}-{uuid.uuid4().hex[:8]}"}


def _policy(site, **changes) -> InfrastructurePolicy:
    base = {"region": REGION, "subnet_ids": [site["subnet"]], "inference_role": site["role"],
            "warmup_hours": 2, "soak_hours": 24, "production_hours": 168,
            "max_load_seconds": 1800}
    return InfrastructurePolicy(**{**base, **changes})


def _fsx_release(published, fs_id):
    spec = serving_spec(load_profile("p6-b300-tp8"), verifier_image=VERIFIER,
                        storage=StorageTarget(fsx=FsxTarget(
                            file_system_id=fs_id, dns_name=f"{fs_id}.fsx.{REGION}.amazonaws.com",
                            mount_name="abcdefgh", mounted_at="/")))
    p = published
    return create_tuple(p.store, p.repo_id, p.commit, IMAGE, spec).release


def _s3_release(release):
    b = release.binding
    weights = WeightsRef(**{**b.weights.model_dump(), "location": WEIGHTS + b.weights.commit})
    resources = {**b.serving.resources, "storage": {"fsx": None, "s3_region": REGION}}
    binding = b.model_copy(update={"weights": weights, "serving": b.serving.model_copy(
        update={"resources": resources})})
    return release.model_copy(update={"binding": binding, "id": binding.tuple_id()})


def _role(site, statements):
    iam, role = site["iam"], site["role"]
    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "eks.amazonaws.com"}}]}))
    arn = iam.create_policy(PolicyName=f"{role}-weights", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": statements}))["Policy"]["Arn"]
    iam.attach_role_policy(RoleName=role, PolicyArn=arn)


def _reservation(**changes):
    if changes.get("EndDateType") == "unlimited":
        return {k: v for k, v in _reservation().items() if k != "EndDate"} | changes
    return {"CapacityReservationId": "cr-0123456789abcdef0", "InstanceType": "p6-b300.48xlarge",
            "AvailabilityZone": ZONE, "TotalInstanceCount": 2, "AvailableInstanceCount": 2,
            "State": "active", "EndDateType": "limited", "EndDate": NOW + timedelta(days=30),
            "InstancePlatform": "Linux/UNIX", "Tenancy": "default", **changes}


def _capacity(site, published, *reservations):
    ec2 = boto3.client("ec2", region_name=REGION)
    stubber = Stubber(ec2)
    stubber.add_response("describe_capacity_reservations",
                         {"CapacityReservations": list(reservations)},
                         {"Filters": [{"Name": "state", "Values": ["active"]}]})
    release = _fsx_release(published, site["fs"])
    res = serving_resources(release.binding.serving, "test")
    with stubber:
        out = checks.capacity(ec2, res, {ZONE}, _policy(site), NOW)
    stubber.assert_no_pending_responses()
    return out


def test_capacity_must_be_the_type_the_zone_and_the_window(site, published_revision):
    assert _capacity(site, published_revision, _reservation()).passed
    wrong_type = _capacity(site, published_revision, _reservation(InstanceType="p5.48xlarge"))
    assert not wrong_type.passed and "instance type p5.48xlarge, not p6-b300.48xlarge" in \
        wrong_type.reason
    wrong_zone = _capacity(site, published_revision, _reservation(AvailabilityZone="us-east-1b"))
    assert not wrong_zone.passed and "zone us-east-1b, not one of the subnets' us-east-1a" in \
        wrong_zone.reason
    short = _capacity(site, published_revision,
                      _reservation(EndDate=NOW + timedelta(hours=100)))
    assert not short.passed and "before the window ends" in short.reason and "194 h" in \
        short.reason
    # open-ended reservations last the window; nothing at all is named too
    assert _capacity(site, published_revision,
                     _reservation(EndDateType="unlimited")).passed is True
    none = _capacity(site, published_revision)
    assert not none.passed and "no active capacity reservation" in none.reason


def test_fsx_throughput_against_the_load_target(site, published_revision):
    release = _fsx_release(published_revision, site["fs"])
    res = serving_resources(release.binding.serving, "test")
    tb = 1_560_000_000_000
    ok = checks.storage_throughput(site["fsx"], release, res, tb, _policy(site))
    assert ok.passed and ok.evidence["throughput_mb_s"] == pytest.approx(4687.5)
    slow = checks.storage_throughput(site["fsx"], release, res, tb,
                                     _policy(site, max_load_seconds=300))
    assert not slow.passed and "< 5200 MB/s" in slow.reason


def test_iam_is_evaluated_not_linted(site, published_revision):
    release = _s3_release(_fsx_release(published_revision, site["fs"]))
    commit = release.binding.weights.commit
    own = f"arn:aws:s3:::k3a-releases/prod/models/moonshotai/Kimi-K3-tiny/{commit}/*"
    _role(site, [{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": own}])
    good = checks.iam_reads_only_its_weights(site["iam"], release, _policy(site))
    assert good.passed, good.reason
    # a wildcard over the repo reads every other revision too
    site["iam"].put_role_policy(RoleName=site["role"], PolicyName="broad", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:Get*",
                                                "Resource": "arn:aws:s3:::k3a-releases/*"}]}))
    broad = checks.iam_reads_only_its_weights(site["iam"], release, _policy(site))
    assert not broad.passed and f"may s3:GetObject arn:aws:s3:::k3a-releases/prod/models/" \
        f"moonshotai/Kimi-K3-tiny/{'0' * 40}" in broad.reason
    # an explicit deny outside the revision makes it narrow again; writes still refused
    site["iam"].put_role_policy(RoleName=site["role"], PolicyName="fence", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Deny", "Action": "s3:*", "NotResource": own},
            {"Effect": "Allow", "Action": "s3:PutObject", "Resource": own}]}))
    fenced = checks.iam_reads_only_its_weights(site["iam"], release, _policy(site))
    assert not fenced.passed and "may s3:PutObject" in fenced.reason
    assert "may s3:GetObject" not in fenced.reason


def test_s3_gateway_endpoint_on_the_clusters_vpc(site):
    missing = checks.private_networking(site["ec2"], {site["vpc"]}, REGION)
    assert not missing.passed and site["vpc"] in missing.reason
    site["ec2"].create_vpc_endpoint(VpcId=site["vpc"], VpcEndpointType="Gateway",
                                    ServiceName=f"com.amazonaws.{REGION}.s3")
    assert checks.private_networking(site["ec2"], {site["vpc"]}, REGION).passed


def _node(name, *, ready=True, gpus="8", itype="p6-b300.48xlarge"):
    return {"metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": itype}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "192"},
                                   "conditions": [{"type": "Ready",
                                                   "status": "True" if ready else "False"}]}}


@pytest.fixture
def kube(tmp_path):
    """A Kubernetes API on loopback that answers GET /api/v1/nodes for a bearer token."""
    state = {"nodes": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            if self.headers.get("Authorization") != "Bearer t0ken":
                self.send_response(401)
                self.end_headers()
                return
            if self.path != "/api/v1/nodes":
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps({"kind": "NodeList", "apiVersion": "v1",
                               "items": state["nodes"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "k3",
        "clusters": [{"name": "k3", "cluster": {
            "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "k3", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "k3", "context": {"cluster": "k3", "user": "k3"}}]}))
    yield config, state
    server.shutdown()
    server.server_close()


def test_node_health_through_the_kubernetes_api(kube, site, published_revision):
    config, state = kube
    res = serving_resources(_fsx_release(published_revision, site["fs"]).binding.serving, "t")
    state["nodes"] = [_node("gpu-a", gpus="4"), _node("gpu-b", ready=False),
                      _node("cpu-a", itype="m7i.8xlarge", gpus="0")]
    sick = checks.node_health(list_nodes(config), res)
    assert not sick.passed
    assert "gpu-a: 4 allocatable nvidia.com/gpu" in sick.reason and "gpu-b: not Ready" in \
        sick.reason
    state["nodes"].append(_node("gpu-c"))
    assert checks.node_health(list_nodes(config), res).passed


def test_preflight_feeds_the_infrastructure_gate(kube, site, published_revision, policies):
    config, state = kube
    state["nodes"] = [_node("gpu-c")]
    release = _fsx_release(published_revision, site["fs"])
    _role(site, [{"Effect": "Allow", "Action": "fsx:DescribeFileSystems",
                         "Resource": "*"}])
    site["ec2"].create_vpc_endpoint(VpcId=site["vpc"], VpcEndpointType="Gateway",
                                    ServiceName=f"com.amazonaws.{REGION}.s3")
    infra = _policy(site)
    gate_file = policies / "promotion-gates.yaml"
    doc = yaml.safe_load(gate_file.read_text())
    doc["channels"]["production"]["infrastructure"] = infra.model_dump()
    gate_file.write_text(yaml.safe_dump(doc))
    use_policy(published_revision.store, policies)

    def gate(now):
        return check_gate(published_revision.store, release, "production", "infrastructure",
                          now=now)

    assert "no preflight recorded" in gate(NOW).reason

    def preflight(*reservations, at=NOW):
        capacity = boto3.client("ec2", region_name=REGION)
        stubber = Stubber(capacity)
        stubber.add_response("describe_capacity_reservations",
                             {"CapacityReservations": list(reservations)})
        with stubber:
            report = run_preflight(
                release, "production", infra,
                AwsClients(ec2=site["ec2"], capacity=capacity, fsx=site["fsx"], iam=site["iam"]),
                nodes=lambda: list_nodes(config), total_bytes=1_560_000_000_000, now=at)
        record_preflight(published_revision.store, release.id, "production",
                         report.model_dump(mode="json"), by=person("ci"), now=at)
        return report

    bad = preflight(_reservation(AvailabilityZone="us-east-1c"))
    assert [c.name for c in bad.checks if not c.passed] == ["capacity"]
    verdict = gate(NOW)
    assert not verdict.passed and "capacity: cr-0123456789abcdef0: zone us-east-1c" in \
        verdict.reason
    good = preflight(_reservation(), at=NOW + timedelta(minutes=10))
    assert good.passed, [c.reason for c in good.checks if not c.passed]
    assert len(list_preflights(published_revision.store, release.id, "production")) == 2
    # the newest record decides
    assert gate(NOW + timedelta(hours=1)).passed
    stale = gate(NOW + timedelta(hours=30))
    assert not stale.passed and "29.8 h old (max 24 h)" in stale.reason


def test_policy_refuses_missing_settings():
    with pytest.raises(ValueError):
        InfrastructurePolicy(region="us-east-1", subnet_ids=[], inference_role=ROLE,
                             warmup_hours=1, soak_hours=1, production_hours=1,
                             max_load_seconds=60)


def test_cli_records_and_names_what_moto_cannot_answer(moto_endpoint, site, kube,
                                                       published_revision, policies, k3a_cmd,
                                                       k3a_env):
    """Through `k3a preflight` against moto: every check moto implements runs for real; the
    capacity check fails naming the call moto lacks, and the run is recorded all the same."""
    import subprocess

    config, state = kube
    state["nodes"] = [_node("gpu-c")]
    release = _fsx_release(published_revision, site["fs"])
    _role(site, [{"Effect": "Allow", "Action": "fsx:DescribeFileSystems", "Resource": "*"}])
    site["ec2"].create_vpc_endpoint(VpcId=site["vpc"], VpcEndpointType="Gateway",
                                    ServiceName=f"com.amazonaws.{REGION}.s3")
    gate_file = policies / "promotion-gates.yaml"
    doc = yaml.safe_load(gate_file.read_text())
    doc["channels"]["production"]["infrastructure"] = _policy(site).model_dump()
    gate_file.write_text(yaml.safe_dump(doc))
    use_policy(published_revision.store, policies)
    env = {**k3a_env, "AWS_ENDPOINT_URL": moto_endpoint}
    run = subprocess.run(
        [*k3a_cmd, "preflight", release.id, "--channel", "production", "--kubeconfig",
         str(config), "--json", "--store",
         published_revision.store.url],
        env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 5, run.stderr + run.stdout
    out = json.loads(run.stdout)
    verdicts = {c["name"]: c for c in out["report"]["checks"]}
    assert [n for n, c in verdicts.items() if not c["passed"]] == ["capacity"]
    assert "DescribeCapacityReservations" in verdicts["capacity"]["reason"]
    assert verdicts["storage_throughput"]["evidence"]["file_system"] == site["fs"]
    assert out["written"]
    assert len(list_preflights(published_revision.store, release.id, "production")) == 1
