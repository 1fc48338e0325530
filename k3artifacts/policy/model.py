"""The gate policy's model: which gates a tuple must pass to move onto each channel, with each
gate's settings, where a typed actor name is accepted, and what ``k3a revision gc`` keeps.

Its text is ``promotion-gates.yaml``; the copy that judges is the store's policy record
(:mod:`k3artifacts.policy.record`), first seeded from the packaged ``policies/``. Humans edit
it, so every field is validated here, gate names against the registry
(:mod:`k3artifacts.policy.gates`), and a bad file is named in the error.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from k3artifacts.errors import ConfigError, plain_validation_errors
from k3artifacts.policy.gates import GATE_RULES
from k3artifacts.policy.rollout import ComparisonPolicy, InfrastructurePolicy, TrafficPolicy

GATES_FILE = "promotion-gates.yaml"

CHANNEL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LatencyPolicy(_Strict):
    """End-to-end p99 the sweep must meet at one concurrency level."""

    concurrency: int = Field(gt=0)
    max_e2e_p99_s: float = Field(gt=0)


class LatencyRegressionPolicy(ComparisonPolicy):
    """How an eval run's per-request latencies are compared with those of the latest run of
    the tuple now on the channel (:class:`ComparisonPolicy`), and how many a run draws."""

    #: Requests a run sends one at a time to sample latency, and the fewest a side the judge
    #: decides on (fewer: inconclusive).
    min_samples: int = Field(default=40, ge=8)
    #: An inconclusive comparison draws ``min_samples`` more, up to this many in all.
    max_samples: int = Field(default=160, ge=8)

    @model_validator(mode="after")
    def _bound(self) -> LatencyRegressionPolicy:
        if self.max_samples < self.min_samples:
            raise ValueError(f"max_samples ({self.max_samples}) is below min_samples "
                             f"({self.min_samples})")
        return self


class EvaluationPolicy(_Strict):
    min_pass_rate: float = Field(ge=0.0, le=1.0)
    #: Only reports of this suite count; None: any suite.
    suite: str | None = None
    #: The suite file (relative to the policies directory) a report must have run: its sha256
    #: is compared with the report's, so a report of an edited or other suite is refused.
    suite_file: str | None = None
    latency: LatencyPolicy | None = None
    #: No regression against the latest run of the tuple now on the channel: the pass rate
    #: may drop by at most this much (absolute), and the latency is judged by
    #: ``latency_regression``. None: no comparison at all.
    max_regression: float | None = Field(default=None, ge=0.0)
    latency_regression: LatencyRegressionPolicy = LatencyRegressionPolicy()
    #: A model's code runs only in a sandbox (bubblewrap); where none can be had, the suite's
    #: code cases are not run and the report names why. false: such a report never passes;
    #: true: it is judged on the cases that ran.
    allow_unsandboxed_code: bool = False


class OrderPolicy(_Strict):
    """The ``promotion_order`` gate: the tuple served ``after`` first, for a while."""

    #: The earlier channel the tuple must have been promoted to (e.g. ``staging``).
    after: str = Field(pattern=CHANNEL_NAME.pattern)
    #: How long it must have been there (from that promotion) before moving on.
    min_hours: float = Field(default=0.0, ge=0.0)
    #: Gates that must have passed, not been overridden, in that promotion's history entry.
    passed: list[str] = Field(default_factory=list)


class DutiesPolicy(_Strict):
    """The ``separation_of_duties`` gate: the promoter is not the one who reviewed."""

    #: Review kinds whose reviewers may not promote (``license``, ``code``).
    not_reviewer_of: list[Literal["license", "code"]] = Field(min_length=1)


class RetentionPolicy(_Strict):
    """What ``k3a revision gc`` keeps (each a default its flags override)."""

    #: The newest N published revisions of each repo, whatever their age.
    keep: int = Field(default=2, ge=1)
    #: Any revision published less than this many days ago.
    keep_days: float = Field(default=14.0, ge=0.0)
    #: The tuples of a channel's newest N history entries (the ones a rollback reaches for),
    #: besides its current pointer. A channel's own ``rollback_window`` wins.
    rollback_window: int = Field(default=10, ge=1)


class FreshnessPolicy(_Strict):
    """How long the store's signed freshness head holds (``policy/freshness.py``): once it
    is older, every reader refuses the store until it is re-signed (a move, or `k3a trust
    refresh`). Longer loosens."""

    lifetime_hours: float = Field(gt=0.0, le=24.0 * 366)


class WarmStartPolicy(_Strict):
    """Whether pods on this channel may start from a warm-start artifact (``k3artifacts.warm``)
    and what it must carry. The channel's release rule (``release_channels`` of the policy's
    ``identities.yaml``) already requires a trusted signature where it requires one for the
    tuple."""

    enabled: bool = True
    #: Ask for a trusted signature even where the channel's release rule does not.
    require_signature: bool = False


#: Evidence a gate reads, by kind, and the gate that reads it.
EVIDENCE_GATES: dict[str, str] = {"evaluation": "evaluation", "scan": "image_scan",
                                  "preflight": "infrastructure", "traffic": "traffic"}
EvidenceKind = Literal["evaluation", "scan", "preflight", "traffic"]


class EvidencePolicy(_Strict):
    """Who must have signed the evidence the evaluation, image_scan, infrastructure and traffic
    gates read, so that one stolen key does not carry them all. A gate counts an identity when
    that identity's own newest records of the kind pass it."""

    #: Per kind: how many distinct identities' records must each pass the kind's gate
    #: (default 1: the newest record, whoever signed it).
    signers: dict[EvidenceKind, int] = Field(default_factory=dict)
    #: Groups of kinds kept apart: the identities counted for the kinds of one group are none
    #: of those counted for another's (a service that evaluates and scans cannot also carry
    #: the preflight and the traffic analyses).
    apart: list[list[EvidenceKind]] = Field(default_factory=list)

    @field_validator("signers")
    @classmethod
    def _positive(cls, value: dict[str, int]) -> dict[str, int]:
        if any(n < 1 for n in value.values()):
            raise ValueError("evidence.signers: at least 1 identity per kind")
        return value

    @field_validator("apart")
    @classmethod
    def _groups(cls, value: list[list[str]]) -> list[list[str]]:
        kinds = [kind for group in value for kind in group]
        if len(set(kinds)) != len(kinds):
            raise ValueError("evidence.apart: a kind is in one group at most")
        if value and (len(value) < 2 or not all(value)):
            raise ValueError("evidence.apart: two groups or more, none empty")
        return value

    def kinds(self) -> list[str]:
        """Every kind this policy says something about, in the gates' order."""
        named = set(self.signers) | {kind for group in self.apart for kind in group}
        return [kind for kind in EVIDENCE_GATES if kind in named]


