"""Who acted, as records name them (:class:`Actor`), and who acts now (:class:`Acting`: the
identity with the key it signs with; resolved by :mod:`.acting`).

An :class:`Actor` is what a review, an approval, a policy change or a channel history entry
says about who made it: the name of an identity in the store's policy (``identities.yaml``)
and the id of the key it signed with (source ``key``). Who that is, is decided by the key
alone (:mod:`.acting`): never an environment variable (``LOGNAME``, ``USER``), never a typed
name, never a cloud service's answer about the caller.

Records written before identities were keys say ``sts`` (the caller ARN STS answered on S3),
``os-user`` (the account of the process's uid on a file store) or ``asserted`` (a typed
``--by`` a policy let stand for the account behind it); they stay readable as written.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.errors import ConfigError
from k3artifacts.trust.envelope import add_signature, sign_record
from k3artifacts.trust.identities import Identities, Role
from k3artifacts.trust.keys import RecordSigner, signer_key_id
from k3artifacts.trust.root import Root

#: ``key``: an identity of the store's policy, by the key that signed. The others name how
#: older records resolved who acted (module doc).
ActorSource = Literal["key", "sts", "os-user", "asserted"]


class Actor(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    source: ActorSource
    #: For an asserted name (older records): the account that typed it.
    account: str | None = None
    #: For a key's identity: the sha256 of the public key that signed (``k3a key show``).
    key_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    def identities(self) -> frozenset[str]:
        """Every identity this actor stands for: a comparison with a reviewer or a proposer
        must see through an asserted name (older records) to the account behind it."""
        return frozenset(n for n in (self.name, self.account) if n)

    def label(self) -> str:
        return self.name if self.account is None else f"{self.name} (asserted by {self.account})"


def os_account() -> str:
    """The account of the process's real uid: a label for records no gate compares (a tuple's
    ``created_by``, an evaluation's ``attached_by``), and the name a first-use seeder's
    identity gets."""
    return pwd.getpwuid(os.getuid()).pw_name


class RoleRefused(ConfigError):
    """The identity acting may not sign what the move would record."""

    hint = ("the store's policy (identities.yaml) says who may sign what: an identity gets a "
            "role by a policy change (`k3a policy propose DIR`)")


@dataclass(frozen=True)
class Seeding:
    """What the first move on a store with no policy writes: the root it pins (and publishes,
    if the store has none) and the identities the first policy names."""

    root: Root
    #: True: the store has no root yet and this client's key becomes it (trust on first use).
    first_use: bool
    identities: Identities


class Acting:
    """Who acts: the identity (as records name it), the key it signs with, what it may sign.

    A plain class, not a model: plans (pydantic models, dataclasses) carry it as it is, and
    nothing ever serializes a signer."""

    def __init__(self, actor: Actor, signer: RecordSigner, roles: frozenset[str],
                 made_key: str | None = None, seeding: Seeding | None = None):
        self.actor = actor
        self.signer = signer
        self.roles = roles
        #: Where this resolution made the personal key (the front end says so), else None.
        self.made_key = made_key
        #: The store has no policy yet: what the first move seeds (None once it has one).
        self.seeding = seeding

    def __repr__(self) -> str:
        return f"Acting({self.actor.name!r}, key {self.key_id[:16]}, roles {sorted(self.roles)})"

    @property
    def name(self) -> str:
        return self.actor.name

    @property
    def key_id(self) -> str:
        return signer_key_id(self.signer)

    def may(self, role: Role) -> bool:
        return role in self.roles

    def require(self, role: Role, what: str) -> None:
        """RoleRefused (exit 9) unless this identity may sign ``role``'s records."""
        if role not in self.roles:
            held = ", ".join(sorted(self.roles)) or "no role"
            raise RoleRefused(f"{what} is signed with the role {role}; {self.name} holds {held}")

    def sign(self, *, key: str, kind: str, body: BaseModel | dict[str, Any],
             store_id: str | None) -> bytes:
        """``body`` as the stored bytes of a record of ``kind`` at store ``key`` of the store
        ``store_id``, signed by this identity (:func:`k3artifacts.trust.envelope.sign_record`)."""
        return sign_record(key=key, kind=kind, body=body, signer=self.signer,
                           identity=self.name, store_id=store_id)

    def cosign(self, data: bytes, *, key: str) -> bytes:
        """``data`` (a signed record for ``key``) with this identity's signature added."""
        return add_signature(data, key=key, signer=self.signer)
