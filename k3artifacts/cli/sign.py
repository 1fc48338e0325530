"""k3a sign: sign a published revision or a release tuple after the fact."""

from __future__ import annotations

import click

from k3artifacts.cli.common import (
    emit,
    get_store,
    json_option,
    signing_key_option,
    store_option,
)
from k3artifacts.errors import ConfigError


@click.command("sign")
@click.argument("target")
@signing_key_option
@store_option
@json_option
def sign_cmd(target, signing_key, store_url, as_json):
    """Sign a published revision (org/name@<commit>) or a release tuple (k3t-...).

    \b
    A revision's signature goes to <revision>/.k3a/model.sig in the OpenSSF model-signing
    format, built from the sha256s staging recorded (no weight byte is read); check it with
      k3a verify --signature org/name@<commit>
    or with the upstream tool on a file store:
      model_signing verify key DIR --signature DIR/.k3a/model.sig --public_key KEY.pub
    A tuple's signature goes to releases/tuples/<id>.sig. Both are created once: signing
    again with the same key is a no-op, with another key a conflict (exit 6).
    """
    from k3artifacts.revisions.refs import match_revision_ref
    from k3artifacts.signing.keys import load_signer
    from k3artifacts.signing.revision import sign_revision

    if not signing_key:
        raise ConfigError("no signing key",
                          hint="pass --signing-key PATH or set K3A_SIGNING_KEY")
    signer = load_signer(signing_key)
    store = get_store(store_url)
    ref = match_revision_ref(target)
    if ref is not None:
        result = sign_revision(store, ref.repo_id, ref.commit, signer)
        payload = {"target": str(ref), "signature": result.key, "key_hint": result.key_hint,
                   "files": result.files, "new": result.new}
    else:
        # Only here: the tuple models are imports a revision's signing does not need.
        from k3artifacts.releases.signatures import sign_tuple
        from k3artifacts.releases.tuples import TUPLE_ID

        if not TUPLE_ID.match(target):
            raise ConfigError(
                f"{target!r} is neither org/name@<40-hex commit> nor a tuple id",
                hint="e.g. k3a sign moonshotai/Kimi-K3@<commit> --signing-key KEY.pem")
        tuple_result = sign_tuple(store, target, signer)
        payload = {"target": target, "signature": tuple_result.key,
                   "key_hint": tuple_result.key_hint, "new": tuple_result.new}

    def human() -> None:
        state = "signed" if payload["new"] else "already signed by this key"
        click.echo(f"{state}: {payload['target']} -> {payload['signature']}")

    emit(as_json, payload, human)
