"""Who is acting: the identity recorded in reviews, approvals, policy changes and channel history.

Resolved here and nowhere else, from a source the actor cannot type, the one the store names
(``Store.identity_source``): the STS caller ARN on S3, the account of the process's real uid
on a file store. Never an environment variable (``LOGNAME``, ``USER``): anyone sets those. A
typed name (``--by``) stands in only on a file store whose policy says ``identity:
{claimed_actor_on_file_stores: true}`` (a shared service account acting for people, say); it is
then recorded as ``asserted``, with the account that asserted it.
"""

from __future__ import annotations

import functools
import os
import pwd
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3artifacts.errors import ConfigError
from k3artifacts.policy.model import IdentityPolicy
from k3artifacts.settings import load
from k3artifacts.stores.awsclients import aws_errors, sts_client
from k3artifacts.stores.records import RecordStore

#: The credentials in the environment key the cache of STS's answer (boto3 reads them).
_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "AWS_PROFILE")

ActorSource = Literal["sts", "os-user", "asserted"]


class Actor(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    source: ActorSource
    #: For an asserted name: the identity that typed it (the store's answer).
    account: str | None = None

    def identities(self) -> frozenset[str]:
        """Every identity this actor stands for: a comparison with a reviewer or a proposer
        must see through an asserted name to the account behind it."""
        return frozenset(n for n in (self.name, self.account) if n)

    def label(self) -> str:
        return self.name if self.account is None else f"{self.name} (asserted by {self.account})"


def os_account() -> str:
    """The account of the process's real uid: a label for records no gate compares (a tuple's
    ``created_by``, an evaluation's ``attached_by``)."""
    return pwd.getpwuid(os.getuid()).pw_name


@functools.cache
def _sts_identity(endpoint: str | None, credentials: tuple[str | None, ...]) -> str:
    # One call per process, endpoint and credentials in the environment.
    with aws_errors("asking STS who is acting (GetCallerIdentity)"):
        return str(sts_client().get_caller_identity()["Arn"])


def store_identity(store: RecordStore) -> tuple[str, str]:
    """``(name, source)`` of whoever this process is on ``store``, as the store's identity
    source answers: never a variable anyone can set."""
    if store.identity_source == "sts":
        return _sts_identity(load().sts_endpoint_url,
                             tuple(os.environ.get(v) for v in _CREDENTIAL_ENV)), "sts"
    return os_account(), "os-user"


def resolve_actor(store: RecordStore, *, typed: str | None, identity: IdentityPolicy) -> Actor:
    """Who is acting on ``store``. ``typed`` is a ``--by`` given on the command line: refused
    (exit 9) where it cannot stand for the identity, rather than silently ignored."""
    name, source = store_identity(store)
    if typed is None or typed == name:
        return Actor(name=name, source=source)  # type: ignore[arg-type]
    if source == "sts":
        raise ConfigError(
            f"--by {typed!r}: on an S3 store the actor is your AWS identity ({name}), "
            "taken from STS; a flag cannot change it",
            hint="drop --by; act with the credentials of the person or role acting",
        )
    if not identity.claimed_actor_on_file_stores:
        raise ConfigError(
            f"--by {typed!r}: the store's policy does not let a typed name stand for who acts; "
            f"on a file store the actor is the account of your uid ({name})",
            hint="drop --by (or change the store's policy, `k3a policy propose`, to set "
            "`identity: {claimed_actor_on_file_stores: true}` for a service account acting "
            "for people)",
        )
    return Actor(name=typed, source="asserted", account=name)
