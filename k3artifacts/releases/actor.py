"""Who is acting: the identity recorded in tuples, reviews and channel history entries.

For records that gates compare (a promoter against a reviewer), the identity must come from a
source the actor cannot just type:

* on an S3 store, the caller identity AWS authenticated (STS ``GetCallerIdentity``: an ARN);
  no flag or variable overrides it;
* on a file store, the OS user running the process; a typed name (``--by`` or ``$K3A_ACTOR``)
  stands in only where ``policies/promotion-gates.yaml`` says ``identity:
  {claimed_actor_on_file_stores: true}`` (a shared service account acting for people, say),
  and is then recorded as ``claimed``.
"""

from __future__ import annotations

import functools
import getpass
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict

from k3artifacts.errors import ConfigError
from k3artifacts.settings import load
from k3artifacts.stores.awsclients import aws_errors, sts_client
from k3artifacts.stores.base import Store

_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "AWS_PROFILE")

ActorSource = Literal["sts", "os-user", "claimed"]


class Actor(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    source: ActorSource


def current_actor() -> str:
    """``$K3A_ACTOR``, else the login name: a label for records no gate compares (a tuple's
    ``created_by``, an evaluation's ``attached_by``)."""
    return load().actor or getpass.getuser()


@functools.cache
def _sts_identity(endpoint: str | None, credentials: tuple[str | None, ...]) -> str:
    # One call per process, endpoint and credentials in the environment.
    with aws_errors("asking STS who is acting (GetCallerIdentity)"):
        return str(sts_client().get_caller_identity()["Arn"])


def resolve_actor(store: Store, *, typed: str | None, claims_allowed: bool) -> Actor:
    """Who is acting on ``store``. ``typed`` is a ``--by`` given on the command line: refused
    (exit 9) where it cannot stand for the identity, rather than silently ignored."""
    if store.identity_source == "sts":
        arn = _sts_identity(
            load().sts_endpoint_url,
            tuple(os.environ.get(v) for v in _CREDENTIAL_ENV),
        )
        if typed is not None and typed != arn:
            raise ConfigError(
                f"--by {typed!r}: on an S3 store the actor is your AWS identity ({arn}), "
                "taken from STS; a flag cannot change it",
                hint="drop --by; act with the credentials of the person or role acting",
            )
        return Actor(name=arn, source="sts")
    claimed = typed or load().actor
    if claimed is not None and claims_allowed:
        return Actor(name=claimed, source="claimed")
    if typed is not None:
        raise ConfigError(
            f"--by {typed!r}: the gate policy does not let a typed name stand for who acts; "
            "on a file store the actor is the OS user",
            hint="drop --by (or set `identity: {claimed_actor_on_file_stores: true}` in "
            "policies/promotion-gates.yaml, for a service account acting for people)",
        )
    return Actor(name=getpass.getuser(), source="os-user")