class ChannelPolicy(_Strict):
    gates: list[str]
    evaluation: EvaluationPolicy | None = None
    #: Serving targets (``hyperpod``, ``eks``) the ``renderable`` gate renders the tuple for.
    targets: list[str] = Field(default_factory=list)
    order: OrderPolicy | None = None
    duties: DutiesPolicy | None = None
    #: Canary steps, analysis window and bounds: the ``eks-rollout`` render and ``traffic`` gate.
    traffic: TrafficPolicy | None = None
    #: Capacity, storage, IAM, networking and nodes the ``infrastructure`` gate's preflight checks.
    infrastructure: InfrastructurePolicy | None = None
    #: History entries whose tuples `k3a revision gc` keeps for this channel (default: retention's).
    rollback_window: int | None = Field(default=None, ge=1)
    #: The rollback flow waits for a release engineer's approval before moving this channel
    #: back. Promotion through the flow always waits for one; a rollback is an incident
    #: response, so by default it does not.
    rollback_approval: bool = False
    #: Warm starts (compile caches bound to the tuple); absent: allowed, signed as the
    #: channel's release rule says.
    warm_start: WarmStartPolicy | None = None
    #: Who must have signed the evidence gates' records (absent: anyone the policy lets make
    #: them, one identity carrying them all). A kind whose gate the channel does not list is
    #: not judged.
    evidence: EvidencePolicy | None = None

    @model_validator(mode="after")
    def _evaluation_configured(self) -> ChannelPolicy:
        unknown = [name for name in self.gates if name not in GATE_RULES]
        if unknown:
            raise ValueError(f"unknown gate(s) {', '.join(map(repr, unknown))} "
                             f"(gates: {', '.join(GATE_RULES)})")
        if "evaluation" in self.gates and self.evaluation is None:
            raise ValueError("the evaluation gate needs `evaluation: {min_pass_rate: ...}`")
        if "renderable" in self.gates and not self.targets:
            raise ValueError("the renderable gate needs `targets: [hyperpod|eks, ...]`")
        if "promotion_order" in self.gates and self.order is None:
            raise ValueError("the promotion_order gate needs `order: {after: CHANNEL, ...}`")
        if "separation_of_duties" in self.gates and self.duties is None:
            raise ValueError(
                "the separation_of_duties gate needs `duties: {not_reviewer_of: [license]}`"
            )
        if "infrastructure" in self.gates and self.infrastructure is None:
            raise ValueError("the infrastructure gate needs `infrastructure: {region: ..., ...}`")
        if "traffic" in self.gates and self.traffic is None:
            raise ValueError("the traffic gate needs `traffic: {steps: [...], thresholds: ...}`")
        if len(set(self.gates)) != len(self.gates):
            raise ValueError("a gate is listed twice")
        return self


