"""Flow ``stage-release``: one Hub revision becomes a verified, published revision in the store.

    resolve commit (task) -> plan -> one task per file: download, hash, check into quarantine,
    handed to the store as soon as it verifies -> manifest (index check, license, remote code)
    -> publish -> release tuple (when ``image`` and ``profile`` are given) -> artifacts

A thin layer over :class:`k3artifacts.staging.engine.Stager`; ``k3a stage`` runs the same steps
without Prefect.

Resume: the library's quarantine, not Prefect's result cache
-----------------------------------------------------------------
A failed or killed run, run again with the same arguments, downloads only what is missing:
``Stager.plan()`` finds every file already logged in the quarantine's ``verified.jsonl`` (and
still on disk with the size and mtime it had when verified, or already in the store's
in-progress revision), and a file cut off mid-transfer resumes from its ``partial/*.part``
with a Range request. Prefect result caching keyed on (commit, path, upstream sha256) was the
alternative; it is not used (tasks run with ``NO_CACHE`` and persist nothing) because:

* it remembers finished files only: a 5 GB shard killed at 4.9 GB would restart from byte 0,
  whereas the quarantine resumes it, and for a 1.56 TB revision the partial shards are what
  an interruption costs;
* it needs a result store shared by every worker, configured before the first run, for
  nothing the quarantine does not already record (fsynced, next to the bytes it describes);
* a cached result is a claim about bytes it cannot see: if the quarantine copy was removed or
  altered, a cache hit would skip a file that is not there, so the flow would re-check the
  disk anyway, which is exactly what ``plan()`` does;
* ``k3a stage`` and the flow then share one resume mechanism, tested once.

One run per revision
--------------------
A global concurrency limit of 1 named ``k3a-stage-<org>--<name>-<commit>`` (Prefect names
refuse ``/``) wraps the run: a second run of the same revision waits, visibly in the UI and
its log, and then finds the revision published and does nothing. The library's per-revision
file lock in the quarantine stays underneath it; without the Prefect limit the second run
would fail on that lock instead of waiting.

Fan-out
-------
Per-file tasks use the flow's task runner: a thread pool by default, or a Dask cluster when
``K3A_DASK_ADDRESS`` is set (:func:`flows.common.task_runner_from_env`). A task rebuilds its
own :class:`Stager` from plain parameters (no live object crosses a process boundary) and
writes into the shared quarantine without taking the revision lock, which the flow process
holds for the whole run: the lock keeps other *runs* out, while the tasks of this run each
write their own ``partial/<hash>.part`` and ``files/<path>``, and append one line each to
``verified.jsonl`` (a line torn by concurrent appends on a file system without atomic
O_APPEND fails to parse and that file is simply fetched again). Workers on other machines
need the quarantine on a shared POSIX volume (FSx for Lustre) and the store reachable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists
from prefect.futures import as_completed
from prefect.tasks import exponential_backoff

from k3artifacts.config import default_quarantine
from k3artifacts.errors import K3AError, Refusal, ReleaseRefused, Unavailable
from k3artifacts.releases.binding import create_tuple
from k3artifacts.revisions.refs import check_repo_id
from k3artifacts.serving.images import resolve_image
from k3artifacts.serving.profiles import load_profile, serving_spec
from k3artifacts.staging.download import RetryPolicy
from k3artifacts.staging.engine import StageOptions, Stager, StageResult
from k3artifacts.staging.hub import HubSource, RemoteFile
from k3artifacts.staging.quarantine import Quarantine, VerifiedEntry
from k3artifacts.stores.base import Store
from k3artifacts.stores.file import FileStore

from .common import revision_slug, slug, store_from, task_runner_from_env
from .progress import ByteProgress, observer_for

DEFAULT_REPO = "moonshotai/Kimi-K3"


def _network_error(task, task_run, state) -> bool:
    """Retry a task only when the network gave out (``Unavailable``): wrong bytes at a pinned
    commit (``Refusal``) will not become right, and anything else is a bug or a full disk."""
    try:
        state.result()
    except Unavailable:
        return True
    except Exception:  # noqa: BLE001 - any other failure: no retry
        return False
    return False


@task(name="resolve-commit", retries=3, retry_delay_seconds=exponential_backoff(10),
      retry_condition_fn=_network_error, cache_policy=NO_CACHE, persist_result=False)
def resolve_commit(endpoint: str | None, repo_id: str, revision: str) -> str:
    return HubSource(endpoint=endpoint).resolve(repo_id, revision)


@dataclass(frozen=True)
class FetchJob:
    """Everything a task needs to fetch one file, as plain picklable values (a Dask worker in
    another process rebuilds the Stager from it; the HF token and AWS credentials come from
    that worker's environment, never from parameters)."""

    endpoint: str | None
    store_url: str
    repo_id: str
    commit: str
    quarantine_root: str
    options: StageOptions
    remote: RemoteFile
    progress_id: str | None = None


@task(name="fetch-file", task_run_name="fetch {job.remote.path}", retries=3,
      retry_delay_seconds=exponential_backoff(10), retry_condition_fn=_network_error,
      cache_policy=NO_CACHE, persist_result=False)
def fetch_file(job: FetchJob) -> VerifiedEntry:
    """Download, hash and check one file into quarantine, then hand it to the store."""
    # Not entered: the revision lock belongs to the flow run (see the module docstring).
    quarantine = Quarantine(Path(job.quarantine_root), job.repo_id, job.commit)
    stager = Stager(HubSource(endpoint=job.endpoint), store_from(job.store_url), job.repo_id,
                    job.commit, quarantine, job.options, observer_for(job.progress_id))
    stager.open_writer()
    entry = stager.fetch_file(job.remote)
    get_run_logger().info("%s: %d bytes verified, sha256 %s", job.remote.path,
                          entry.record.size, entry.record.sha256)
    return entry


def ensure_limit(name: str) -> None:
    """Create the revision's concurrency limit (1 slot) unless it exists; racing runs may both
    try, one gets ObjectAlreadyExists, both then share it."""
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass


def quarantine_root(store: Store, explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    return default_quarantine(store.root if isinstance(store, FileStore) else None)


@flow(name="stage-release", task_runner=task_runner_from_env(), persist_result=False)
def stage_release(
    repo_id: str = DEFAULT_REPO,
    revision: str = "main",
    store_url: str | None = None,
    quarantine: str | None = None,
    endpoint: str | None = None,
    allow_pickle: bool = False,
    keep_quarantine: bool = False,
    window_bytes: int | None = None,
    attempts: int = 8,
    backoff: float = 1.0,
    task_retries: int = 3,
    task_retry_delay: float = 10.0,
    image: str | None = None,
    profile: str | None = None,
) -> dict:
    """Stage ``repo_id`` at ``revision`` (branch, tag or commit) into ``store_url``.

    ``attempts``/``backoff``: per-file HTTP retries inside one task (resuming with Range);
    ``task_retries``/``task_retry_delay``: Prefect retries of a file task whose attempts ran
    out on network errors (never on a verification refusal). ``window_bytes``: drop each
    shard's quarantine copy once the store holds it (bounded local disk, for an S3 store).
    ``image`` and ``profile`` together also make the release tuple.
    """
    logger = get_run_logger()
    check_repo_id(repo_id)
    if (image is None) != (profile is None):
        raise K3AError("a release tuple needs both image and profile (or neither)")
    store = store_from(store_url)
    commit = resolve_commit(endpoint, repo_id, revision)
    if commit != revision:
        logger.info("resolved %s@%s to commit %s", repo_id, revision, commit)
    options = StageOptions(
        allow_pickle=allow_pickle,
        keep_quarantine=keep_quarantine,
        window_bytes=window_bytes,
        retry=RetryPolicy(attempts=attempts, backoff=backoff),
    )
    limit = f"k3a-stage-{revision_slug(repo_id, commit)}"
    ensure_limit(limit)
    logger.info("taking concurrency slot %s (one staging run per revision)", limit)
    with concurrency(limit, occupy=1, strict=True):
        result = _stage(store, repo_id, commit, quarantine_root(store, quarantine), endpoint,
                        options, task_retries, task_retry_delay)
    summary = result.__dict__ | {"tuple_id": None}
    if image is not None:
        summary["tuple_id"] = make_tuple(store, repo_id, commit, image, profile)
    _summary_artifact(summary)
    return summary


def _stage(
    store: Store,
    repo_id: str,
    commit: str,
    qroot: Path,
    endpoint: str | None,
    options: StageOptions,
    task_retries: int,
    task_retry_delay: float,
) -> StageResult:
    logger = get_run_logger()
    started = time.monotonic()
    key = slug("k3a", repo_id, commit[:12])
    with Quarantine(qroot, repo_id, commit) as q:
        existing = store.read_manifest(repo_id, commit)
        if existing is not None:
            logger.info(
                "%s@%s is already published in %s; nothing to do", repo_id, commit, store.url
            )
            return StageResult.of(existing, store, started, already=True)
        stager = Stager(HubSource(endpoint=endpoint), store, repo_id, commit, q, options)
        stager.open_writer()
        files, reusable = stager.plan()
        todo = sorted((f for f in files if f.path not in reusable), key=lambda f: -f.size)
        logger.info("%d files, %d already verified by an earlier run, %d to fetch",
                    len(files), len(reusable), len(todo))
        rows = {f.path: {"path": f.path, "size": f.size, "sha256": "", "status": "pending"}
                for f in files}
        progress = ByteProgress(
            f"{key}-progress", f"bytes of {repo_id}@{commit[:12]} verified in quarantine",
            total=sum(f.size for f in files), done=sum(e.record.size for e in reusable.values()),
        )
        try:
            entries = []
            for f in files:
                if f.path in reusable:
                    entries.append(stager.reuse(reusable[f.path]))
                    rows[f.path].update(sha256=reusable[f.path].record.sha256, status="reused")
            entries += _fetch_all(stager, todo, store, qroot, endpoint, options, progress, rows,
                                  task_retries, task_retry_delay)
            try:
                manifest = stager.build_manifest(entries)
            except ReleaseRefused:
                stager.abandon()
                raise
            stager.publish(manifest)
        finally:
            progress.close()
            create_table_artifact(
                list(rows.values()), key=f"{key}-files",
                description=f"files of {repo_id}@{commit}: size, sha256, status",
            )
        result = StageResult.of(manifest, store, started, already=False)
        result.downloaded_bytes = sum(f.size for f in todo)
        result.reused_files = len(reusable)
    if not options.keep_quarantine:
        q.remove()
    return result


def _fetch_all(stager, todo, store, qroot, endpoint, options, progress, rows, task_retries,
               task_retry_delay) -> list[VerifiedEntry]:
    fetch = fetch_file.with_options(
        retries=task_retries, retry_delay_seconds=exponential_backoff(task_retry_delay)
    )
    jobs = {
        fetch.submit(FetchJob(endpoint, store.url, stager.repo_id, stager.commit, str(qroot),
                              options, remote, progress.id)): remote
        for remote in todo
    }
    entries: list[VerifiedEntry] = []
    refusals: list[Refusal] = []
    failures: list[str] = []
    for fut in as_completed(list(jobs)):
        remote = jobs[fut]
        try:
            entry = fut.result()
        except Refusal as refusal:
            refusals.append(refusal)
            rows[remote.path]["status"] = f"refused: {refusal.rule}"
            continue
        except Exception as exc:  # noqa: BLE001 - reported below, the run fails on it
            failures.append(f"{remote.path}: {exc}")
            rows[remote.path]["status"] = f"failed: {type(exc).__name__}"
            continue
        entries.append(entry)
        rows[remote.path].update(sha256=entry.record.sha256, status="downloaded")
        progress.file_done(remote.path, remote.size)
    if refusals:
        stager.abandon()
        raise ReleaseRefused(sorted(refusals, key=lambda r: r.path))
    if failures:
        # Work done is kept (quarantine and the store's in-progress revision): a re-run
        # fetches only these files, resuming their partial downloads.
        raise Unavailable(
            f"{len(failures)} file(s) could not be fetched:\n  " + "\n  ".join(sorted(failures)),
            hint="re-run the flow with the same parameters; verified files are not fetched again",
        )
    return entries


@task(name="make-tuple", cache_policy=NO_CACHE, persist_result=False)
def make_tuple(store: Store, repo_id: str, commit: str, image: str, profile: str) -> str:
    """Bind the published revision, the image (a tag is pinned to its digest now, once) and
    the serving profile (a name in manifests/profiles/ or a site profile file carrying the
    FSx/region facts) into a release tuple; the same inputs give the same id."""
    spec = serving_spec(load_profile(profile))
    created = create_tuple(store, repo_id, commit, resolve_image(image), spec,
                           created_by="prefect:stage-release")
    get_run_logger().info("release tuple %s (%s)", created.release.id,
                          "created" if created.new else "already existed")
    return created.release.id


def _summary_artifact(summary: dict) -> None:
    code = ", ".join(f"`{p}`" for p in summary["remote_code"]) or "none"
    lines = [
        f"# {summary['repo_id']} @ `{summary['commit']}`",
        "",
        "| | |",
        "|---|---|",
        f"| state | {'already published (no-op)' if summary['already_published'] else 'published'}"
        " |",
        f"| location | `{summary['location']}` |",
        f"| manifest digest | `{summary['manifest_digest']}` |",
        f"| license sha256 | `{summary['license_sha256'] or 'no license file'}` |",
        f"| remote code (review before promotion) | {code} |",
        (f"| files | {summary['files']} ({summary['total_bytes']:,} bytes; "
         f"{summary['downloaded_bytes']:,} downloaded, {summary['reused_files']} reused) |"),
        f"| release tuple | "
        f"{('`' + summary['tuple_id'] + '`') if summary['tuple_id'] else 'not made'} |",
    ]
    create_markdown_artifact(
        "\n".join(lines), key=slug("k3a", summary["repo_id"], summary["commit"][:12], "summary"),
        description="staged revision: what to review and where it lives",
    )
