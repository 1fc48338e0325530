"""Records bounded before they are parsed (issue 41): a stored record that is huge, nests
deeper than any record k3a writes, or holds a number no canonical JSON holds (NaN, an
infinity, 1e400) is refused by name, exit 4, where it is read; before, the first three gave a
traceback (exit 1) and a 300 MB record was read whole (1.3 GB RSS) before it was refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from test_trust_evidence import _review, k3a, write_identities

from k3artifacts.releases.reviews import review_key
from k3artifacts.stores.file import FileStore
from tests.fixtures.moves import use_policy
from tests.support.cli import run_process
from tests.support.own_usage import launched, read_usage
from tests.support.releases import Releases

MiB = 1 << 20


@pytest.fixture
def licensed(tmp_path, policies):
    """(store, a tuple, the key of its license review) on a file store whose staging channel
    reads that review."""
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump({"channels": {
        "staging": {"gates": ["license"]}}}))
    write_identities(policies)
    store = FileStore(tmp_path / "store")
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    return store, release, review_key("license", release.binding.license_sha256)


def _plant(store: FileStore, key: str, data: bytes) -> Path:
    path = store.root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _with_body_value(signed: bytes, text: str) -> bytes:
    """A signed review with one more body field whose JSON text is ``text`` as written."""
    record = json.loads(signed)
    record["body"]["extra"] = "@@"
    return json.dumps(record).replace('"@@"', text).encode()


@pytest.mark.parametrize(("value", "named"), [
    ("NaN", "a non-finite number (NaN)"),
    ("-Infinity", "a non-finite number (-Infinity)"),
    ("1e400", "a number that is no finite float (1e400)"),
    ("[" * 100_000 + "]" * 100_000, "nesting deeper than 64"),
    ("[" * 70 + "]" * 70, "nesting deeper than 64"),
])
def test_a_record_holding_json_no_record_holds_is_refused_by_name(
        licensed, tmp_path, k3a_env, value, named):
    store, release, key = licensed
    _plant(store, key, _with_body_value(_review(store, release, maker="rita", signer="rita"),
                                        value))
    refused = k3a(dict(k3a_env, K3A_STORE=store.url), "pat", tmp_path, "gates", release.id,
                  "staging", expect=4)
    assert refused["error"] == f"{key}: refused (malformed): {named}"


def test_a_300_mb_record_is_refused_before_it_is_read(licensed, tmp_path, k3a_env, k3a_cmd):
    store, release, key = licensed
    path = _plant(store, key, b"")
    os.truncate(path, 300 * MiB)  # sparse: the bytes a reader would have to hold
    report = tmp_path / "usage"
    env = dict(k3a_env, K3A_STORE=store.url)
    ran = run_process("gates", release.id, "staging", env=env, expect=4,
                      cmd=launched([*k3a_cmd], report))
    assert (f"error: {key}: refused (oversized): 314,572,800 bytes, over the 67,108,864 of "
            "the largest record k3a reads; not read") in ran.stderr
    assert read_usage(report).max_rss < 250 * MiB
