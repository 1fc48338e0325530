"""One signed record (k3artifacts/trust/envelope.py): what verifies, and every way a record
written or edited by someone with write access to the store is refused, each by its name."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import UntrustedRecord
from k3artifacts.signing.dsse import pae
from k3artifacts.trust.envelope import (
    MAX_KEY,
    Bound,
    add_signature,
    sign_record,
    statement,
    statement_digest,
    verify_record,
)
from k3artifacts.trust.keys import KMS_RAW_LIMIT
from tests.trust_helpers import identities, signer

KEY = "releases/reviews/k3t-0123456789abcdef01234567/license.json"
BODY = {"tuple_id": "k3t-0123456789abcdef01234567", "kind": "license", "verdict": "accepted"}

ALICE, BOB, MALLORY = signer(), signer("ecdsa-p256"), signer()
POLICY = identities(alice=(ALICE, ["review", "promote"]), bob=(BOB, ["approve"]))
KEYRING = POLICY.keyring()


#: The id of the store these records are signed for and read in (a root's store id).
STORE = "5" * 32
HERE = Bound(STORE)


def review(by=ALICE, name="alice", key=KEY, body=None, kind="review", store=STORE) -> bytes:
    return sign_record(key=key, kind=kind, body=BODY if body is None else body, signer=by,
                       identity=name, store_id=store)


def check(data: bytes, *, key=KEY, kind="review", roles=("review",), bound=HERE):
    return verify_record(data, key=key, kind=kind, keyring=KEYRING, roles=roles, bound=bound)


def refused(data: bytes, reason: str, **kwargs) -> UntrustedRecord:
    with pytest.raises(UntrustedRecord) as caught:
        check(data, **kwargs)
    assert caught.value.reason == reason, str(caught.value)
    assert caught.value.exit_code == 4
    return caught.value


def edit(data: bytes, change) -> bytes:
    plain = json.loads(data)
    change(plain)
    return canonical_json(plain)


def test_a_record_signed_by_a_key_holding_the_role_verifies():
    verified = check(review())
    assert (verified.body, verified.signer, verified.signers) == (BODY, "alice", {"alice"})
    # The body stays readable in place; what is signed is a small statement naming it.
    stored = json.loads(review())
    assert stored["body"] == BODY and stored["kind"] == "review"
    signed = json.loads(base64.b64decode(stored["envelope"]["payload"]))
    assert signed["subject"] == [{"name": KEY, "digest": {"sha256": verified.digest}}]
    assert signed["predicate"] == {"kind": "review", "signer": "alice", "store": STORE}


def test_a_key_without_the_role_is_refused_naming_the_role():
    error = refused(review(by=BOB, name="bob"), "wrong-role")
    assert "bob holds approve" in str(error) and "review" in str(error)


def test_a_key_the_policy_does_not_name_is_refused():
    refused(review(by=MALLORY, name="alice"), "untrusted-key")


def test_a_hand_written_record_is_unsigned():
    refused(json.dumps(BODY).encode(), "unsigned")
    refused(edit(review(), lambda r: r["envelope"].update(signatures=[])), "unsigned")


def test_an_edited_body_is_tampered():
    refused(edit(review(), lambda r: r["body"].update(verdict="rejected")), "tampered")
    refused(edit(review(), lambda r: r["body"].update(extra=1)), "tampered")


def test_an_edited_envelope_is_tampered():
    def other_payload(record):
        payload = json.loads(base64.b64decode(record["envelope"]["payload"]))
        payload["predicate"]["signer"] = "bob"
        record["envelope"]["payload"] = base64.b64encode(canonical_json(payload)).decode()

    def other_sig(record):
        sig = bytearray(base64.b64decode(record["envelope"]["signatures"][0]["sig"]))
        sig[-1] ^= 1
        record["envelope"]["signatures"][0]["sig"] = base64.b64encode(sig).decode()

    refused(edit(review(), other_payload), "tampered")
    refused(edit(review(), other_sig), "tampered")
    refused(edit(review(), lambda r: r["envelope"]["signatures"][0].update(sig="!!")), "tampered")


def test_a_record_moved_to_another_key_is_refused_there():
    other = KEY.replace("license", "code")
    refused(review(), "wrong-key", key=other)
    # Two records swapped between their keys: each refused where it now lies.
    code = review(key=other, body={**BODY, "kind": "code"})
    refused(code, "wrong-key")
    refused(review(), "wrong-key", key=other)


def test_another_kind_is_refused_where_this_kind_is_read():
    refused(review(), "wrong-kind", kind="approval-decision", roles=("approve",))
    # The stored kind edited to pass as another: the signed statement still says review.
    refused(edit(review(), lambda r: r.update(kind="approval-decision")), "tampered",
            kind="approval-decision", roles=None)


@pytest.mark.parametrize("data", [b"", b"{", b"not json", b"\xff\xfe{}", b"[1, 2]"])
def test_bytes_that_are_not_a_record_are_refused(data):
    reason = "malformed" if data == b"[1, 2]" else "unreadable"
    refused(data, reason)


def test_a_truncated_record_is_unreadable():
    data = review()
    for cut in (1, len(data) // 2, len(data) - 1):
        refused(data[:cut], "unreadable")


def test_a_record_naming_a_field_twice_is_malformed():
    data = review().decode()
    twice = data.replace('"body":{', '"body":{"verdict":"rejected"},"body":{', 1)
    refused(twice.encode(), "malformed")


def test_a_structure_that_is_not_an_envelope_is_malformed():
    refused(edit(review(), lambda r: r["envelope"].pop("payload")), "malformed")
    refused(edit(review(), lambda r: r["envelope"].update(payload="%%")), "malformed")
    refused(edit(review(), lambda r: r["envelope"].update(payloadType="text/plain")), "malformed")
    refused(edit(review(), lambda r: r.update(schema="k3a.signed-record/v0")), "malformed")


def test_a_statement_naming_another_maker_than_its_signer_is_refused():
    refused(review(by=ALICE, name="bob"), "signer-mismatch")


def test_a_second_identity_adds_its_signature_to_the_same_record():
    both = add_signature(review(), key=KEY, signer=BOB)
    verified = check(both, roles=None)
    assert verified.signers == {"alice", "bob"} and verified.signer == "alice"
    assert add_signature(both, key=KEY, signer=BOB) == both  # signing twice counts once
    # Only the signatures of keys holding the role count toward it.
    assert check(both).signers == {"alice"}
    # A co-signer never vouches for a body other than the one signed.
    with pytest.raises(UntrustedRecord) as caught:
        add_signature(edit(review(), lambda r: r["body"].update(verdict="x")), key=KEY,
                      signer=BOB)
    assert caught.value.reason == "tampered"
    # An extra signature by an unknown key neither helps nor hurts.
    assert check(add_signature(review(), key=KEY, signer=MALLORY)).signers == {"alice"}


def test_the_signed_payload_stays_small_enough_for_kms_raw_whatever_the_body():
    huge, longest, name = {"blob": "x" * 1_000_000}, "k/" + "a" * (MAX_KEY - 2), "n" * 128
    data = review(body=huge, key=longest, name=name, kind="a" * 63)
    payload = base64.b64decode(json.loads(data)["envelope"]["payload"])
    assert len(pae(payload)) < KMS_RAW_LIMIT
    keyring = identities(**{name: (ALICE, [])}).keyring()
    verified = verify_record(data, key=longest, kind="a" * 63, keyring=keyring, roles=None,
                             bound=Bound(STORE))
    assert verified.body == huge
    with pytest.raises(ValueError, match="store key"):
        statement("k" * (MAX_KEY + 1), "review", "0" * 64, "alice", STORE)
    with pytest.raises(ValueError, match="identity name"):
        statement(KEY, "review", "0" * 64, "not a name", STORE)


def test_the_refusal_names_its_key_and_reason_and_survives_pickling():
    error = refused(review(by=MALLORY), "untrusted-key")
    again = pickle.loads(pickle.dumps(error))
    assert (again.key, again.reason, str(again)) == (KEY, "untrusted-key", str(error))
    assert KEY in str(error) and "refused (untrusted-key)" in str(error)


def test_a_trusted_signature_over_something_else_than_a_statement_is_malformed():
    for payload in (b'{"x": 1}', b'{"_type": "https://in-toto.io/Statement/v1"}', b"[]"):
        def other(record, payload=payload):
            record["envelope"]["payload"] = base64.b64encode(payload).decode()
            record["envelope"]["signatures"][0]["sig"] = base64.b64encode(
                ALICE.sign(pae(payload))).decode()
        refused(edit(review(), other), "malformed")


def test_a_record_is_read_only_in_the_store_it_was_signed_for():
    other = "6" * 32
    # Signed by the same identity, for another store: refused by name, naming both ids.
    err = refused(review(store=other), "another-store")
    assert other in str(err) and STORE in str(err)
    # A store whose root predates ids reads only records naming no store.
    assert check(review(store=None), bound=Bound(None)).signer == "alice"
    refused(review(), "another-store", bound=Bound(None))
    # Once it has an id, a record naming none counts only if its statement is one the store
    # held when it was given the id: signing without an id is no way around the binding.
    earlier = review(store=None)
    payload = base64.b64decode(json.loads(earlier)["envelope"]["payload"])
    held = Bound(STORE, lambda: frozenset({statement_digest(payload)}))
    assert check(earlier, bound=held).signer == "alice"
    refused(earlier, "another-store")
    refused(review(store=None, body={**BODY, "verdict": "rejected"}), "another-store",
            bound=held)
    # The id is inside what is signed: naming another one breaks the signature.
    def restore(plain):
        envelope = plain["envelope"]
        text = base64.b64decode(envelope["payload"]).decode().replace(STORE, other)
        envelope["payload"] = base64.b64encode(text.encode()).decode()
    refused(edit(review(), restore), "tampered", bound=Bound(other))
