"""The preflight's checks, one function each, every one returning its outcome with evidence.
AWS answers through boto3 clients the caller builds; an AWS error fails the check it belongs
to, naming the call, and the other checks still run."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from k3artifacts.errors import BadAnswer, K3AError
from k3artifacts.policy.rollout import InfrastructurePolicy
from k3artifacts.preflight.iam_eval import allowed
from k3artifacts.preflight.model import CheckOutcome
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.profiles import ServingResources
from k3artifacts.stores.registry import weights_placement

GPU = "nvidia.com/gpu"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def guarded(name: str, run: Callable[[], CheckOutcome], calls: str = "") -> CheckOutcome:
    """``run()``, or a failed outcome naming what went wrong; ``calls``: the AWS/Kubernetes
    calls the check makes, named when an answer cannot even be parsed (an endpoint that does
    not implement the call answers HTML)."""
    try:
        return run()
    except ResponseParserError as exc:
        first = str(exc).splitlines()[0]
        return CheckOutcome(name=name, passed=False,
                            reason=f"{calls or name}: the answer is not AWS's: {first}",
                            evidence={"calls": calls})
    except ClientError as exc:
        op = exc.operation_name
        code = exc.response.get("Error", {}).get("Code", "")
        return CheckOutcome(name=name, passed=False, reason=f"AWS {op} failed: {code}: {exc}",
                            evidence={"call": op, "error": code})
    except (BotoCoreError, K3AError) as exc:
        return CheckOutcome(name=name, passed=False, reason=str(exc), evidence={})


def subnets(ec2: Any, ids: list[str]) -> tuple[set[str], set[str]]:
    """(availability zones, VPC ids) of the cluster's subnets."""
    found = ec2.describe_subnets(SubnetIds=ids)["Subnets"]
    return {s["AvailabilityZone"] for s in found}, {s["VpcId"] for s in found}


def capacity(ec2: Any, res: ServingResources, zones: set[str], policy: InfrastructurePolicy,
             now: datetime) -> CheckOutcome:
    """An active EC2 capacity reservation of exactly the profile's instance type, in a zone of
    the subnets, lasting the whole window, with instances for every replica's nodes."""
    want_type = res.node_instance_type
    need = res.nodes * res.replicas
    until = now + timedelta(hours=policy.window_hours)
    reservations = []
    paginator = ec2.get_paginator("describe_capacity_reservations")
    for page in paginator.paginate(Filters=[{"Name": "state", "Values": ["active"]}]):
        reservations += page["CapacityReservations"]
    seen, problems = [], []
    for r in reservations:
        rid = r["CapacityReservationId"]
        why = []
        if r["InstanceType"] != want_type:
            why.append(f"instance type {r['InstanceType']}, not {want_type}")
        if r["AvailabilityZone"] not in zones:
            why.append(f"zone {r['AvailabilityZone']}, not one of the subnets' "
                       f"{', '.join(sorted(zones))}")
        end = r.get("EndDate")
        if r.get("EndDateType") == "limited" and end is not None and end < until:
            why.append(f"ends {end:%Y-%m-%dT%H:%M:%SZ}, before the window ends "
                       f"{until:%Y-%m-%dT%H:%M:%SZ} ({policy.window_hours:g} h)")
        if int(r.get("TotalInstanceCount", 0)) < need:
            why.append(f"{r.get('TotalInstanceCount', 0)} instances, {need} needed")
        seen.append({"id": rid, "instance_type": r["InstanceType"],
                     "zone": r["AvailabilityZone"], "instances": r.get("TotalInstanceCount"),
                     "end": end.isoformat() if end else None})
        if not why:
            return CheckOutcome(name="capacity", passed=True,
                                reason=f"{rid}: {need} x {want_type} in {r['AvailabilityZone']} "
                                f"through {until:%Y-%m-%dT%H:%M:%SZ}",
                                evidence={"reservation": seen[-1], "needed": need})
        problems.append(f"{rid}: " + "; ".join(why))
    reason = ("; ".join(problems) if problems
              else f"no active capacity reservation (wanted {need} x {want_type})")
    return CheckOutcome(name="capacity", passed=False, reason=reason,
                        evidence={"reservations": seen, "needed": need,
                                  "window_ends": until.isoformat()})


