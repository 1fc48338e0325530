"""The bucket and IAM policy JSON under ``policies/s3`` and ``policies/iam``, rendered for one
bucket (the promotion-gate policy is the store's: ``k3artifacts.policy``).

The files are data with ``{{name}}`` placeholders; this module fills them in. A string that is
exactly ``{{name}}`` whose value is a list becomes that list (e.g. the reader role ARNs of a
condition); anywhere else values are substituted as text. An unknown placeholder is an error,
so a typo in a policy file cannot ship as a literal ``{{...}}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3artifacts.bundled import POLICIES
from k3artifacts.errors import ConfigError
from k3artifacts.settings import default_policies_dir

IAM_ROLES = ("downloader", "promoter", "inference")

_PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")
_ROLE_ARN = re.compile(r"^arn:(aws[a-z-]*):iam::(\d{12}):role/[\w+=,.@/*-]+$")
_KMS_KEY_ARN = re.compile(r"^arn:(aws[a-z-]*):kms:([a-z0-9-]+):(\d{12}):key/[0-9a-zA-Z-]+$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def policies_dir() -> Path:
    """Where the ``s3/`` and ``iam/`` templates are: ``$K3A_POLICIES`` (or ``./policies``) when
    it holds them, else the templates shipped in the package."""
    for path in (default_policies_dir(), POLICIES):
        if (path / "s3").is_dir() and (path / "iam").is_dir():
            return path
    raise ConfigError(
        "bucket and IAM policy templates (policies/s3, policies/iam) not found",
        hint="set K3A_POLICIES to the policies/ directory of a k3artifacts checkout",
    )


def role_arn(value: str, what: str) -> str:
    if not _ROLE_ARN.match(value):
        raise ConfigError(
            f"{what} {value!r} is not an IAM role ARN",
            hint="write arn:aws:iam::<12-digit account>:role/<name>",
        )
    return value


@dataclass(frozen=True)
class BucketPolicyInputs:
    """Everything the templates need for one bucket."""

    bucket: str
    #: Store prefix without slashes ("" for the bucket root).
    prefix: str
    admin_role_arn: str
    inference_role_arn: str
    kms_key_arn: str
    downloader_role_arn: str | None = None
    promoter_role_arn: str | None = None
    #: More principals allowed to read models/ and releases/ (ArnLike patterns), e.g. the
    #: service-linked role FSx for Lustre uses to import from the bucket.
    extra_reader_arns: tuple[str, ...] = ()
    log_bucket: str | None = None
    log_prefix: str | None = None
    #: Days a noncurrent object version (left by `k3a revision gc` deleting a revision, or by an
    #: overwrite) is kept before the lifecycle rule expires it.
    noncurrent_days: int = 30

    def __post_init__(self) -> None:
        if not _BUCKET.match(self.bucket):
            raise ConfigError(f"{self.bucket!r} is not a valid S3 bucket name")
        role_arn(self.admin_role_arn, "--admin-role-arn")
        role_arn(self.inference_role_arn, "--inference-role-arn")
        for value, what in ((self.downloader_role_arn, "--downloader-role-arn"),
                            (self.promoter_role_arn, "--promoter-role-arn")):
            if value is not None:
                role_arn(value, what)
        if not _KMS_KEY_ARN.match(self.kms_key_arn):
            raise ConfigError(
                f"--kms-key-arn {self.kms_key_arn!r} is not a KMS key ARN",
                hint="write arn:aws:kms:<region>:<account>:key/<key id> (not an alias)",
            )
        if self.log_bucket is not None and not _BUCKET.match(self.log_bucket):
            raise ConfigError(f"--log-bucket {self.log_bucket!r} is not a valid bucket name")

    @property
    def account_id(self) -> str:
        """The bucket owner's account: the admin role's."""
        return _ROLE_ARN.match(self.admin_role_arn).group(2)  # type: ignore[union-attr]

    @property
    def partition(self) -> str:
        return _ROLE_ARN.match(self.admin_role_arn).group(1)  # type: ignore[union-attr]

    @property
    def region(self) -> str:
        """The bucket's region: a bucket's SSE-KMS key must live in the bucket's region."""
        return _KMS_KEY_ARN.match(self.kms_key_arn).group(2)  # type: ignore[union-attr]

    @property
    def reader_role_arns(self) -> list[str]:
        """Who may read models/ and releases/: serving, plus the pipeline roles that must
        (dedup copies and gate checks read manifests), plus the admin."""
        readers = [self.inference_role_arn, self.admin_role_arn]
        readers += [a for a in (self.downloader_role_arn, self.promoter_role_arn) if a]
        readers += list(self.extra_reader_arns)
        return list(dict.fromkeys(readers))

    def values(self) -> dict[str, Any]:
        prefix = self.prefix.strip("/")
        log_prefix = self.log_prefix
        if log_prefix is None:
            log_prefix = f"{self.bucket}/{prefix + '/' if prefix else ''}"
        return {
            "partition": self.partition,
            "account_id": self.account_id,
            "region": self.region,
            "bucket": self.bucket,
            "prefix": f"{prefix}/" if prefix else "",
            "admin_role_arn": self.admin_role_arn,
            "inference_role_arn": self.inference_role_arn,
            "reader_role_arns": self.reader_role_arns,
            "kms_key_arn": self.kms_key_arn,
            "log_bucket": self.log_bucket or "",
            "log_prefix": log_prefix,
        }


def render(template: Any, values: dict[str, Any]) -> Any:
    if isinstance(template, dict):
        return {k: render(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [render(v, values) for v in template]
    if not isinstance(template, str):
        return template
    whole = _PLACEHOLDER.fullmatch(template)
    if whole and isinstance(values.get(whole.group(1)), list):
        return list(values[whole.group(1)])

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ConfigError(f"policy template uses unknown placeholder {{{{{name}}}}}")
        value = values[name]
        if isinstance(value, list):
            raise ConfigError(f"placeholder {{{{{name}}}}} is a list; use it as a whole string")
        return str(value)

    return _PLACEHOLDER.sub(substitute, template)


def load_template(relpath: str) -> Any:
    path = policies_dir() / relpath
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read policy template {path}: {exc}") from None


def rendered(relpath: str, inputs: BucketPolicyInputs) -> Any:
    return render(load_template(relpath), inputs.values())


def iam_policies(inputs: BucketPolicyInputs) -> dict[str, Any]:
    """Role name -> identity policy document, for the IAM admin to attach."""
    return {role: rendered(f"iam/{role}.json", inputs) for role in IAM_ROLES}
