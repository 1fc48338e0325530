"""Errors with a meaning a script can act on: each class carries the CLI exit code, and only
the classes here set one (``tests/test_exit_codes.py``). :data:`EXIT_CODES` is the table of
what each code means, stable for scripts: the commands' help lines
(``k3artifacts/cli/exits.py``) and ``docs/reference/exit-codes.md`` say the same.
"""

from __future__ import annotations

import re
from typing import Any

#: Every exit code k3a uses and its general meaning; a command's help may say what the code
#: means for it, never use another.
EXIT_CODES: dict[int, str] = {
    0: "ok",
    1: "internal error (a bug: report it)",
    # click's own code for a bad flag; also a malformed id or digest (UsageError)
    2: "usage",
    # the release content broke a rule or failed verification at staging; nothing published
    3: "refused content",
    # VerifyMismatch, or a StoredRecordRefused: unreadable, malformed, missing from its
    # history, contradicting another, tampered with, or failing its signature check
    4: "verify mismatch or a stored record refused",
    5: "gate failed",
    # a channel pointer moved, a tuple id taken by another body
    6: "lost a race",
    7: "not found (also: no store there)",
    # network, 5xx after retries, a peer past its deadlines, or its answer malformed (BadAnswer)
    8: "upstream/storage unavailable",
    # a malformed store URL, profile, policy, image reference, a link planted in the node
    # cache (UnsafeCacheEntry), a file store path this account may not read or write
    9: "bad configuration",
    # the upstream refused the credentials this process sent (HTTP 401/403): a wrong, expired
    # or unscoped token, or a gated repo whose terms the token's account has not accepted
    10: "credentials refused",
    # set by the CLI on Ctrl-C, not an error class
    130: "interrupted (re-run resumes)",
}


class K3AError(Exception):
    exit_code = 1
    #: What the operator should do next; printed after the message.
    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class UsageError(K3AError):
    """A malformed argument (an id, a digest): the command was mistyped, nothing was tried."""

    exit_code = 2


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


def shown(name: str) -> str:
    """``name`` as it may be printed: a name with control or bidirectional formatting
    characters (which would rewrite the terminal line or reorder it) is shown escaped."""
    # Bidirectional overrides and isolates are format characters (Cf): not printable.
    return name if name.isprintable() else ascii(name)


def _refused_lines(noun: str, refusals: list[Refusal]) -> str:
    lines = "\n".join(f"  {shown(r.path)}: [{r.rule}] {r.detail}" for r in refusals)
    return f"{len(refusals)} {noun} refused:\n{lines}"


class ReleaseRefused(K3AError):
    exit_code = 3
    hint = "nothing was published; fix upstream or pass an explicit allowance, then re-run"

    def __init__(self, refusals: list[Refusal]):
        super().__init__(_refused_lines("file(s)", refusals))
        self.refusals = refusals

    def __reduce__(self):
        return (type(self), (self.refusals,), self.__dict__)


class VerifyMismatch(K3AError):
    exit_code = 4
    hint = ("do not serve this copy; `k3a stage REPO --revision COMMIT --repair` fetches the "
            "damaged files again and puts them back (same manifest digest)")


class StoredRecordRefused(K3AError):
    """A record in the store that k3a will not act on: unreadable, malformed, missing from its
    history, contradicting another record, or tampered with. One class (one exit code)
    whoever reads it; the subclasses say what was read and what to do."""

    exit_code = 4
    hint = ("do not act on it: records are written only by k3a; inspect the key named, "
            "restore it from a backup (or S3 versioning) and find who can write to the store")


class CorruptManifest(StoredRecordRefused, ValueError):
    """A revision manifest that does not parse (truncated, edited, not a manifest). Also a
    ValueError, as pydantic's error was: a node reading its own cached copy treats one that
    does not parse as absent and fetches the revision's manifest again."""

    hint = ("do not serve this revision: its manifest was changed outside k3a; restore it from "
            "a backup (or S3 versioning), or stage the revision again into another store")


