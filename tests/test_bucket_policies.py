"""The JSON policies: they render, they lint clean with parliament, they say what we mean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import botocore.session
import jsonschema
import parliament
import pytest
from botocore.validate import validate_parameters

from k3artifacts.errors import ConfigError
from k3artifacts.stores.bucket_policies import (
    BucketPolicyInputs,
    iam_policies,
    load_template,
    policies_dir,
    render,
    rendered,
)
from tests.support.bucket_policy import BucketPolicy, Request

ACCOUNT = "123456789012"
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/k3a-admin"
INFERENCE = f"arn:aws:iam::{ACCOUNT}:role/k3a-inference"
DOWNLOADER = f"arn:aws:iam::{ACCOUNT}:role/k3a-downloader"
PROMOTER = f"arn:aws:iam::{ACCOUNT}:role/k3a-promoter"
KMS = f"arn:aws:kms:eu-west-1:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
FSX_ROLE = (f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/"
            "s3.data-source.lustre.fsx.amazonaws.com/*")


@pytest.fixture
def inputs() -> BucketPolicyInputs:
    return BucketPolicyInputs(
        bucket="k3a-releases", prefix="k3a", admin_role_arn=ADMIN, inference_role_arn=INFERENCE,
        kms_key_arn=KMS, downloader_role_arn=DOWNLOADER, promoter_role_arn=PROMOTER,
        extra_reader_arns=(FSX_ROLE,), log_bucket="k3a-access-logs",
    )


def all_documents(inputs: BucketPolicyInputs) -> dict[str, Any]:
    return {
        **{f"iam/{role}": doc for role, doc in iam_policies(inputs).items()},
        "s3/bucket-policy": rendered("s3/bucket-policy.json", inputs),
        "s3/log-target-statement": {
            "Version": "2012-10-17",
            "Statement": [rendered("s3/log-target-statement.json", inputs)],
        },
    }


# ---- schema ----------------------------------------------------------------------------------

_ARN_OR_STAR = {"type": "string", "pattern": r"^(\*|arn:aws[a-z-]*:[a-z0-9-]+:.*)$"}
_ACTION = {"type": "string", "pattern": r"^(s3|kms):[A-Za-z*]+$"}
POLICY_SCHEMA = {
    "type": "object",
    "required": ["Version", "Statement"],
    "additionalProperties": False,
    "properties": {
        "Version": {"const": "2012-10-17"},
        "Id": {"type": "string"},
        "Statement": {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object",
                "required": ["Sid", "Effect", "Action"],
                "oneOf": [{"required": ["Resource"]}, {"required": ["NotResource"]}],
                "additionalProperties": False,
                "properties": {
                    "Sid": {"type": "string", "pattern": "^[A-Za-z0-9]+$"},
                    "Effect": {"enum": ["Allow", "Deny"]},
                    "Principal": {"oneOf": [{"const": "*"}, {"type": "object"}]},
                    "Action": {"oneOf": [_ACTION, {"type": "array", "items": _ACTION,
                                                   "minItems": 1, "uniqueItems": True}]},
                    "Resource": {"oneOf": [_ARN_OR_STAR, {"type": "array", "items": _ARN_OR_STAR,
                                                          "minItems": 1, "uniqueItems": True}]},
                    "NotResource": {"type": "array", "items": _ARN_OR_STAR, "minItems": 1,
                                    "uniqueItems": True},
                    "Condition": {"type": "object", "additionalProperties": {
                        "type": "object", "minProperties": 1}},
                },
            },
        },
    },
}


def test_every_template_renders_without_leftover_placeholders(inputs) -> None:
    files = sorted(p.relative_to(policies_dir()).as_posix()
                   for p in policies_dir().glob("*/*.json"))
    assert "s3/bucket-policy.json" in files and "iam/downloader.json" in files
    for rel in files:
        text = json.dumps(rendered(rel, inputs))
        assert "{{" not in text, rel


def test_documents_match_the_policy_schema(inputs) -> None:
    for name, doc in all_documents(inputs).items():
        jsonschema.validate(doc, POLICY_SCHEMA)
        sids = [s["Sid"] for s in doc["Statement"]]
        assert len(sids) == len(set(sids)), name
        if name.startswith("iam/"):
            assert all("Principal" not in s for s in doc["Statement"]), name
        if name == "s3/bucket-policy":
            assert all("Principal" in s for s in doc["Statement"])


def test_bucket_settings_match_the_s3_api(inputs) -> None:
    """Each settings file is a valid request body of the S3 call bootstrap makes with it."""
    model = botocore.session.get_session().get_service_model("s3")
    calls = {
        "s3/versioning.json": ("PutBucketVersioning", "VersioningConfiguration"),
        "s3/encryption.json": ("PutBucketEncryption", "ServerSideEncryptionConfiguration"),
        "s3/public-access-block.json": ("PutPublicAccessBlock", "PublicAccessBlockConfiguration"),
        "s3/ownership-controls.json": ("PutBucketOwnershipControls", "OwnershipControls"),
        "s3/logging.json": ("PutBucketLogging", "BucketLoggingStatus"),
        "s3/lifecycle-rule.json": ("PutBucketLifecycleConfiguration", "LifecycleConfiguration"),
    }
    for rel, (operation, member) in calls.items():
        body = rendered(rel, inputs)
        if member == "BucketLoggingStatus":
            body = {"LoggingEnabled": body}
        if member == "LifecycleConfiguration":
            body = {"Rules": [body]}
        validate_parameters({"Bucket": inputs.bucket, member: body},
                            model.operation_model(operation).input_shape)


# ---- lint ------------------------------------------------------------------------------------

#: parliament findings we accept, with why.
JUSTIFIED = {
    # parliament types the kms-key-id condition key as ARN; AWS documents it with String
    # operators (StringNotEquals*), which also cover a bare key id sent by a client.
    ("s3/bucket-policy", "MISMATCHED_TYPE_BUT_USABLE"),
}


def lint(doc: dict[str, Any]) -> list[Any]:
    policy = parliament.analyze_policy_string(json.dumps(doc), include_community_auditors=True)
    return [parliament.enhance_finding(f) for f in policy.findings]


def test_parliament_findings_are_low_and_justified(inputs) -> None:
    for name, doc in all_documents(inputs).items():
        for finding in lint(doc):
            assert finding.severity in ("LOW", "INFO", "MUTE") and (
                (name, finding.issue) in JUSTIFIED
            ), f"{name}: {finding.issue} ({finding.severity}): {finding.detail}"


def test_parliament_does_flag_a_broken_policy(inputs) -> None:
    doc = iam_policies(inputs)["inference"]
    doc["Statement"][1]["Action"] = ["s3:GetObjekt"]
    assert any(f.issue == "UNKNOWN_ACTION" for f in lint(doc))


# ---- what the policies say -------------------------------------------------------------------


def statements(doc: dict[str, Any], effect: str) -> list[dict[str, Any]]:
    return [s for s in doc["Statement"] if s["Effect"] == effect]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_bucket_policy_guards(inputs) -> None:
    doc = rendered("s3/bucket-policy.json", inputs)
    by_sid = {s["Sid"]: s for s in doc["Statement"]}
    tls = by_sid["DenyInsecureTransport"]
    assert tls["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert set(tls["Resource"]) == {"arn:aws:s3:::k3a-releases", "arn:aws:s3:::k3a-releases/*"}

    deletes = by_sid["DenyDeletesOfReleasesAndModelsExceptAdmin"]
    assert set(deletes["Action"]) == {"s3:DeleteObject", "s3:DeleteObjectVersion"}
    # Every record kind; not the pins and probes a promoter removes after itself.
    assert set(deletes["Resource"]) == {"arn:aws:s3:::k3a-releases/k3a/models/*"} | {
        f"arn:aws:s3:::k3a-releases/k3a/releases/{kind}/*"
        for kind in ("tuples", "channels", "evaluations", "reviews", "records",
                     "retirement/tombstones")}
    assert deletes["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": ADMIN}}

    reads = by_sid["DenyReadsOfReleasesAndModelsExceptReaders"]
    readers = reads["Condition"]["ArnNotLike"]["aws:PrincipalArn"]
    assert readers[0] == INFERENCE and set(readers) == {INFERENCE, ADMIN, DOWNLOADER, PROMOTER,
                                                        FSX_ROLE}
    encryption = [s for s in doc["Statement"] if s["Action"] == "s3:PutObject"
                  and "server-side-encryption" in json.dumps(s.get("Condition"))]
    assert len(encryption) == 3  # wrong algorithm, wrong key, customer-provided key
    assert "s3:PutBucketVersioning" in by_sid["DenyGuardrailChangesExceptAdmin"]["Action"]


def test_the_store_cannot_be_overwritten_under_the_bucket_policy(inputs) -> None:
    """Every object write under the store's prefixes carries a condition; a create-once key
    (weights, manifests, records, history, warm artifacts) takes only If-None-Match; the
    compare-and-swap keys take If-Match too; the parts of a multipart upload carry no header
    and are let through, its completion is judged."""
    doc = rendered("s3/bucket-policy.json", inputs)
    by_sid = {s["Sid"]: s for s in doc["Statement"]}
    unconditional = by_sid["DenyUnconditionalWritesToTheStore"]
    assert unconditional["Condition"] == {
        "Null": {"s3:if-none-match": "true", "s3:if-match": "true"},
        "Bool": {"s3:ObjectCreationOperation": "true"}}
    policy = BucketPolicy(doc)
    assert {s["Sid"] for s in policy.statements} == {
        "DenyUnconditionalWritesToTheStore", "DenyReplacingCreateOnceObjects",
        "DenyReplacingChannelHistory"}
    root = "k3a/"
    create_once = [
        "models/org/name/abc/model-00001-of-00064.safetensors",
        "models/org/name/abc/.k3a/manifest.json", "models/org/name/abc/.k3a/model.sig",
        "releases/tuples/k3t-1.json", "releases/channels/production/history/0000000007.json",
        "releases/policy/documents/ab.json", "releases/approvals/r/decision.json",
        "releases/reviews/license/ab.json", "releases/retirement/pins/org/name/abc/1.json",
        "releases/records/k3t-1/log/0000000003.json",
        "warm/blobs/ab/abcd", "warm/artifacts/k3t-1/h100/tp8.json",
    ]
    swapped = ["releases/channels/production.json", "releases/policy/current.json",
               "releases/channels/production/checkpoint.json",
               "releases/policy/checkpoint.json", "releases/policy/proposals/k3r-1.json",
               "releases/trust/proposals/root-0000000002.json",
               "releases/records/k3t-1.json",
               "releases/probes/123", "models/org/name/abc/.k3a/s3-objects.json",
               "models/org/name/abc/.k3a/provenance.json"]

    def denied(op: str, key: str, **conditions: str) -> str | None:
        return policy.denies(Request(op, "k3a-releases", root + key, **conditions))

    for key in create_once + swapped:
        for op in ("PutObject", "CopyObject", "CompleteMultipartUpload"):
            assert denied(op, key) == "DenyUnconditionalWritesToTheStore", (op, key)
            assert denied(op, key, if_none_match="*") is None, (op, key)
        for op in ("CreateMultipartUpload", "UploadPart", "UploadPartCopy"):
            assert denied(op, key) is None, (op, key)
    for key in create_once:
        assert denied("PutObject", key, if_match='"e"') is not None, key
        assert denied("CopyObject", key, if_match='"e"') is not None, key
    for key in swapped:
        assert denied("PutObject", key, if_match='"e"') is None, key
    # Outside the store's prefix the bucket keeps its ordinary rules for unconditional writes.
    assert policy.denies(Request("PutObject", "k3a-releases", "elsewhere/x")) is None


def test_reads_are_inference_and_admin_only_when_no_pipeline_roles_given() -> None:
    bare = BucketPolicyInputs(bucket="k3a-releases", prefix="", admin_role_arn=ADMIN,
                              inference_role_arn=INFERENCE, kms_key_arn=KMS)
    doc = rendered("s3/bucket-policy.json", bare)
    reads = next(s for s in doc["Statement"] if s["Sid"].startswith("DenyReads"))
    assert reads["Condition"]["ArnNotLike"]["aws:PrincipalArn"] == [INFERENCE, ADMIN]
    assert "arn:aws:s3:::k3a-releases/models/*" in reads["Resource"]  # empty prefix


def allowed_object_resources(doc: dict[str, Any], action: str) -> set[str]:
    return {r for s in statements(doc, "Allow") if action in as_list(s["Action"])
            for r in as_list(s["Resource"])}


def test_downloader_writes_only_models_and_staging(inputs) -> None:
    doc = iam_policies(inputs)["downloader"]
    assert allowed_object_resources(doc, "s3:PutObject") == {
        "arn:aws:s3:::k3a-releases/k3a/models/*", "arn:aws:s3:::k3a-releases/k3a/staging/*"}
    assert allowed_object_resources(doc, "s3:DeleteObject") == {
        "arn:aws:s3:::k3a-releases/k3a/staging/*"}
    denied = [s for s in statements(doc, "Deny")
              if "s3:PutObject" in as_list(s["Action"])]
    assert denied and all(r.endswith("/k3a/releases/*") for s in denied
                          for r in as_list(s["Resource"]))


def test_promoter_writes_only_releases(inputs) -> None:
    doc = iam_policies(inputs)["promoter"]
    assert allowed_object_resources(doc, "s3:PutObject") == {
        "arn:aws:s3:::k3a-releases/k3a/releases/*"}
    assert allowed_object_resources(doc, "s3:DeleteObject") == {
        "arn:aws:s3:::k3a-releases/k3a/releases/retirement/pins/*",
        "arn:aws:s3:::k3a-releases/k3a/releases/probes/*"}


def test_inference_is_read_only(inputs) -> None:
    doc = iam_policies(inputs)["inference"]
    actions = {a for s in statements(doc, "Allow") for a in as_list(s["Action"])}
    assert actions == {"s3:ListBucket", "s3:GetObject", "s3:GetObjectVersion", "kms:Decrypt"}
    assert not statements(doc, "Deny")


def test_region_and_account_come_from_the_arns(inputs) -> None:
    values = inputs.values()
    assert (values["region"], values["account_id"], values["partition"]) == (
        "eu-west-1", ACCOUNT, "aws")
    kms = next(s for s in iam_policies(inputs)["inference"]["Statement"]
               if s["Sid"] == "DecryptThroughS3")
    assert kms["Condition"]["StringEquals"]["kms:ViaService"] == "s3.eu-west-1.amazonaws.com"


# ---- rendering errors ------------------------------------------------------------------------


def test_unknown_placeholder_is_an_error() -> None:
    with pytest.raises(ConfigError, match="bukket"):
        render({"Resource": "arn:aws:s3:::{{bukket}}/*"}, {"bucket": "b"})


@pytest.mark.parametrize("field,value", [
    ("admin_role_arn", "arn:aws:iam::123:role/short-account"),
    ("inference_role_arn", "k3a-inference"),
    ("kms_key_arn", "alias/k3a"),
    ("bucket", "Not_A_Bucket"),
])
def test_bad_inputs_are_config_errors(field: str, value: str) -> None:
    args = {"bucket": "k3a-releases", "prefix": "", "admin_role_arn": ADMIN,
            "inference_role_arn": INFERENCE, "kms_key_arn": KMS}
    args[field] = value
    with pytest.raises(ConfigError):
        BucketPolicyInputs(**args)


def test_templates_are_plain_json_data() -> None:
    for path in Path(policies_dir()).glob("*/*.json"):
        assert isinstance(load_template(path.relative_to(policies_dir()).as_posix()), dict)
