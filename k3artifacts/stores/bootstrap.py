"""Bring a bucket to the settings under ``policies/s3``, idempotently, showing what differs.

Each setting is read live, compared with the rendered wanted value, and written only when they
differ, so a second run changes nothing and says so. Versioning is only ever set to
``Enabled``: suspending it would let an overwrite destroy a release's bytes.

The bucket policy is applied last: it denies guardrail changes to everyone but the admin role,
so settings applied before it land even when the operator is not (yet) that role.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import botocore.exceptions as bex

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import ConfigError, NotFound
from k3artifacts.stores.awsclients import aws_errors, error_code, http_status
from k3artifacts.stores.bucket_policies import BucketPolicyInputs, rendered
from k3artifacts.stores.capabilities import probe


def bucket_and_prefix(url: str) -> tuple[str, str]:
    """The bucket and the store's key prefix (no slashes) of ``s3://bucket[/prefix]``."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ConfigError(f"{url!r} is not an s3://bucket[/prefix] URL",
                          hint="write the bucket to set up as s3://bucket[/prefix]")
    return parsed.netloc, parsed.path.strip("/")


#: Order of application (policy last, see module doc).
SETTINGS = (
    "versioning",
    "encryption",
    "public_access_block",
    "ownership_controls",
    "lifecycle_rule",
    "logging",
    "policy",
)

_ABSENT_CODES = {
    "NoSuchBucketPolicy",
    "ServerSideEncryptionConfigurationNotFoundError",
    "NoSuchPublicAccessBlockConfiguration",
    "OwnershipControlsNotFoundError",
    "NoSuchLifecycleConfiguration",
}


@dataclass(frozen=True)
class Change:
    setting: str
    live: Any
    wanted: Any

    def diff(self) -> str:
        """A unified diff of live vs wanted, as pretty JSON."""
        def lines(value: Any) -> list[str]:
            if value is None:
                return ["(not set)\n"]
            text = json.dumps(value, indent=2, sort_keys=True)
            return [line + "\n" for line in text.splitlines()]

        return "".join(difflib.unified_diff(
            lines(self.live), lines(self.wanted),
            fromfile=f"live/{self.setting}", tofile=f"wanted/{self.setting}",
        ))


@dataclass
class BootstrapReport:
    bucket: str
    dry_run: bool
    created_bucket: bool = False
    changes: list[Change] = field(default_factory=list)
    #: Settings this run does not manage, with why.
    unmanaged: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "dry_run": self.dry_run,
            "created_bucket": self.created_bucket,
            "changed": [c.setting for c in self.changes],
            "applied": bool(self.changes) and not self.dry_run,
            "changes": [
                {"setting": c.setting, "live": c.live, "wanted": c.wanted, "diff": c.diff()}
                for c in self.changes
            ],
            "unmanaged": self.unmanaged,
        }


def wanted_settings(inputs: BucketPolicyInputs) -> dict[str, Any]:
    wanted = {
        "versioning": rendered("s3/versioning.json", inputs),
        "encryption": rendered("s3/encryption.json", inputs),
        "public_access_block": rendered("s3/public-access-block.json", inputs),
        "ownership_controls": rendered("s3/ownership-controls.json", inputs),
        "lifecycle_rule": {
            **rendered("s3/lifecycle-rule.json", inputs),
            # A number, not a template placeholder (those are substituted as text).
            "NoncurrentVersionExpiration": {"NoncurrentDays": inputs.noncurrent_days},
        },
        "policy": rendered("s3/bucket-policy.json", inputs),
    }
    if inputs.log_bucket is not None:
        wanted["logging"] = rendered("s3/logging.json", inputs)
    return wanted


def log_target_statement(inputs: BucketPolicyInputs) -> Any:
    """The statement the access-log bucket's policy needs (that bucket is not ours to edit)."""
    return rendered("s3/log-target-statement.json", inputs)


