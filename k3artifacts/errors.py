"""Errors with a meaning a script can act on: each class carries the CLI exit code.

Exit codes (documented in the README, stable for scripts):
  0  success
  1  unexpected internal error (a bug: report it)
  2  usage error (bad flag or argument; click's own code)
  3  refused: the release content broke a rule or failed verification; nothing was published
  4  verify mismatch: a published file no longer matches its manifest
  5  gate failed: promotion refused by a policy gate
  6  conflict: lost a race (channel pointer moved, tuple id taken by another body)
  7  not found: unknown revision, tuple, channel or store path
  8  upstream or storage unavailable (network, 5xx after retries, unreachable endpoint)
  9  bad configuration (malformed store URL, profile, policy file, image reference)
"""

from __future__ import annotations


class K3AError(Exception):
    exit_code = 1
    #: What the operator should do next; printed after the message.
    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class Refusal(K3AError):
    """One file broke one rule. Carried inside :class:`ReleaseRefused`."""

    exit_code = 3

    def __init__(self, path: str, rule: str, detail: str):
        super().__init__(f"{path}: {rule}: {detail}")
        self.path = path
        self.rule = rule
        self.detail = detail

    def __reduce__(self):
        # Refusals cross process boundaries (a Dask worker's task result); pickle's default
        # would call __init__ with the formatted message alone.
        return (type(self), (self.path, self.rule, self.detail), self.__dict__)


class ReleaseRefused(K3AError):
    exit_code = 3
    hint = "nothing was published; fix upstream or pass an explicit allowance, then re-run"

    def __init__(self, refusals: list[Refusal]):
        lines = "\n".join(f"  {r.path}: [{r.rule}] {r.detail}" for r in refusals)
        super().__init__(f"{len(refusals)} file(s) refused:\n{lines}")
        self.refusals = refusals

    def __reduce__(self):
        return (type(self), (self.refusals,), self.__dict__)


class VerifyMismatch(K3AError):
    exit_code = 4
    hint = "do not serve this copy; re-stage the revision or restore the files from the store"


class GateFailed(K3AError):
    exit_code = 5


class Conflict(K3AError):
    exit_code = 6


class AlreadyExists(Conflict):
    def __init__(self, key: str):
        super().__init__(f"{key} already exists and is immutable")
        self.key = key


class NotFound(K3AError):
    exit_code = 7


class Unavailable(K3AError):
    exit_code = 8


class ConfigError(K3AError):
    exit_code = 9
