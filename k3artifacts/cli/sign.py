"""k3a sign: sign a published revision or a release tuple after the fact (the move:
``releases/signing.py``)."""

from __future__ import annotations

import click

from k3artifacts.cli.common import (
    emit,
    get_store,
    json_option,
    signing_key_option,
    store_option,
)
from k3artifacts.cli.exits import exits


@exits((0, "signed, or already signed by this key"),
       (4, "the tuple's body does not match its id, or the revision's manifest does not "
           "parse (edited in the store)"),
       (6, "already signed by another key"),
       (7, "not a published revision or tuple, or no key file where the key reference says"),
       (9, "the signing key refused (unusable, readable by others, not ECDSA P-256/P-384)"))
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
    again with the same key is a no-op, with another key a conflict.

    \b
    The key: --signing-key, else your identity key (K3A_IDENTITY_KEY, else your personal
    key); an ECDSA P-256/P-384 one, as model-signing verifies. A signature counts where the
    store's policy names its key under an identity holding the release role.
    """
    from k3artifacts.releases.signing import sign

    done = sign(get_store(store_url), target, signing_key)
    payload = {"target": done.target, "signature": done.signature, "key_hint": done.key_hint,
               "new": done.new}
    if done.files is not None:
        payload["files"] = done.files

    def human() -> None:
        state = "signed" if payload["new"] else "already signed by this key"
        click.echo(f"{state}: {payload['target']} -> {payload['signature']}")

    emit(as_json, payload, human)
