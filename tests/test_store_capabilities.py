"""S3 servers that cannot keep our rules are refused before the first record write."""

from __future__ import annotations

import time

import pytest

from k3artifacts.errors import ConfigError
from k3artifacts.releases.tuples import TupleStore
from k3artifacts.stores.capabilities import MissingCapability, probe
from k3artifacts.stores.s3 import S3Store
from tests.support.releases import Releases

pytestmark = pytest.mark.s3


def _store(s3_url, endpoint):
    return S3Store.from_url(s3_url, endpoint_url=endpoint)


def test_a_server_that_ignores_conditional_writes_is_refused(
    s3_url, s3_client, s3_bucket, s3_fault_proxy, tmp_path
):
    s3_fault_proxy.strip_conditions = True
    store = _store(s3_url, s3_fault_proxy.endpoint)
    with pytest.raises(MissingCapability) as refused:
        store.create("releases/tuples/k3t-000000000000000000000000.json", b"{}")
    message = str(refused.value)
    assert refused.value.exit_code == 9
    assert "If-None-Match: *" in message and "If-Match" in message
    assert "nothing was written" in refused.value.hint
    # Nothing but the probe's own (removed) scratch key ever reached the bucket.
    assert s3_client.list_objects_v2(Bucket=s3_bucket)["KeyCount"] == 0
    versions = s3_client.list_object_versions(Bucket=s3_bucket).get("Versions", [])
    assert {v["Key"].split("/")[1:3] == ["releases", "probes"] for v in versions} <= {True}
    # Refused for every record kind, from the cached verdict (one probe per process).
    probes = len(s3_fault_proxy.ops("PutObject"))
    with pytest.raises(MissingCapability):
        store.replace("releases/channels/staging.json", b"{}", None)
    assert len(s3_fault_proxy.ops("PutObject")) == probes
    with pytest.raises(MissingCapability):
        probe(store.client, s3_bucket, "")  # and a fresh probe says the same


def test_a_server_that_honours_them_passes_through_the_same_proxy(
    s3_url, s3_fault_proxy, tmp_path
):
    store = _store(s3_url, s3_fault_proxy.endpoint)
    release = Releases(store, tmp_path / "scratch").release()
    assert TupleStore(store).get(release.id) == release
    assert store.list_keys("releases/probes/") == []


def test_not_implemented_is_a_configuration_error_at_once(s3_url, s3_fault_proxy):
    s3_fault_proxy.add("PutObject", "*", status=501, code="NotImplemented", times=None)
    store = _store(s3_url, s3_fault_proxy.endpoint)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="NotImplemented") as err:
        store.create("releases/tuples/k3t-000000000000000000000000.json", b"{}")
    assert err.value.exit_code == 9 and "does not implement" in err.value.hint
    assert time.monotonic() - started < 5
    assert len(s3_fault_proxy.ops("PutObject")) == 1  # not retried as an outage


def test_bootstrap_refuses_the_bucket_before_setting_its_guardrails(
    s3_client, s3_bucket, s3_fault_proxy
):
    from k3artifacts.stores import awsclients
    from k3artifacts.stores.bootstrap import bootstrap
    from tests.test_bootstrap import inputs_for

    s3_fault_proxy.strip_conditions = True
    client = awsclients.s3_client(s3_fault_proxy.endpoint)
    with pytest.raises(MissingCapability, match="ignores conditional writes"):
        bootstrap(client, inputs_for(s3_bucket))
    # Refused before any setting was applied: no bucket policy was written.
    assert "Policy" not in _policy(s3_client, s3_bucket)
    s3_fault_proxy.strip_conditions = False
    report = bootstrap(client, inputs_for(s3_bucket))
    assert report.changes and "conditional_writes" not in report.unmanaged
    rule = s3_client.get_bucket_lifecycle_configuration(Bucket=s3_bucket)["Rules"][0]
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 30


def _policy(s3_client, bucket):
    try:
        return s3_client.get_bucket_policy(Bucket=bucket)
    except s3_client.exceptions.ClientError:
        return {}
