"""How a message names a file of a policy written out for one judgement.

The gates read the policy's files from a temporary directory
(:meth:`~.document.PolicyDocument.written_to`) that is gone when anyone reads what they said.
While a judgement runs, its directory is known here with the name of the policy it holds, and
:func:`named` turns a path into it into "policy v2 (1f3a...) signing/trusted-keys.yaml".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

#: The policies written out for the judgements in progress in this context: (directory, how
#: the policy is named).
_WRITTEN: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("k3a_policies_written",
                                                               default=())


@contextmanager
def naming(root: str, shown: str) -> Iterator[None]:
    """While the block runs, :func:`named` shows paths under ``root`` as ``shown``'s files."""
    token = _WRITTEN.set((*_WRITTEN.get(), (root, shown)))
    try:
        yield
    finally:
        _WRITTEN.reset(token)


def named(text: str) -> str:
    """``text`` with each path into a policy written out for a judgement in progress shown as
    the policy and the file inside it."""
    for root, shown in _WRITTEN.get():
        text = text.replace(root + "/", shown + " ").replace(root, shown)
    return text