def storage_throughput(fsx: Any, release: ReleaseTuple, res: ServingResources,
                       total_bytes: int, policy: InfrastructurePolicy) -> CheckOutcome:
    """FSx for Lustre: per-unit throughput x capacity reads the checkpoint within the load
    target. Weights in a bucket (what the store says of their placement) reach vLLM from the
    node's NVMe cache (k3a pull), not from the bucket."""
    need_mbps = total_bytes / policy.max_load_seconds / 1e6
    target = res.storage.fsx
    if target is None:
        weights = release.binding.weights
        where = weights.location
        if weights_placement(where, weights.repo_id, weights.commit).bucket is not None:
            return CheckOutcome(
                name="storage_throughput", passed=True,
                reason=f"weights in S3 are served from the node cache (k3a pull before vLLM); "
                f"{need_mbps:.0f} MB/s to load in {policy.max_load_seconds} s is read from "
                "local NVMe", evidence={"location": where, "needed_mb_s": need_mbps})
        return CheckOutcome(name="storage_throughput", passed=False,
                            reason=f"weights at {where} are on no FSx file system the tuple "
                            "names", evidence={"location": where})
    (fs,) = fsx.describe_file_systems(FileSystemIds=[target.file_system_id])["FileSystems"]
    lustre = fs.get("LustreConfiguration") or {}
    per_unit = lustre.get("PerUnitStorageThroughput")
    evidence = {"file_system": target.file_system_id, "type": fs.get("FileSystemType"),
                "storage_gib": fs.get("StorageCapacity"), "per_unit_mb_s_tib": per_unit,
                "needed_mb_s": round(need_mbps, 1)}
    if fs.get("FileSystemType") != "LUSTRE" or not per_unit:
        return CheckOutcome(name="storage_throughput", passed=False,
                            reason=f"{target.file_system_id} reports no Lustre per-unit "
                            "throughput", evidence=evidence)
    have = per_unit * fs["StorageCapacity"] / 1024
    evidence["throughput_mb_s"] = round(have, 1)
    ok = have >= need_mbps
    return CheckOutcome(
        name="storage_throughput", passed=ok, evidence=evidence,
        reason=f"{target.file_system_id}: {per_unit} MB/s/TiB x {fs['StorageCapacity']} GiB = "
        f"{have:.0f} MB/s {'>=' if ok else '<'} {need_mbps:.0f} MB/s to read "
        f"{total_bytes / 1e9:.1f} GB in {policy.max_load_seconds} s")


