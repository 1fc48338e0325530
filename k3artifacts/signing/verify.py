"""Check a revision's signature, then its bytes: what a node runs before it serves.

Order matters: the signature is checked against trusted keys first (a few KB read), then the
manifest it vouches for is compared with the signed digests, and only then are the weights
read, once, with xxh3-128 against that manifest (``--full``: sha256). A missing signature, an
untrusted key, or a signature over other bytes stops before the weights are read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import NotFound, VerifyMismatch
from k3artifacts.revisions.manifest import META_DIR, ShardManifest, revision_prefix
from k3artifacts.signing.dsse import BundleError, verify_bundle
from k3artifacts.signing.revision import (
    IGNORED,
    MANIFEST_REL,
    SIGNATURE_REL,
    check_revision_statement,
)
from k3artifacts.stores.base import Store
from k3artifacts.stores.verify import Problem, VerifyReport, verify_revision

#: ``VerifyReport.algorithm`` of a report that stopped at the signature.
SIGNATURE_STAGE = "signature"


@dataclass
class SignedReport:
    report: VerifyReport
    #: Name of the trusted key that signed, when the signature verified.
    key_name: str | None = None
    key_hint: str | None = None
    #: The manifest read beside the signature: trusted only once :meth:`raise_for_problems`
    #: passed.
    manifest: ShardManifest | None = None

    def raise_for_problems(self) -> None:
        problems = self.report.problems
        if problems and self.report.algorithm == SIGNATURE_STAGE:
            lines = "\n".join(f"  {p.path}: {p.reason}" for p in problems)
            raise VerifyMismatch(
                f"{self.report.target}: refused by its signature ({len(problems)} problem(s); "
                f"no weight byte was read):\n{lines}",
                hint="do not serve this copy; restore the revision from a trusted store or "
                "re-stage it, and sign only what `k3a verify --full` accepts",
            )
        self.report.raise_for_problems()


def _meta_files(store: Store | None, directory: Path | None, prefix: str) -> list[str]:
    """Paths under ``.k3a/`` of the revision, relative to it."""
    if directory is not None:
        meta = directory / META_DIR
        return sorted(
            Path(d, f).relative_to(directory).as_posix()
            for d, _, files in os.walk(meta) for f in files
        )
    start = len(prefix) + 1
    return [k[start:] for k in store.list_keys(f"{prefix}/{META_DIR}/")]


def _read(store: Store | None, directory: Path | None, prefix: str, rel: str) -> bytes | None:
    if directory is not None:
        try:
            return directory.joinpath(*rel.split("/")).read_bytes()
        except FileNotFoundError:
            return None
    found = store.read(f"{prefix}/{rel}")
    return None if found is None else found.data


def verify_signed_revision(
    trusted: dict[str, ec.EllipticCurvePublicKey],
    *,
    store: Store | None = None,
    repo_id: str | None = None,
    commit: str | None = None,
    directory: Path | None = None,
    full: bool = False,
    read_weights: bool = True,
    workers: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    on_manifest: Callable[[ShardManifest], None] | None = None,
    on_file: Callable[..., None] | None = None,
) -> SignedReport:
    """Signature, manifest against the signed digests, then (``read_weights``) every byte.

    Problems are collected in the report (``report.raise_for_problems()`` refuses); with
    ``read_weights=False`` only the signature and the manifest are checked (a few KB read).
    ``workers``: files hashed at once; None leaves it to
    :func:`~k3artifacts.stores.verify.verify_revision`, the one place that decides it for
    every verification (one per usable core on a local disk).
    """
    if directory is None and store is not None:
        directory = store.local_path(revision_prefix(repo_id, commit))
    prefix = "" if repo_id is None else revision_prefix(repo_id, commit)
    target = str(directory) if repo_id is None else f"{repo_id}@{commit} in {store.url}"
    raw = _read(store, directory, prefix, MANIFEST_REL)
    if raw is None:
        raise NotFound(f"{target}: not a published revision (no {MANIFEST_REL})",
                       hint="stage it first with `k3a stage`, or check the commit")
    try:
        manifest = ShardManifest.parse(raw)
    except ValueError as exc:
        broken = SignedReport(VerifyReport(target, hashlib.sha256(raw).hexdigest(), 0, 0,
                                           SIGNATURE_STAGE))
        reason = str(exc).splitlines()[0]
        broken.report.problems.append(Problem(MANIFEST_REL, f"not a valid manifest: {reason}"))
        return broken
    early = SignedReport(VerifyReport(target, manifest.digest(), len(manifest.files),
                                      manifest.total_bytes, SIGNATURE_STAGE))

    def refuse(path: str, reason: str) -> SignedReport:
        early.report.problems.append(Problem(path, reason))
        return early

    bundle = _read(store, directory, prefix, SIGNATURE_REL)
    if bundle is None:
        return refuse(SIGNATURE_REL, "missing: the revision is not signed "
                      "(`k3a sign org/name@commit --signing-key KEY`)")
    try:
        verified = verify_bundle(bundle, trusted)
    except BundleError as exc:
        return refuse(SIGNATURE_REL, str(exc))
    early.key_name, early.key_hint = verified.key_name, verified.key_hint
    early.manifest = manifest
    for problem in check_revision_statement(verified.statement, manifest, raw):
        early.report.problems.append(Problem(problem.path, problem.reason))
    allowed = {MANIFEST_REL, *IGNORED}
    for rel in _meta_files(store, directory, prefix):
        if rel not in allowed:
            early.report.problems.append(Problem(rel, "not covered by the signature"))
    if early.report.problems or not read_weights:
        return early
    # The manifest's bytes are the signed ones: now one pass over the weights against it.
    kwargs = dict(full=full, expect_digest=manifest.digest(), workers=workers,
                  on_bytes=on_bytes, on_manifest=on_manifest, on_file=on_file)
    if directory is not None:
        report = verify_revision(directory=directory, **kwargs)
        report.target = target
    else:
        report = verify_revision(store=store, repo_id=repo_id, commit=commit, **kwargs)
    return SignedReport(report, verified.key_name, verified.key_hint, manifest)