class TamperedRecord(StoredRecordRefused):
    """Stored release records (tuples) whose body no longer derives its id, or does not
    parse: edited in the store, outside k3a. Each one is a :class:`Refusal`, as for release
    content, so a listing can report them all at once."""

    hint = (
        "do not deploy it; the record was changed outside k3a: restore its previous version "
        "(S3 versioning, or a backup of the store), and find who can write to the store"
    )

    def __init__(self, refusals: list[Refusal]):
        super().__init__(_refused_lines("record(s)", refusals))
        self.refusals = refusals

    def __reduce__(self):
        return (type(self), (self.refusals,), self.__dict__)


class UntrustedRecord(StoredRecordRefused):
    """A stored record k3a will not act on, and why: ``reason`` names the check it failed
    (:data:`RECORD_REFUSALS`). Raised wherever a signed record, a hash-chained history or a
    root of trust is read (``k3artifacts/trust``); the record's absence is never a pass."""

    hint = (
        "do not act on it: records are written only by k3a, signed by a key the store's policy "
        "trusts for them; restore the record from a backup (or S3 versioning) and find who can "
        "write to the store"
    )

    def __init__(self, key: str, reason: str, detail: str, *, hint: str | None = None):
        assert reason in RECORD_REFUSALS, reason
        super().__init__(f"{key}: refused ({reason}): {detail}", hint=hint)
        self.key = key
        self.reason = reason
        self.detail = detail

    def __reduce__(self):
        return (type(self), (self.key, self.reason, self.detail), self.__dict__)


class HistoryRewound(UntrustedRecord):
    """A history that went back behind the head this client verified before (the newest
    entries deleted and an older signed pointer copied over the current one, a frozen or
    restored copy of the store), lost an entry this client saw, or holds another entry where
    this client saw one (a fork): refused naming the history and both heads."""

    def __init__(self, key: str, reason: str, history: str, seen: str, found: str, *,
                 hint: str | None = None):
        super().__init__(key, reason, f"{history}: this client verified {seen} before; the "
                         f"store now shows {found}", hint=hint or (
                             "do not act on it: someone set the store back or rewrote this "
                             "history; compare with another client's view (`k3a channel "
                             "history`, `k3a policy history`, `k3a trust show`) and restore the "
                             "newer records from a backup (or S3 versioning)"))
        self.history, self.seen, self.found = history, seen, found

    def __reduce__(self):
        return (type(self), (self.key, self.reason, self.history, self.seen, self.found),
                self.__dict__)


class RecordMissing(StoredRecordRefused):
    """Records a tuple's signed record log names that are not in the store: deleted after
    they were recorded (by anyone who can write to the store), so their absence is not read
    as "never recorded". ``missing``: one line per record (its key, kind, signer, when)."""

    hint = ("do not act on their absence: restore the records named from a backup (or S3 "
            "versioning), or record them again with the command that made them, and find who "
            "can write to the store")

    def __init__(self, history: str, missing: list[str], *, hint: str | None = None):
        super().__init__(f"{history} names {len(missing)} record(s) missing from the store: "
                         + "; ".join(missing), hint=hint)
        self.history, self.missing = history, missing

    def __reduce__(self):
        return (type(self), (self.history, self.missing), self.__dict__)


class StaleStore(StoredRecordRefused):
    """The store's signed freshness head is missing or expired: a frozen or restored copy of
    the store, or one nobody refreshed within the lifetime its policy sets."""

    hint = ("do not act on it: if this is the live store, one of its root identities (or an "
            "identity holding `freshness`) runs `k3a trust refresh` (the `refresh-freshness` "
            "deployment does it daily); if it is a copy, read the live store instead")


