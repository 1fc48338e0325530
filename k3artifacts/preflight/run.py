"""Run every preflight check for a tuple on a channel's infrastructure; each check runs even
when another failed, so one report names everything to fix."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from k3artifacts.policy.rollout import InfrastructurePolicy
from k3artifacts.preflight import checks
from k3artifacts.preflight.model import CheckOutcome, PreflightReport
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.profiles import serving_resources


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