def _normalize_policy(value: Any) -> Any:
    """Policies compare by meaning: AWS may return a one-element list as a bare string and
    reorder list members, neither of which changes what the policy says."""
    if isinstance(value, dict):
        return {k: _normalize_policy(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        items = [_normalize_policy(v) for v in value]
        if len(items) == 1:
            return items[0]
        return sorted(items, key=lambda v: canonical_json(v))
    return value


def _project(live: Any, wanted: Any) -> Any:
    """``live`` restricted to the fields ``wanted`` names: services add defaults (e.g. an
    empty ``Filter``) that we neither set nor care about."""
    if isinstance(live, dict) and isinstance(wanted, dict):
        return {k: _project(live[k], wanted[k]) for k in wanted if k in live}
    if isinstance(live, list) and isinstance(wanted, list) and len(live) == len(wanted):
        return [_project(lv, wv) for lv, wv in zip(live, wanted, strict=True)]
    return live


class BucketSettings:
    """Reads and writes one bucket's settings through an S3 client."""

    def __init__(self, client: Any, bucket: str, expected_owner: str | None = None,
                 log_target_statement: Any = None):
        self.client = client
        self.bucket = bucket
        #: What the log bucket's policy must allow (shown when it does not).
        self.log_target_statement = log_target_statement
        #: Sent as ExpectedBucketOwner so a same-named bucket elsewhere is never configured.
        self.owner_args = {"ExpectedBucketOwner": expected_owner} if expected_owner else {}

    def _get(self, call: Callable[..., dict[str, Any]]) -> dict[str, Any] | None:
        try:
            return call(Bucket=self.bucket, **self.owner_args)
        except bex.ClientError as exc:
            if error_code(exc) in _ABSENT_CODES:
                return None
            raise

    def exists(self) -> bool:
        try:
            self.client.head_bucket(Bucket=self.bucket, **self.owner_args)
        except bex.ClientError as exc:
            if http_status(exc) == 404:
                return False
            raise
        return True

    def create(self, region: str) -> None:
        args: dict[str, Any] = {"Bucket": self.bucket}
        if region != "us-east-1":  # the one region that rejects an explicit constraint
            args["CreateBucketConfiguration"] = {"LocationConstraint": region}
        self.client.create_bucket(**args)

    def live(self, setting: str, wanted: Any) -> Any:
        c = self.client
        if setting == "versioning":
            resp = self._get(c.get_bucket_versioning) or {}
            return {"Status": resp.get("Status", "Disabled")}
        if setting == "encryption":
            resp = self._get(c.get_bucket_encryption)
            return None if resp is None else resp["ServerSideEncryptionConfiguration"]
        if setting == "public_access_block":
            resp = self._get(c.get_public_access_block)
            return None if resp is None else resp["PublicAccessBlockConfiguration"]
        if setting == "ownership_controls":
            resp = self._get(c.get_bucket_ownership_controls)
            return None if resp is None else resp["OwnershipControls"]
        if setting == "lifecycle_rule":
            return next((r for r in self._lifecycle_rules() if r.get("ID") == wanted["ID"]), None)
        if setting == "logging":
            resp = self._get(c.get_bucket_logging) or {}
            return resp.get("LoggingEnabled")
        if setting == "policy":
            resp = self._get(c.get_bucket_policy)
            return None if resp is None else json.loads(resp["Policy"])
        raise ValueError(setting)

    def _lifecycle_rules(self) -> list[dict[str, Any]]:
        resp = self._get(self.client.get_bucket_lifecycle_configuration)
        return [] if resp is None else list(resp.get("Rules", []))

    def same(self, setting: str, live: Any, wanted: Any) -> bool:
        if live is None:
            return False
        if setting == "policy":
            return _normalize_policy(live) == _normalize_policy(wanted)
        return _project(live, wanted) == wanted

    def apply(self, setting: str, wanted: Any) -> None:
        c, args = self.client, {"Bucket": self.bucket, **self.owner_args}
        if setting == "versioning":
            assert wanted == {"Status": "Enabled"}, "versioning is never suspended"
            c.put_bucket_versioning(VersioningConfiguration=wanted, **args)
        elif setting == "encryption":
            c.put_bucket_encryption(ServerSideEncryptionConfiguration=wanted, **args)
        elif setting == "public_access_block":
            c.put_public_access_block(PublicAccessBlockConfiguration=wanted, **args)
        elif setting == "ownership_controls":
            c.put_bucket_ownership_controls(OwnershipControls=wanted, **args)
        elif setting == "lifecycle_rule":
            # Rules other people added stay; only ours is replaced.
            others = [r for r in self._lifecycle_rules() if r.get("ID") != wanted["ID"]]
            c.put_bucket_lifecycle_configuration(
                LifecycleConfiguration={"Rules": [*others, wanted]}, **args
            )
        elif setting == "logging":
            try:
                c.put_bucket_logging(BucketLoggingStatus={"LoggingEnabled": wanted}, **args)
            except bex.ClientError as exc:
                if error_code(exc) != "InvalidTargetBucketForLogging":
                    raise
                raise ConfigError(
                    f"s3://{wanted['TargetBucket']} does not accept access logs from "
                    f"s3://{self.bucket}",
                    hint="add this statement to the log bucket's policy, then re-run: "
                    + json.dumps(self.log_target_statement),
                ) from None
        elif setting == "policy":
            c.put_bucket_policy(Policy=json.dumps(wanted), **args)
        else:
            raise ValueError(setting)


def plan(settings: BucketSettings, wanted: dict[str, Any]) -> list[Change]:
    changes = []
    for name in SETTINGS:
        if name not in wanted:
            continue
        live = settings.live(name, wanted[name])
        if settings.same(name, live, wanted[name]):
            continue
        shown = live if name == "policy" or live is None else _project(live, wanted[name])
        changes.append(Change(name, shown, wanted[name]))
    return changes


def _probe(client: Any, inputs: BucketPolicyInputs, report: BootstrapReport) -> None:
    try:
        probe(client, inputs.bucket, inputs.prefix)
    except ConfigError as exc:
        cause = exc.__cause__
        if not (isinstance(cause, bex.ClientError) and http_status(cause) == 403):
            raise
        # The guardrails already set deny this principal the scratch write (say, plain HTTP):
        # the store probes again, with the writer's own credentials, before its first record.
        report.unmanaged["conditional_writes"] = f"not probed by bootstrap: {exc}"


def bootstrap(
    client: Any, inputs: BucketPolicyInputs, *, dry_run: bool = False,
    create_bucket: bool = False,
) -> BootstrapReport:
    """Plan (and unless ``dry_run``, apply) the bucket settings for ``inputs``."""
    report = BootstrapReport(bucket=inputs.bucket, dry_run=dry_run)
    settings = BucketSettings(client, inputs.bucket, inputs.account_id,
                              log_target_statement(inputs))
    if inputs.log_bucket is None:
        report.unmanaged["logging"] = "no --log-bucket given; access logging left as it is"
    wanted = wanted_settings(inputs)
    with aws_errors(f"bootstrapping s3://{inputs.bucket}"):
        if not settings.exists():
            if not create_bucket:
                raise NotFound(
                    f"bucket s3://{inputs.bucket} does not exist (or is not owned by account "
                    f"{inputs.account_id})",
                    hint="create it first, or pass --create-bucket",
                )
            if dry_run:
                report.created_bucket = True
                report.changes = [Change(n, None, wanted[n]) for n in SETTINGS if n in wanted]
                return report
            settings.create(inputs.region)
            report.created_bucket = True
        if not dry_run:
            # A bucket our records cannot rely on is refused here, not at the first promotion,
            # and before its guardrails are set (nothing to undo).
            _probe(client, inputs, report)
        report.changes = plan(settings, wanted)
        if not dry_run:
            for change in report.changes:
                settings.apply(change.setting, change.wanted)
    return report
