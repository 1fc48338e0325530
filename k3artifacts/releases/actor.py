"""Who is acting: the name recorded in tuples and channel history entries."""

from __future__ import annotations

import getpass
import os

#: Names the actor where no stronger identity is available.
ACTOR_ENV = "K3A_ACTOR"


def current_actor() -> str:
    """``$K3A_ACTOR``, else the login name of the process."""
    return os.environ.get(ACTOR_ENV) or getpass.getuser()
