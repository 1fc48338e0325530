"""Model-card front matter parsed as hostile input: no aliases, bounded size and depth."""

from __future__ import annotations

import hashlib

import pytest

from k3artifacts.errors import Refusal, ReleaseRefused
from k3artifacts.staging.license import MAX_FRONT_MATTER, capture, card_metadata
from tests.fixtures.people import person
from tests.test_hostile_upstream import ALIAS_BOMB


def test_a_plain_card_is_read_as_before():
    card = b"---\nlicense: other\nlicense_name: modified-mit\ntags: [a, b]\n---\n# K3\n"
    assert card_metadata(card) == {"license": "other", "license_name": "modified-mit",
                                   "tags": ["a", "b"]}
    assert card_metadata(b"# no front matter\n") == {}
    assert card_metadata(b"---\nlicense: [unclosed\n---\n") == {}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("card,detail", [
    (ALIAS_BOMB, "YAML anchor &a"),
    (b"---\nbase: {a: 1}\nmerged:\n  <<: *base\n---\n", "YAML alias *base"),
    (b"---\nx: " + b"[" * 40 + b"]" * 40 + b"\n---\n", "nests deeper than 32"),
    (b"---\n" + b"k: v\n" * (MAX_FRONT_MATTER // 5 + 1) + b"---\n", "over 65,536 bytes"),
])
def test_hostile_front_matter_is_refused_by_name(card, detail):
    with pytest.raises(Refusal) as err:
        card_metadata(card, "README.md")
    assert err.value.rule == "model-card" and detail in err.value.detail


def test_a_license_field_that_is_not_a_string_refuses_the_release(tmp_path):
    card = tmp_path / "README.md"
    card.write_bytes(b"---\nlicense:\n  nested: [1, 2]\n---\n")
    with pytest.raises(ReleaseRefused) as err:
        capture(None, None, card)
    [refusal] = err.value.refusals
    assert (refusal.path, refusal.rule) == ("README.md", "model-card")
    assert "license is a YAML dict" in refusal.detail


def test_a_license_named_only_in_the_cards_metadata_is_the_card(tmp_path):
    card = tmp_path / "README.md"
    data = b"---\nlicense: other\nlicense_name: modified-mit\n---\n# K3\nModified MIT terms.\n"
    card.write_bytes(data)
    record = capture(None, None, card)
    assert (record.path, record.card_license_name) == ("README.md", "modified-mit")
    assert record.sha256 == hashlib.sha256(data).hexdigest()
    assert record.text is None  # read from the revision's file by its sha256


def test_a_license_file_wins_over_the_card_and_a_card_without_one_is_no_license(tmp_path):
    card = tmp_path / "README.md"
    card.write_bytes(b"---\nlicense: apache-2.0\n---\n# K3\n")
    text = tmp_path / "LICENSE"
    text.write_bytes(b"Apache License 2.0\n")
    record = capture("LICENSE", text, card)
    assert (record.path, record.card_license) == ("LICENSE", "apache-2.0")
    assert record.sha256 == hashlib.sha256(b"Apache License 2.0\n").hexdigest()
    card.write_bytes(b"---\ntags: [moe]\n---\n# K3\n")
    assert (capture(None, None, card).path, capture(None, None, card).sha256) == (None, None)


def test_a_revision_whose_card_alone_names_its_license_is_reviewed_and_passes(
        local_hub, tmp_path):
    """Staged from a hub whose repo has no LICENSE file: the card is the license a tuple binds,
    `k3a review license --show` reads it from the store, and the license gate passes after."""
    from k3artifacts.policy.record import packaged_document
    from k3artifacts.releases.reviewing import license_text, review_license
    from k3artifacts.stores.file import FileStore
    from tests.fixtures.moves import check_gate, seed_people
    from tests.staging_helpers import CARD, REPO, run_stage, small_release
    from tests.support.releases import Releases

    files = small_release(tmp_path)
    del files["LICENSE"]
    local_hub.hub.add_commit(REPO, files)
    store = FileStore(tmp_path / "store")
    seed_people(store, packaged_document())  # the review is read through its identities
    result = run_stage(local_hub.endpoint, store, tmp_path / "q")
    assert result.license_sha256 == hashlib.sha256(CARD).hexdigest()
    release = Releases(store, tmp_path / "scratch").tuple_for(
        store.published_manifest(REPO, result.commit))
    assert license_text(store, release.id) == CARD.decode()
    review_license(store, release.id, by=person("rita"))
    assert check_gate(store, release, "staging", "license").passed


def test_a_manifest_published_with_its_license_inline_keeps_its_digest():
    """Manifests written before the license was kept as a file hold its text: they still
    parse, and their digest is still the sha256 of their stored bytes."""
    import json

    from k3artifacts.revisions.manifest import ShardManifest

    stored = json.dumps({
        "commit": "a" * 40, "files": [], "remote_code": [], "repo_id": "moonshotai/Kimi-K3",
        "schema_version": 1, "total_bytes": 0,
        "license": {"card_license": None, "card_license_link": None, "card_license_name": None,
                    "path": "LICENSE", "sha256": "b" * 64, "text": "MIT License\n"},
    }, sort_keys=True, separators=(",", ":")).encode()
    manifest = ShardManifest.parse(stored)
    assert manifest.license.text == "MIT License\n"
    assert manifest.canonical() == stored
    assert manifest.digest() == hashlib.sha256(stored).hexdigest()
