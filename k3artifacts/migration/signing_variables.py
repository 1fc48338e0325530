"""The signing variables of the time when release keys and identity keys were two models:
``K3A_SIGNING_KEY`` (the key ``--signing-key`` defaulted to) and ``K3A_SIGNING_KEY_PASSWORD``
(its passphrase). One key reference now signs both (``K3A_IDENTITY_KEY`` and
``K3A_IDENTITY_KEY_PASSWORD``, or ``--signing-key``): this module is their only reader, so
that they keep working, with a notice, until :data:`REMOVAL`."""

from __future__ import annotations

from dataclasses import dataclass

from k3artifacts.settings import load
from k3artifacts.signing.keys import KeyReference

#: When the two variables stop being read (also in docs/reference/environment.md).
REMOVAL = "k3artifacts 0.3.0 (2027-06-30)"


@dataclass(frozen=True)
class OldSigning:
    #: The key reference for ``--signing-key``, if any: the flag's, else K3A_SIGNING_KEY's.
    reference: KeyReference | None
    #: What to tell the user once, when either old variable is set; else None.
    notice: str | None


def signing_key(flag: str | None) -> OldSigning:
    """The key ``--signing-key`` names (``flag``), else ``K3A_SIGNING_KEY``'s, with
    ``K3A_SIGNING_KEY_PASSWORD`` as its passphrase where ``K3A_IDENTITY_KEY_PASSWORD`` is
    unset."""
    settings = load()
    old = [name for name, value in (("K3A_SIGNING_KEY", settings.signing_key),
                                    ("K3A_SIGNING_KEY_PASSWORD", settings.signing_key_password))
           if value is not None]
    notice = None
    if old:
        notice = (f"{' and '.join(old)} {'is' if len(old) == 1 else 'are'} deprecated and read "
                  f"until {REMOVAL}: set K3A_IDENTITY_KEY (and K3A_IDENTITY_KEY_PASSWORD), "
                  "or pass --signing-key (docs/guides/signing.md)")
    spec = flag or settings.signing_key
    if spec is None:
        return OldSigning(None, notice)
    password = None if settings.identity_key_password is not None \
        else settings.signing_key_password
    return OldSigning(KeyReference(spec, password), notice)