#: Every ``UntrustedRecord.reason``, each a check a record can fail.
RECORD_REFUSALS = (
    # one record (trust/envelope.py)
    "unreadable",       # not UTF-8 JSON (truncated, garbled)
    "oversized",        # larger than any record k3a writes: refused before it is read
    "malformed",        # JSON, but not a signed record, or a signed body that does not parse
    "unsigned",         # no signature at all
    "untrusted-key",    # signed only by keys the policy does not name
    "wrong-role",       # signed by a known identity the policy does not let sign this kind
    "tampered",         # a trusted key's signature that does not verify, or a body that is
                        # not the one signed
    "wrong-kind",       # a record of another kind where this one is read
    "wrong-key",        # a record signed for another store key (moved, swapped)
    "signer-mismatch",  # the identity the statement names as its maker did not sign it
    "another-store",    # signed for another store's id (or for none, and not vouched for as
                        # one this store held when it was given its id)
    # a hash-chained history (trust/chain.py)
    "gap",              # an entry missing between the head and the start (or checkpoint)
    "edit",             # an entry changed after it was signed
    "fork",             # a validly signed entry that is not the one its successor names
    "rewound",          # the head set back behind entries logged, or seen, after it
    # the root of trust (trust/root.py)
    "threshold",        # fewer distinct root identities signed than the change needs
    "root-mismatch",    # the store's root is not the one this client pinned, nor follows it
)


class GateFailed(K3AError):
    exit_code = 5


class GatesRefused(GateFailed):
    """A move its gates refuse. ``report`` is every gate's result, the passes too (a
    ``policy.results.GateReport``, a layer above this module): a dry run shows the whole
    table beside the refusal."""

    def __init__(self, message: str, *, report: Any, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.report = report


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


class BadAnswer(Unavailable):
    """A peer (the Hub, a registry, Prometheus, the Kubernetes API, an endpoint) answered
    something malformed, out of bounds or meaningless: refused with the peer named, never
    used, never a pass."""

    hint = ("the peer named is misbehaving, or is not what its URL was meant to reach: check "
            "the URL, then ask its operator")


class ConfigError(K3AError):
    exit_code = 9


class CredentialsRefused(K3AError):
    """An upstream that answered, and refused who this process said it was (HTTP 401/403):
    not an outage, so never retried and never "check network access"."""

    exit_code = 10


class TrustRootError(ConfigError):
    """This client's root of trust for a store is missing, malformed, writable by others, or
    another than the one asked for: k3a trusts nothing of that store until it is fixed."""

    hint = "`k3a trust show` says what this client pins; `k3a trust init` pins a root"


class MigrationNeeded(ConfigError):
    """A store older than signed records: its policy and histories are read as found, and
    nothing moves on it, until one of its root identities migrates it."""

    hint = ("one of the store's root identities runs `k3a trust migrate` (it signs the "
            "unsigned histories as found; docs/policy-and-identity.md, Migration)")


class UnsafeCacheEntry(ConfigError):
    """A symbolic link (or a file where a directory belongs) under the node cache root: k3a
    neither follows nor removes it, and writes nothing through it."""

    hint = (
        "something that can write to the cache root planted it: inspect and remove it "
        "yourself (`ls -l`, then `rm` the link, never `rm -r` through it), find who can write "
        "there, then re-run"
    )


def plain_validation_errors(exc: Any) -> str:
    """A pydantic ValidationError in plain words: which field, what value, what was expected.

    For errors in files a person wrote (an evaluation report, a profile, a policy): pydantic's
    own text names its internal error types and links to its documentation.
    """
    lines = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err.get("loc", ())) or "(the document)"
        kind = err.get("type", "")
        msg = str(err.get("msg", ""))
        if kind == "missing":
            lines.append(f"{where}: missing (a required field)")
            continue
        if kind == "extra_forbidden":
            lines.append(f"{where}: not a known field")
            continue
        msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if msg.startswith("Input should be "):
            msg = "expected " + msg.removeprefix("Input should be ")
        elif msg.startswith("String should have "):
            msg = "expected " + msg.removeprefix("String should have ")
        msg = re.sub(r" or instance of \w+", "", msg).replace("a valid dictionary", "an object")
        value = err.get("input")
        shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        lines.append(f"{where}: got {shown}, {msg}" if err.get("loc") else f"{where}: {msg}")
    return "; ".join(lines)
