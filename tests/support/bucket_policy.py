"""A bucket policy's conditional-write statements, judged the way S3 judges them.

SeaweedFS and moto enforce no bucket policy, so a test cannot apply `k3a bootstrap`'s policy to
them. This evaluates the Deny statements of a rendered policy whose conditions use only the
conditional-write keys (``s3:if-none-match``, ``s3:if-match``, ``s3:ObjectCreationOperation``)
for one request, with IAM's rules for those statements: ``Action``; ``Resource`` or
``NotResource`` with ``*`` and ``?`` wildcards (``*`` crosses ``/``); condition operators ANDed,
keys within one operator ANDed; ``Null`` true when the key is absent; ``Bool`` on the
operation's flag. A test proxy in front of SeaweedFS answers 403 where it denies
(tests/test_conditional_writes.py). The other statements (TLS, KMS, principals) are not
judged here: their keys say nothing about a request's conditional headers.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

#: The condition keys this evaluator knows.
KEYS = frozenset({"s3:if-none-match", "s3:if-match", "s3:ObjectCreationOperation"})

#: S3 operations authorized as ``s3:PutObject``, and whether each creates the object (what
#: ``s3:ObjectCreationOperation`` says: the parts of a multipart upload do not).
PUT_OBJECT = {
    "PutObject": True,
    "CopyObject": True,
    "CompleteMultipartUpload": True,
    "CreateMultipartUpload": False,
    "UploadPart": False,
    "UploadPartCopy": False,
}


@dataclass(frozen=True)
class Request:
    operation: str
    bucket: str
    key: str
    if_none_match: str | None = None
    if_match: str | None = None

    @property
    def context(self) -> dict[str, str | None]:
        creates = PUT_OBJECT.get(self.operation)
        return {
            "s3:if-none-match": self.if_none_match,
            "s3:if-match": self.if_match,
            "s3:ObjectCreationOperation": None if creates is None else str(creates).lower(),
        }


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _matches(arn: str, patterns: Any) -> bool:
    return any(fnmatch.fnmatchcase(arn, p) for p in _list(patterns))


def _holds(operator: str, block: dict[str, Any], context: dict[str, str | None]) -> bool:
    for key, wanted in block.items():
        value = context[key]
        for want in _list(wanted):
            if operator == "Null":
                ok = (value is None) == (want == "true")
            elif operator == "Bool":
                ok = value is not None and value == want
            else:
                raise ValueError(f"operator {operator} is not judged here")
            if not ok:
                return False
    return True


class BucketPolicy:
    """The conditional-write Deny statements of one rendered bucket policy."""

    def __init__(self, document: dict[str, Any]):
        self.statements = [
            s for s in document["Statement"]
            if s["Effect"] == "Deny" and s.get("Condition")
            and {k for block in s["Condition"].values() for k in block} <= KEYS
        ]

    def denies(self, request: Request) -> str | None:
        """The Sid of the statement that denies ``request``, or None."""
        if request.operation not in PUT_OBJECT:
            return None
        arn = f"arn:aws:s3:::{request.bucket}/{request.key}"
        for statement in self.statements:
            if "s3:PutObject" not in _list(statement["Action"]):
                continue
            if "Resource" in statement and not _matches(arn, statement["Resource"]):
                continue
            if "NotResource" in statement and _matches(arn, statement["NotResource"]):
                continue
            if all(_holds(op, block, request.context)
                   for op, block in statement["Condition"].items()):
                return str(statement["Sid"])
        return None