class IdentityPolicy(_Strict):
    """No longer read: who acts is the identity whose key signs (``policy/acting.py``), and a
    typed name (``--by``) is refused everywhere. Kept so policies that set it still parse (and
    changing it is still a change the root judges)."""

    claimed_actor_on_file_stores: bool = False


class UnsignedPolicy(_Strict):
    """Records older than signed records, until ``k3a trust migrate`` re-signs them
    (docs/policy-and-identity.md, "Records from before signing")."""

    #: Stores older than signed records (no root of trust in the store, none pinned here):
    #: read their unsigned policy and channel histories as found meanwhile (no move is made
    #: on them); false: refuse to read them.
    read_before_migration: bool = True
    #: Until this time, an evidence record written before records were signed (plain JSON: a
    #: review, an evaluation, a scan, a preflight, a traffic analysis, a single-node rollback
    #: record, a warm manifest) is read as it was written, its maker the name it carries. From
    #: then on, and always when unset, such a record is refused by name like any unsigned one:
    #: evidence decides moves, so it is never read unsigned by default. Approval requests and
    #: decisions are never read unsigned (ask again).
    read_evidence_before: datetime | None = None

    @field_validator("read_evidence_before")
    @classmethod
    def _zoned(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("give the time with its zone (2026-07-01T00:00:00Z)")
        return value


class GatePolicy(_Strict):
    schema_version: Literal[1] = 1
    identity: IdentityPolicy = IdentityPolicy()
    unsigned: UnsignedPolicy = UnsignedPolicy()
    retention: RetentionPolicy = RetentionPolicy()
    #: None (a policy written before freshness heads): a frozen copy of the store is not
    #: bounded for a client that never read it.
    freshness: FreshnessPolicy | None = None
    channels: dict[str, ChannelPolicy]

    @field_validator("channels")
    @classmethod
    def _names(cls, value: dict[str, ChannelPolicy]) -> dict[str, ChannelPolicy]:
        for name in value:
            if not CHANNEL_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid channel name")
        return value


def _load_yaml(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"policy file {path} does not exist",
            hint="name a directory holding promotion-gates.yaml (a copy of the packaged "
            "policies/, edited)",
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"policy file {path} is not valid YAML: {exc}") from None


def _validate(model: type[BaseModel], path: Path, data: object):  # type: ignore[no-untyped-def]
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ConfigError(
            f"policy file {path} is malformed: {plain_validation_errors(exc)}"
        ) from None


def load_gate_policy(policies_dir: Path) -> GatePolicy:
    path = Path(policies_dir) / GATES_FILE
    return _validate(GatePolicy, path, _load_yaml(path))
