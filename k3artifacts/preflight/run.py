"""``k3a preflight``, planned, then checked and recorded: every preflight check for a tuple on
a channel's infrastructure; each check runs even when another failed, so one report names
everything to fix.

The plan checks who runs it may sign preflights (role ``preflight``), reads the channel's
``infrastructure:`` policy from the store's policy, the tuple and its manifest's size; a
refusal there asks neither AWS nor the cluster anything. The act reads AWS (in the policy's
region) and the cluster's nodes, and records the report create-once, signed, for the
``infrastructure`` gate (``releases/preflights.py``), pass or fail."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from k3artifacts.policy.actor import Acting
from k3artifacts.policy.record import channel_section
from k3artifacts.policy.rollout import InfrastructurePolicy
from k3artifacts.policy.signed import require_role
from k3artifacts.preflight import checks
from k3artifacts.preflight.kube import list_nodes
from k3artifacts.preflight.model import CheckOutcome, PreflightReport
from k3artifacts.releases.lookup import resolve_tuple
from k3artifacts.releases.preflights import PreflightRecord, record_preflight
from k3artifacts.releases.tuples import ReleaseTuple, tuple_manifest
from k3artifacts.serving.profiles import serving_resources
from k3artifacts.stores.awsclients import client
from k3artifacts.stores.base import Store


@dataclass(frozen=True)
class AwsClients:
    """boto3 clients in the policy's region. ``capacity`` answers
    DescribeCapacityReservations (the same EC2 client in production)."""

    ec2: Any
    capacity: Any
    fsx: Any
    iam: Any


def run_preflight(
    release: ReleaseTuple,
    channel: str,
    policy: InfrastructurePolicy,
    aws: AwsClients,
    *,
    nodes: Callable[[], list[dict[str, Any]]],
    total_bytes: int,
    now: datetime,
) -> PreflightReport:
    res = serving_resources(release.binding.serving, f"tuple {release.id}")
    located: dict[str, set[str]] = {}

    def subnets() -> CheckOutcome:
        located["zones"], located["vpcs"] = checks.subnets(aws.ec2, policy.subnet_ids)
        return CheckOutcome(name="capacity", passed=True, reason="", evidence={})

    # Capacity and networking are judged where the subnets are: if they cannot be read,
    # both checks fail with that reason.
    subnet_failure = checks.guarded("capacity", subnets, "EC2 DescribeSubnets")
    subnet_failure = None if subnet_failure.passed else subnet_failure
    zones, vpcs = located.get("zones", set()), located.get("vpcs", set())

    def needs_subnets(name: str, run: Callable[[], CheckOutcome], calls: str) -> CheckOutcome:
        if subnet_failure is not None:
            return subnet_failure.model_copy(update={"name": name})
        return checks.guarded(name, run, calls)

    outcomes = [
        needs_subnets("capacity", lambda: checks.capacity(aws.capacity, res, zones, policy, now),
                      "EC2 DescribeCapacityReservations"),
        checks.guarded("storage_throughput", lambda: checks.storage_throughput(
            aws.fsx, release, res, total_bytes, policy), "FSx DescribeFileSystems"),
        checks.guarded("iam", lambda: checks.iam_reads_only_its_weights(aws.iam, release,
                                                                        policy),
                       "IAM ListAttachedRolePolicies/GetPolicyVersion/GetRolePolicy"),
        needs_subnets("private_networking",
                      lambda: checks.private_networking(aws.ec2, vpcs, policy.region),
                      "EC2 DescribeVpcEndpoints"),
        checks.guarded("node_health", lambda: checks.node_health(nodes(), res)),
    ]
    return PreflightReport(tuple_id=release.id, channel=channel, at=now, policy=policy,
                           checks=outcomes)



@dataclass(frozen=True)
class PreflightPlan:
    release: ReleaseTuple
    channel: str
    policy: InfrastructurePolicy
    #: The checkpoint's size, from the tuple's manifest (what storage must load in time).
    total_bytes: int
    kubeconfig: Path | None
    aws_profile: str | None
    by: Acting
    now: datetime


@dataclass(frozen=True)
class Preflighted:
    report: PreflightReport
    record: PreflightRecord
    written: bool


def plan_preflight(store: Store, tuple_or_channel: str, channel: str, *,
                   kubeconfig: Path | None, aws_profile: str | None, by: Acting,
                   now: datetime | None = None) -> PreflightPlan:
    """RoleRefused (exit 9) for a runner without the role ``preflight``; ConfigError (exit 9)
    when the store's policy gives ``channel`` no infrastructure section; NotFound (exit 7) for
    an unknown tuple or a revision not in the store."""
    require_role(by, "preflight", "a preflight")
    infrastructure: InfrastructurePolicy = channel_section(
        store, channel, "infrastructure", "{region: ..., subnet_ids: [...], ...}")
    release = resolve_tuple(store, tuple_or_channel)
    return PreflightPlan(release=release, channel=channel, policy=infrastructure,
                         total_bytes=tuple_manifest(store, release).total_bytes,
                         kubeconfig=kubeconfig, aws_profile=aws_profile, by=by,
                         now=now or datetime.now(UTC))


def act_preflight(store: Store, plan: PreflightPlan) -> Preflighted:
    region, profile = plan.policy.region, plan.aws_profile
    ec2 = client("ec2", profile=profile, region=region)
    kubeconfig = plan.kubeconfig

    def nodes() -> list[dict[str, Any]]:
        # No kubeconfig: the pod's own service account (in-cluster), as kubectl would.
        return list_nodes(kubeconfig)

    report = run_preflight(
        plan.release, plan.channel, plan.policy,
        AwsClients(ec2=ec2, capacity=ec2, fsx=client("fsx", profile=profile, region=region),
                   iam=client("iam", profile=profile, region=region)),
        nodes=nodes, total_bytes=plan.total_bytes, now=plan.now)
    record, written = record_preflight(store, plan.release.id, plan.channel,
                                       report.model_dump(mode="json"), by=plan.by)
    return Preflighted(report, record, written)


def preflight(store: Store, tuple_or_channel: str, channel: str, *, kubeconfig: Path | None,
              aws_profile: str | None, by: Acting, now: datetime | None = None) -> Preflighted:
    """The preflight move: :func:`plan_preflight`, then :func:`act_preflight`."""
    return act_preflight(store, plan_preflight(store, tuple_or_channel, channel,
                                               kubeconfig=kubeconfig, aws_profile=aws_profile,
                                               by=by, now=now))
