"""Model-card front matter parsed as hostile input: no aliases, bounded size and depth."""

from __future__ import annotations

import pytest

from k3artifacts.errors import Refusal, ReleaseRefused
from k3artifacts.staging.license import MAX_FRONT_MATTER, capture, card_metadata
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


def test_a_manifest_published_with_its_license_inline_keeps_its_digest():
    """Manifests written before the license was kept as a file hold its text: they still
    parse, and their digest is still the sha256 of their stored bytes."""
    import hashlib
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
