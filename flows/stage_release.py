"""Flow ``stage-release``: one Hub revision becomes a verified, published revision in the store.

    resolve commit (task) -> plan (a table artifact, before any transfer: each file downloaded,
    reused from a published revision inside the store, or already present) -> one task per
    file to download: hash, check into quarantine, handed to the store as soon as it verifies
    -> manifest (index check, license, remote code) -> publish -> release tuple (when
    ``image`` and ``profile`` are given) -> artifacts

A thin adapter over the library's one staging engine (:func:`k3artifacts.staging.engine.stage`):
it supplies a runner that turns each per-file job into a Prefect task, an observer that keeps
the files table and progress artifact, and the per-revision concurrency limit. ``k3a stage``
runs the same engine with a thread pool.

Resume: the library's quarantine, not Prefect's result cache
-----------------------------------------------------------------
A failed or killed run, run again with the same arguments, downloads only what is missing:
``plan_stage()`` (``k3artifacts/staging/engine.py``) finds every file already logged in the
quarantine's ``verified.jsonl`` (and still on disk with the size and mtime it had when
verified, or already in the store's in-progress revision), and a file cut off mid-transfer
resumes from its ``partial/*.part`` with a Range request. Prefect result caching keyed on
(commit, path, upstream sha256) was the alternative; it is not used (tasks run with
``NO_CACHE`` and persist nothing) because:

* it remembers finished files only: a 5 GB shard killed at 4.9 GB would restart from byte 0,
  whereas the quarantine resumes it, and for a 1.56 TB revision the partial shards are what
  an interruption costs;
* it needs a result store shared by every worker, configured before the first run, for
  nothing the quarantine does not already record (fsynced, next to the bytes it describes);
* a cached result is a claim about bytes it cannot see: if the quarantine copy was removed or
  altered, a cache hit would skip a file that is not there, so the flow would re-check the
  disk anyway, which is exactly what ``plan_stage()`` does;
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
``K3A_DASK_ADDRESS`` is set (:func:`flows.common.task_runner_from_env`). A task carries plain
values (:class:`k3artifacts.staging.worker.FileJob`); in the flow's process it runs with the
run's own writer and quarantine, elsewhere the worker rebuilds them once per process. On a
file store / FSx the quarantine beside the store is shared by every worker. On S3 there is no
shared disk: each worker downloads into its own local quarantine (``$K3A_QUARANTINE`` or the
user cache), uploads straight to S3, drops its local copy and returns a small verified record;
the flow builds the manifest from the records and publishes. A task that dies mid-shard is
retried by Prefect (or rescheduled by Dask) on any worker and starts that file again; its
half-finished multipart upload is never visible and is aborted once the revision is sealed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists
from prefect.futures import as_completed
from prefect.tasks import exponential_backoff

from k3artifacts.errors import K3AError, ReleaseRefused, Unavailable
from k3artifacts.reporting import events
from k3artifacts.revisions.refs import check_repo_id
from k3artifacts.serving.tuple_create import create_release_tuple
from k3artifacts.staging.download import Ranges, RetryPolicy
from k3artifacts.staging.engine import StageOptions, StageResult, stage
from k3artifacts.staging.hub import HubSource
from k3artifacts.staging.quarantine import quarantine_root_for
from k3artifacts.staging.worker import FileJob, FileOutcome, run_file_job
from k3artifacts.stores.base import Store

from .artifacts import size
from .common import revision_slug, slug, store_from, task_runner_from_env
from .logs import quiet_task_completions
from .naming import label_run, short, stage_name, tags
from .notify import notify
from .progress import FlowObserver
from .stage_summary import closing_line, summary_artifact

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


@task(name="fetch-file", task_run_name="fetch {job.remote.path}", retries=3,
      retry_delay_seconds=exponential_backoff(10), retry_condition_fn=_network_error,
      cache_policy=NO_CACHE, persist_result=False)
def fetch_file(job: FileJob) -> FileOutcome:
    """Download, hash and check one file, then hand it to the store (the engine's job)."""
    quiet_task_completions()
    outcome = run_file_job(job)
    record = outcome.entry.record
    get_run_logger().info("%s: %s verified, sha256:%s", job.remote.path, size(record.size),
                          record.sha256)
    return outcome


class TaskRunner:
    """The engine's runner as Prefect tasks: one per file, on the flow's task runner."""

    def __init__(self, retries: int, retry_delay: float):
        self.task = fetch_file.with_options(
            retries=retries, retry_delay_seconds=exponential_backoff(retry_delay)
        )

    def run(self, jobs: list[FileJob]) -> Iterator[tuple[FileJob, FileOutcome | BaseException]]:
        futures = {self.task.submit(job): job for job in jobs}
        for fut in as_completed(list(futures)):
            try:
                yield futures[fut], fut.result()
            except Exception as exc:  # noqa: BLE001 - the engine decides what it means
                yield futures[fut], exc

    def stop(self) -> None:
        # Every task is already submitted to the task runner, which cannot recall them; the
        # engine fails the run once they end (a refused or failed file publishes nothing).
        pass


def ensure_limit(name: str) -> None:
    """Create the revision's concurrency limit (1 slot) unless it exists; racing runs may both
    try, one gets ObjectAlreadyExists, both then share it."""
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass


@flow(name="stage-release", flow_run_name=stage_name, task_runner=task_runner_from_env(),
      persist_result=False)
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
    reverify_reused: bool = False,
    progress_interval: float | None = None,
    streams: int = Ranges().streams,
) -> dict:
    """Stage ``repo_id`` at ``revision`` (branch, tag or commit) into ``store_url``.

    ``attempts``/``backoff``: per-file HTTP retries inside one task (resuming with Range);
    ``task_retries``/``task_retry_delay``: Prefect retries of a file task whose attempts ran
    out on network errors (never on a verification refusal). ``window_bytes``: drop each
    shard's quarantine copy once the store holds it (bounded local disk, for an S3 store).
    ``image`` and ``profile`` together also make the release tuple. ``reverify_reused``:
    re-hash files reused from a published revision after a file store copied them (as
    ``k3a stage --reverify-reused``). ``progress_interval``: seconds between updates of the
    live status, progress and files artifacts (default ``$K3A_PROGRESS_INTERVAL``, else 30).
    ``streams``: connections per large file, each fetching ranges from the Hub's CDN (as
    ``k3a stage --streams``).
    """
    quiet_task_completions()
    logger = get_run_logger()
    check_repo_id(repo_id)
    if (image is None) != (profile is None):
        raise K3AError("a release tuple needs both image and profile (or neither)")
    store = store_from(store_url)
    commit = resolve_commit(endpoint, repo_id, revision)
    if commit != revision:
        logger.info("resolved %s@%s to commit %s", repo_id, revision, commit)
    label_run(tags(repo=repo_id, commit=commit), name=f"stage {repo_id}@{short(commit)}")
    options = StageOptions(
        allow_pickle=allow_pickle,
        keep_quarantine=keep_quarantine,
        window_bytes=window_bytes,
        retry=RetryPolicy(attempts=attempts, backoff=backoff),
        reverify_reused=reverify_reused,
        ranges=Ranges(streams=streams),
    )
    limit = f"k3a-stage-{revision_slug(repo_id, commit)}"
    ensure_limit(limit)
    logger.info("taking concurrency slot %s (one staging run per revision)", limit)
    with concurrency(limit, occupy=1, strict=True):
        result = _stage(store, repo_id, commit, quarantine_root_for(store, quarantine), endpoint,
                        options, task_retries, task_retry_delay, progress_interval)
    summary = result.__dict__ | {"tuple_id": None}
    if image is not None:
        summary["tuple_id"] = make_tuple(store, repo_id, commit, image, profile)
        label_run(tags(tuple_id=summary["tuple_id"]))
    summary_artifact(summary, key=slug("k3a", repo_id, commit[:12], "summary"))
    logger.info("%s", closing_line(summary))
    if not result.already_published:  # a run that found it published staged nothing
        notify(events.revision_published(
            repo_id, commit, manifest_digest=result.manifest_digest, location=result.location,
            files=result.files, total_bytes=result.total_bytes, remote_code=result.remote_code,
            tuple_id=summary["tuple_id"]))
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
    progress_interval: float | None,
) -> StageResult:
    key = slug("k3a", repo_id, commit[:12])
    observer = FlowObserver(key, f"{repo_id}@{commit[:12]}", progress_interval)
    try:
        result = stage(HubSource(endpoint=endpoint, retry=options.retry), store, repo_id, commit,
                       qroot, options, observer, TaskRunner(task_retries, task_retry_delay))
    except BaseException as exc:
        observer.close(f"failed: {exc}".splitlines()[0])
        if isinstance(exc, ReleaseRefused):
            notify(events.revision_refused(repo_id, commit, exc))
        raise
    observer.close("published")
    return result


@task(name="make-tuple", cache_policy=NO_CACHE, persist_result=False)
def make_tuple(store: Store, repo_id: str, commit: str, image: str, profile: str) -> str:
    """Bind the published revision, the image (a tag is pinned to its digest now, once) and
    the serving profile (a name in manifests/profiles/ or a site profile file carrying the
    FSx/region facts) into a release tuple; the same inputs give the same id."""
    created = create_release_tuple(store, f"{repo_id}@{commit}", image, profile,
                                   created_by="prefect:stage-release")
    get_run_logger().info("release tuple %s (%s)", created.release.id,
                          "created" if created.new else "already existed")
    return created.release.id