def _role_documents(iam: Any, role: str) -> tuple[list[dict], list[str]]:
    docs, names = [], []
    for page in iam.get_paginator("list_attached_role_policies").paginate(RoleName=role):
        for p in page["AttachedPolicies"]:
            version = iam.get_policy(PolicyArn=p["PolicyArn"])["Policy"]["DefaultVersionId"]
            docs.append(iam.get_policy_version(PolicyArn=p["PolicyArn"], VersionId=version)[
                "PolicyVersion"]["Document"])
            names.append(p["PolicyArn"])
    for page in iam.get_paginator("list_role_policies").paginate(RoleName=role):
        for name in page["PolicyNames"]:
            docs.append(iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"])
            names.append(f"inline:{name}")
    return docs, names


def iam_reads_only_its_weights(iam: Any, release: ReleaseTuple,
                               policy: InfrastructurePolicy) -> CheckOutcome:
    """The inference role's policies, evaluated: it reads the tuple's revision, and neither
    reads another revision or bucket nor writes anywhere in the store."""
    docs, names = _role_documents(iam, policy.inference_role)
    w = release.binding.weights
    placed = weights_placement(w.location, w.repo_id, w.commit)
    must_allow, must_deny = [], []
    if placed.bucket is not None:
        root = "/".join(p for p in (placed.bucket, placed.s3_prefix) if p)
        revision = f"{root}/{placed.revision_path}"
        own = f"arn:aws:s3:::{revision}/config.json"
        sibling = f"arn:aws:s3:::{revision.rsplit('/', 1)[0]}/{'0' * 40}/config.json"
        must_allow.append(("s3:GetObject", own))
        must_deny += [("s3:GetObject", sibling),
                      ("s3:GetObject", f"arn:aws:s3:::{root}/releases/channels/x.json"),
                      ("s3:GetObject", "arn:aws:s3:::k3a-preflight-other-bucket/x"),
                      ("s3:PutObject", own), ("s3:DeleteObject", own)]
    else:
        # FSx: the pod reads through its mount; the role must grant no S3 reads at large.
        must_deny += [("s3:GetObject", "arn:aws:s3:::k3a-preflight-other-bucket/x"),
                      ("s3:PutObject", "arn:aws:s3:::k3a-preflight-other-bucket/x")]
    wrong = [f"cannot {a} {r}" for a, r in must_allow if not allowed(docs, a, r)]
    wrong += [f"may {a} {r}" for a, r in must_deny if allowed(docs, a, r)]
    evidence = {"role": policy.inference_role, "policies": names,
                "allowed": [f"{a} {r}" for a, r in must_allow],
                "denied": [f"{a} {r}" for a, r in must_deny]}
    if wrong:
        return CheckOutcome(name="iam", passed=False, evidence=evidence,
                            reason=f"role {policy.inference_role}: " + "; ".join(wrong))
    return CheckOutcome(name="iam", passed=True, evidence=evidence,
                        reason=f"role {policy.inference_role} reads {w.repo_id}@{w.commit[:12]} "
                        f"and nothing else of the store ({len(docs)} policies evaluated)")


def private_networking(ec2: Any, vpcs: set[str], region: str) -> CheckOutcome:
    """An S3 gateway endpoint, available, on the cluster's VPC: weights never cross the NAT."""
    service = f"com.amazonaws.{region}.s3"
    found = ec2.describe_vpc_endpoints(Filters=[
        {"Name": "vpc-id", "Values": sorted(vpcs)},
        {"Name": "service-name", "Values": [service]},
    ])["VpcEndpoints"]
    gateways = [e for e in found if e.get("VpcEndpointType") == "Gateway"
                and e.get("State", "").lower() == "available"]
    evidence = {"vpcs": sorted(vpcs), "service": service,
                "endpoints": [{"id": e["VpcEndpointId"], "type": e.get("VpcEndpointType"),
                               "state": e.get("State"), "vpc": e.get("VpcId")} for e in found]}
    missing = sorted(vpcs - {e["VpcId"] for e in gateways})
    if missing:
        return CheckOutcome(name="private_networking", passed=False, evidence=evidence,
                            reason=f"no available S3 gateway endpoint ({service}) on "
                            f"{', '.join(missing)}")
    return CheckOutcome(name="private_networking", passed=True, evidence=evidence,
                        reason=f"S3 gateway endpoint {gateways[0]['VpcEndpointId']} on "
                        f"{', '.join(sorted(vpcs))}")


#: More GPUs than any node has: an allocatable count above this is not a count.
MAX_GPUS_PER_NODE = 1024
_COUNT = re.compile(r"^[0-9]{1,4}$")


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadAnswer(f"Kubernetes API: {what} is {str(value)[:60]!r}, not an object")
    return value


def _node_entry(item: Any, index: int, want: str) -> dict[str, Any] | None:
    """One NodeList item, each field checked, or None when it is not of the instance type
    ``want``: an answer that is not a node is refused naming it, never half-read."""
    node = _object(item, f"node {index}")
    meta, status = _object(node.get("metadata"), f"node {index}'s metadata"), \
        _object(node.get("status"), f"node {index}'s status")
    name = meta.get("name")
    if not isinstance(name, str):
        raise BadAnswer(f"Kubernetes API: node {index} has no name")
    if _object(meta.get("labels"), f"node {name}'s labels").get(INSTANCE_TYPE_LABEL) != want:
        return None
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list) or not all(isinstance(c, dict) for c in conditions):
        raise BadAnswer(f"Kubernetes API: node {name}'s conditions are not a list of objects")
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    raw = _object(status.get("allocatable"), f"node {name}'s allocatable").get(GPU, "0")
    # Kubernetes writes an extended resource as a whole-number quantity ("8"); "8.5k", "1e3"
    # or a count beyond any node is not a number of GPUs.
    text = str(raw) if isinstance(raw, str | int) and not isinstance(raw, bool) else ""
    if not _COUNT.match(text) or int(text) > MAX_GPUS_PER_NODE:
        raise BadAnswer(f"Kubernetes API: node {name}'s allocatable {GPU} is "
                        f"{str(raw)[:40]!r}, not a whole number of GPUs")
    spec = _object(node.get("spec"), f"node {name}'s spec")
    return {"name": name, "ready": ready, "gpus": int(text),
            "unschedulable": spec.get("unschedulable") is True}


def node_health(nodes: list[Any], res: ServingResources) -> CheckOutcome:
    want = res.node_instance_type
    need = res.nodes * res.replicas
    fit, unfit = [], []
    for index, item in enumerate(nodes):
        entry = _node_entry(item, index, want)
        if entry is None:
            continue
        ok = entry["ready"] and entry["gpus"] >= res.gpus_per_node and not entry["unschedulable"]
        (fit if ok else unfit).append(entry)
    evidence = {"instance_type": want, "needed": need, "gpus_per_node": res.gpus_per_node,
                "fit": fit, "unfit": unfit}
    if len(fit) < need:
        detail = "; ".join(f"{n['name']}: " + ", ".join(
            [*([] if n["ready"] else ["not Ready"]),
             *([] if n["gpus"] >= res.gpus_per_node else [f"{n['gpus']} allocatable {GPU}"]),
             *(["cordoned"] if n["unschedulable"] else [])]) for n in unfit)
        return CheckOutcome(name="node_health", passed=False, evidence=evidence,
                            reason=f"{len(fit)} Ready {want} node(s) with {res.gpus_per_node} "
                            f"allocatable {GPU}, {need} needed" + (f" ({detail})" if detail
                                                                   else ""))
    return CheckOutcome(name="node_health", passed=True, evidence=evidence,
                        reason=f"{len(fit)} Ready {want} node(s) with >= {res.gpus_per_node} "
                        f"allocatable {GPU} ({need} needed)")
