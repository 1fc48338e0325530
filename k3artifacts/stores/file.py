"""The file store: a POSIX tree, the embedded default and an FSx for Lustre mount."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlparse

from k3artifacts import faultpoints
from k3artifacts.errors import AlreadyExists, ConfigError, Conflict, K3AError, NotFound
from k3artifacts.revisions.hashing import hash_file
from k3artifacts.revisions.manifest import (
    MANIFEST_NAME,
    META_DIR,
    PROVENANCE_NAME,
    FileRecord,
    ShardManifest,
    revision_prefix,
)
from k3artifacts.stores.base import (
    SMALL_FILE,
    NotPublished,
    Placement,
    PutReceipt,
    RangeReader,
    ReuseFailed,
    RevisionWriter,
    ShortRead,
    Sink,
    Store,
    Versioned,
)
from k3artifacts.stores.file_modes import guarded, make_dirs, open_lock, record_mode
from k3artifacts.stores.records import MAX_RECORD_BYTES, oversized

READ_ONLY_FILE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
READ_ONLY_DIR = READ_ONLY_FILE | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


def _token(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sync(path: Path, *, data_only: bool = False) -> None:
    """Flush a file or a directory (its entries) to disk; ``data_only``: a file's bytes, not
    its metadata (fdatasync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        (os.fdatasync if data_only else os.fsync)(fd)
    finally:
        os.close(fd)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        # Same file system (quarantine under the store root): no byte is read again.
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copyfile(src, dst)


def _share_or_copy(src: Path, dst: Path) -> str:
    """Place ``src``'s bytes at ``dst`` without reading them through this process where the
    file system allows: a hard link (published files are read-only, so sharing the inode is
    safe), else ``copy_file_range`` (a reflink or a server-side copy on file systems that have
    one), else a plain copy. Returns which one ran."""
    try:
        os.link(src, dst)
        return "link"
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        remaining = os.fstat(fin.fileno()).st_size
        try:
            while remaining > 0:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), min(remaining, 1 << 30))
                if n == 0:
                    break
                remaining -= n
            return "copy_file_range"
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
    shutil.copyfile(src, dst)
    return "copy"


def _syncfs(path: Path) -> None:
    """Flush the whole file system holding ``path`` (Linux syncfs; os.sync elsewhere)."""
    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), f"syncfs {path}")
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _make_writable(root: Path) -> None:
    """Published trees are read-only; deleting or rebuilding one needs write bits back."""
    for dirpath, dirnames, _ in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)


class FileStore(Store):
    """A POSIX tree: the embedded default and an FSx for Lustre mount.

    Atomicity comes from rename: a revision is assembled in a hidden sibling directory and
    renamed into place; records are written to a temporary file and linked (exclusive create)
    or renamed under a lock (compare-and-swap).
    """

    mounted_tree = True

    def __init__(self, root: Path):
        self.root = Path(root).absolute()
        self.local_root = self.root
        self.url = f"file://{self.root}"

    @classmethod
    def from_url(cls, url: str) -> FileStore:
        """``file:///abs/path`` or a plain path."""
        parsed = urlparse(url)
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ConfigError(
                f"store URL {url!r} has a host; use file:///absolute/path",
                hint="for a local tree write file:///path (three slashes)",
            )
        path = unquote(parsed.path) if parsed.scheme == "file" else url
        if not path:
            raise ConfigError(f"store URL {url!r} has no path", hint="use file:///absolute/path")
        return cls(Path(path).expanduser())

    @classmethod
    def placement_at(cls, store_url: str, revision_path: str) -> Placement:
        root = cls.from_url(store_url).root.as_posix()
        return Placement(store_url=store_url, revision_path=revision_path,
                         root_path=os.path.normpath(root))

    @guarded("reach")
    def exists(self) -> bool:
        return self.root.is_dir()

    @guarded("make")
    def refuse_unmakeable(self) -> None:
        if self.exists():
            return
        # The nearest ancestor that is there: the store's directories are made under it.
        base = self.root
        while not base.exists() and base != base.parent:
            base = base.parent
        why = "it is not a directory" if not base.is_dir() else None
        if why is None:
            # Asked of the file system itself: permission bits say nothing of /proc, a
            # read-only mount or root's squashed NFS. The probe is removed at once.
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".k3a-probe-", dir=base))
            except OSError as exc:
                why = f"a directory cannot be made there ({exc.strerror or exc})"
        if why is not None:
            raise ConfigError(
                f"no store at {self.url}, and none can be made there: {base} is where it would "
                f"start, and {why}",
                hint="choose a store path this account can create (a directory you own, or a "
                "shared store's mount: `k3a bootstrap file:///PATH --group GROUP`), and pass it "
                "as --store file:///PATH or K3A_STORE")

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ConfigError(f"invalid store key {key!r}")
        return self.root.joinpath(*parts)

    def local_path(self, key: str) -> Path:
        return self._path(key)

    @guarded("read")
    def read(self, key: str) -> Versioned | None:
        try:
            fh = open(self._path(key), "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(MAX_RECORD_BYTES + 1) if size <= MAX_RECORD_BYTES else b""
            if size > MAX_RECORD_BYTES or len(data) > MAX_RECORD_BYTES:
                raise oversized(key, max(size, len(data)))
        return Versioned(data, _token(data))

    def _tmp_sibling(self, path: Path) -> Path:
        make_dirs(self.root, path.parent)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        return Path(name)

    @guarded("write")
    def create(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._tmp_sibling(path)
        try:
            _write_durable(tmp, data)
            os.chmod(tmp, record_mode(self.root))
            try:
                # link() fails if the name exists: exclusive create of a complete file.
                os.link(tmp, path)
            except FileExistsError:
                raise AlreadyExists(key) from None
            _sync(path.parent)
        finally:
            tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        make_dirs(self.root, path.parent)
        with open_lock(self.root, path.parent / f".{path.name}.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @guarded("write")
    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        path = self._path(key)
        with self._locked(path):
            current = self.read(key)
            current_token = None if current is None else current.token
            if current_token != expected:
                raise Conflict(
                    f"{key} changed under us (expected version {expected}, found {current_token})"
                )
            tmp = self._tmp_sibling(path)
            try:
                _write_durable(tmp, data)
                os.chmod(tmp, record_mode(self.root))
                os.replace(tmp, path)
                _sync(path.parent)
            finally:
                tmp.unlink(missing_ok=True)
        return _token(data)

    @guarded("delete")
    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        if path.parent.exists():
            _sync(path.parent)

    @guarded("read")
    def modified_at(self, key: str) -> datetime | None:
        try:
            return datetime.fromtimestamp(self._path(key).stat().st_mtime, UTC)
        except FileNotFoundError:
            return None

    @guarded("list")
    def list_keys(self, prefix: str) -> list[str]:
        base = self.root / prefix if prefix else self.root
        if not base.is_dir():
            return []
        keys = []
        for dirpath, dirnames, filenames in os.walk(base, onerror=_unless_denied):
            # Hidden entries are in-progress revisions, temp files and locks, never content.
            dirnames[:] = [d for d in dirnames if not d.startswith(".") or d == META_DIR]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if not name.startswith("."):
                    keys.append(name if rel == "." else f"{rel}/{name}")
        return sorted(keys)

    @guarded("read")
    def object_sizes(self, prefix: str) -> dict[str, int]:
        return {key: os.stat(self._path(key)).st_size for key in self.list_keys(prefix)}

    @guarded("read")
    def open_read(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError:
            raise NotFound(f"{key} is not in {self.url}") from None

    @guarded("write")
    def begin_revision(self, repo_id: str, commit: str) -> RevisionWriter:
        return _FileRevisionWriter(self, repo_id, commit)

    @guarded("write")
    def add_to_revision(self, repo_id: str, commit: str, rel: str, data: bytes) -> None:
        final = self._path(revision_prefix(repo_id, commit))
        if not (final / META_DIR / MANIFEST_NAME).exists():
            raise NotPublished(repo_id, commit, self.url)
        parent = self._path(f"{revision_prefix(repo_id, commit)}/{rel}").parent
        if parent != final and not parent.is_dir():
            raise ConfigError(f"{rel}: only existing directories of a revision can take a file")
        # Published directories are read-only; open the one directory for the time of one
        # exclusive create, under the revision's lock so that a concurrent adder does not
        # close it under us. Every other file and directory keeps its mode.
        with open_lock(self.root, final.with_name(f".{commit}.lock")) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            os.chmod(parent, 0o755)
            try:
                self.create(f"{revision_prefix(repo_id, commit)}/{rel}", data)
            finally:
                os.chmod(parent, READ_ONLY_DIR if parent != final else 0o755)

    def open_ranges(self, repo_id: str, commit: str, connections: int) -> RangeReader:
        return _FileRanges(self._path(revision_prefix(repo_id, commit)))

    @guarded("delete")
    def delete_revision(self, repo_id: str, commit: str) -> int:
        target = self._path(revision_prefix(repo_id, commit))
        if not target.exists():
            raise NotFound(f"{repo_id}@{commit} is not in {self.url}")
        # Rename first so readers see the revision vanish whole, then delete at leisure.
        doomed = target.with_name(f".deleting-{commit}-{os.getpid()}")
        os.rename(target, doomed)
        freed = _unshared_bytes(doomed)
        _make_writable(doomed)
        shutil.rmtree(doomed)
        return freed

    @guarded("write")
    def repair_file(self, repo_id: str, commit: str, record: FileRecord,
                    local_path: Path) -> None:
        final = self._path(revision_prefix(repo_id, commit))
        if not (final / META_DIR / MANIFEST_NAME).exists():
            raise NotPublished(repo_id, commit, self.url)
        dest = self._path(f"{revision_prefix(repo_id, commit)}/{record.path}")
        tmp = dest.with_name(f".{dest.name}.repair-{os.getpid()}")
        # A new inode replaces this revision's name only: a revision hard-linking the damaged
        # inode is damaged too and is repaired on its own. The directory opens for one rename,
        # under the revision's lock (as add_to_revision).
        with open_lock(self.root, final.with_name(f".{commit}.lock")) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            dest.parent.mkdir(parents=True, exist_ok=True)
            mode = os.stat(dest.parent).st_mode
            os.chmod(dest.parent, 0o755)
            try:
                shutil.copyfile(local_path, tmp)
                _sync(tmp)
                os.chmod(tmp, READ_ONLY_FILE)
                os.replace(tmp, dest)
                _sync(dest.parent)
            finally:
                tmp.unlink(missing_ok=True)
                os.chmod(dest.parent, stat.S_IMODE(mode))

    def reclaimable_bytes(self, repo_id: str, commit: str) -> int:
        target = self._path(revision_prefix(repo_id, commit))
        return _unshared_bytes(target) if target.exists() else 0

    def check_served(self, repo_id: str, commit: str,
                     manifest: ShardManifest) -> dict[str, str]:
        """A server mounting the tree (FSx, a hostPath) reads the revision's directory as it
        is now, and anyone with write access to the tree can change a file in place. Checked
        against the manifest: every file is a regular file of its listed size; a file below
        SMALL_FILE (config, tokenizer, code, index) is hashed whole with xxh3-128; a
        safetensors shard has its header read back and hashed with sha256, the digest the
        manifest's summary holds (a few MB in all).

        Not read: the tensor bytes of the large shards, 1.5 TB, minutes to hours per
        judgement. A size, mtime or inode recorded at staging would not catch a same-size
        edit either (the mtime can be set back), so none is kept: a same-size change inside
        a shard's tensors is caught by the signature gate with ``verify_bytes``, by
        ``k3a verify --full``, and on EKS by the verifier that hashes every byte before
        vLLM starts."""
        root = self._path(revision_prefix(repo_id, commit))
        problems = {}
        for file in manifest.files:
            why = _served_problem(root.joinpath(*file.path.split("/")), file)
            if why is not None:
                problems[file.path] = why
        return problems


def _served_problem(path: Path, file: FileRecord) -> str | None:
    """Why the file at ``path`` is not ``file`` as :meth:`FileStore.check_served` checks it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a link or a directory)"
    if st.st_size != file.size:
        return f"{st.st_size} bytes, the manifest says {file.size}"
    if file.size < SMALL_FILE:
        xxh = hash_file(path, sha256=False).hexdigests().xxh3_128
        if xxh != file.xxh3_128:
            return f"xxh3-128 {xxh}, the manifest says {file.xxh3_128}"
    elif file.safetensors is not None:
        summary = file.safetensors
        with open(path, "rb") as fh:
            length = int.from_bytes(fh.read(8), "little")
            header = fh.read(summary.header_len) if length == summary.header_len else b""
        if length != summary.header_len:
            return f"safetensors header of {length} bytes, the manifest says {summary.header_len}"
        digest = hashlib.sha256(header).hexdigest()
        if digest != summary.header_sha256:
            return (f"safetensors header sha256 {digest}, the manifest says "
                    f"{summary.header_sha256}")
    return None


def _unless_denied(exc: OSError) -> None:
    """os.walk's error handler: a directory this account may not list is refused by name (a
    listing that skipped it would answer "nothing there"); one gone since is just gone."""
    if isinstance(exc, PermissionError):
        raise exc


def _unshared_bytes(tree: Path) -> int:
    """Bytes of the files under ``tree`` whose every hard link is under it: what removing
    the tree gives back (a file linked from another revision stays on disk)."""
    seen: dict[tuple[int, int], list[int]] = {}  # inode -> [links seen here, nlink, size]
    for dirpath, _, filenames in os.walk(tree):
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if not stat.S_ISREG(st.st_mode):
                continue
            entry = seen.setdefault((st.st_dev, st.st_ino), [0, st.st_nlink, st.st_size])
            entry[0] += 1
    return sum(size for here, nlink, size in seen.values() if here >= nlink)


class _FileRanges(RangeReader):
    """``os.preadv`` straight into the caller's buffer, any number of threads on one
    descriptor per file."""

    def __init__(self, root: Path):
        self.root = root
        self.checksums = {}
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, path: str) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = os.open(self.root.joinpath(*path.split("/")), os.O_RDONLY)
                except FileNotFoundError:
                    raise NotFound(f"{path} is missing from {self.root}") from None
                self._fds[path] = fd
            return fd

    def read_range(self, path: str, offset: int, length: int, buf: memoryview,
                   sink: Sink) -> None:
        fd = self._fd(path)
        done = 0
        while done < length:
            n = os.preadv(fd, [buf[: min(len(buf), length - done)]], offset + done)
            if n == 0:
                raise ShortRead(f"{path}: end of file at {offset + done}")
            sink(buf[:n])
            done += n

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


class _FileRevisionWriter(RevisionWriter):
    """Assembles a revision in ``.staging-<commit>`` beside where it will appear.

    Several writers may share that directory: a staging run's per-file tasks, and two workers
    staging the same revision onto one FSx tree. They hold a shared lock on ``.<commit>.lock``
    (kept, as record locks are) while they add files, and :meth:`commit` holds it exclusively,
    so files are never added to a tree being sealed and renamed, and a second committer finds
    the revision published instead of a directory that vanished under it.
    """

    def __init__(self, store: FileStore, repo_id: str, commit: str):
        self.store = store
        self.repo_id = repo_id
        self.commit_sha = commit
        self.final = store._path(revision_prefix(repo_id, commit))
        # A fixed name: a crashed run's work is found and reused (see adopt). Every file
        # in it arrived by rename, so a file that exists is complete.
        self.work = self.final.with_name(f".staging-{commit}")
        self._lock_path = self.final.with_name(f".{commit}.lock")
        self._dirs: set[Path] = set()
        make_dirs(store.root, self._lock_path.parent)
        with self._locked(fcntl.LOCK_SH):
            if self.work.exists():
                # A run killed inside commit() left it read-only, which only root could add to.
                _make_writable(self.work)

    @contextlib.contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        # A fresh open per use: flock belongs to the open file, so threads sharing one
        # descriptor would release each other's lock.
        with open_lock(self.store.root, self._lock_path) as lock:
            fcntl.flock(lock, mode)
            yield  # closing the file releases the lock

    def _published(self) -> ShardManifest | None:
        return self.store.read_manifest(self.repo_id, self.commit_sha)

    def _dest(self, path: str) -> Path:
        return self.work.joinpath(*path.split("/"))

    def adopt(self, record: FileRecord) -> PutReceipt | None:
        try:
            if self._dest(record.path).stat().st_size == record.size:
                return PutReceipt(record.path, record.size, "kept")
        except FileNotFoundError:
            pass
        return None

    def put_file(
        self, record: FileRecord, local_path: Path, *, checksums: Mapping[str, str] | None = None
    ) -> PutReceipt | None:
        with self._locked(fcntl.LOCK_SH):
            if (self.final / META_DIR / MANIFEST_NAME).exists():
                return None  # another writer published the revision; commit() compares them
            self._put(record, local_path)
        return PutReceipt(record.path, record.size, "stored")

    def reuse(
        self, record: FileRecord, source_commit: str, source_path: str, *, reverify: bool = False
    ) -> PutReceipt | None:
        src = self.store._path(f"{revision_prefix(self.repo_id, source_commit)}/{source_path}")
        where = f"{record.path} from {source_commit[:12]}"
        with self._locked(fcntl.LOCK_SH):
            if (self.final / META_DIR / MANIFEST_NAME).exists():
                return None
            dest = self._dest(record.path)
            if dest.parent not in self._dirs:
                dest.parent.mkdir(parents=True, exist_ok=True)
                self._dirs.add(dest.parent)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.reuse")
            tmp.unlink(missing_ok=True)
            try:
                how = _share_or_copy(src, tmp)
            except FileNotFoundError:
                raise ReuseFailed(f"{where}: the source file is gone ({src})") from None
            try:
                self._check_reused(record, tmp, where, reverify)
            except ReuseFailed:
                tmp.unlink(missing_ok=True)
                raise
            if how != "link":
                os.chmod(tmp, READ_ONLY_FILE)
                if record.size >= SMALL_FILE:  # durable before in place, as put_file does
                    _sync(tmp, data_only=True)
            os.replace(tmp, dest)
        # A hard link is the same bytes under a second name: nothing moved.
        return PutReceipt(record.path, record.size, "referenced" if how == "link" else "copied")

    @staticmethod
    def _check_reused(record: FileRecord, placed: Path, where: str, reverify: bool) -> None:
        size = placed.stat().st_size
        if size != record.size:
            raise ReuseFailed(f"{where}: the store holds {size} bytes, the record {record.size}")
        if reverify:
            xxh = hash_file(placed, sha256=False).hexdigests().xxh3_128
            if xxh != record.xxh3_128:
                raise ReuseFailed(
                    f"{where}: the store's copy has xxh3-128 {xxh}, the record {record.xxh3_128}"
                )

    def open_staged(self, path: str) -> BinaryIO:
        try:
            return open(self._dest(path), "rb")
        except FileNotFoundError:
            raise NotFound(f"{path} was never put into {self.work}") from None

    def read_staged(self, path: str, offset: int, length: int) -> bytes:
        with self.open_staged(path) as fh:
            return os.pread(fh.fileno(), length, offset)

    def _put(self, record: FileRecord, local_path: Path) -> None:
        dest = self._dest(record.path)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        # Directories made once per writer, stale temp files removed only when met: on a
        # 2,000-file release every avoided syscall per file shows.
        if dest.parent not in self._dirs:
            dest.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(dest.parent)
        try:
            _link_or_copy(local_path, tmp)
        except FileExistsError:  # left by a killed run of this pid
            tmp.unlink()
            _link_or_copy(local_path, tmp)
        except FileNotFoundError:  # another writer aborted and removed the staging tree
            dest.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(local_path, tmp)
        os.chmod(tmp, READ_ONLY_FILE)
        # Large files are durable before they are in place, so commit() needs no pass over
        # them: this runs in the stager's worker threads. fdatasync, not fsync: a link to bytes
        # quarantine has already synced then costs nothing (fsync would commit the journal for
        # the new link count and mode). Small files are left to one syncfs at commit: a sync
        # each is ~10 ms, which dominates a release of thousands of small files.
        if record.size >= SMALL_FILE:
            _sync(tmp, data_only=True)
        os.replace(tmp, dest)

    def commit(self, manifest: ShardManifest) -> None:
        with self._locked(fcntl.LOCK_EX):
            existing = self._published()
            if existing is not None:
                self._remove_work()
                self._same_or_conflict(existing, manifest)
                return
            self._seal_and_rename(manifest)

    def _same_or_conflict(self, existing: ShardManifest, manifest: ShardManifest) -> None:
        if existing.digest() != manifest.digest():
            raise Conflict(f"{self.final} exists with a different manifest; refusing to overwrite")

    def _seal_and_rename(self, manifest: ShardManifest) -> None:
        missing = [r.path for r in manifest.files if not self.adopt(r)]
        if missing:
            raise K3AError(f"refusing to publish {self.final}: files never stored: {missing[:5]}")
        self.work.mkdir(parents=True, exist_ok=True)
        listed = {r.path for r in manifest.files}
        meta = self.work / META_DIR
        if meta.exists():
            _make_writable(meta)
            shutil.rmtree(meta)
        for dirpath, _, filenames in os.walk(self.work):
            rel = Path(dirpath).relative_to(self.work).as_posix()
            for name in filenames:
                if (name if rel == "." else f"{rel}/{name}") not in listed:
                    os.chmod(dirpath, 0o755)
                    os.unlink(os.path.join(dirpath, name))
        meta.mkdir()
        _syncfs(self.work)
        _write_durable(meta / PROVENANCE_NAME, manifest.provenance().canonical())
        _write_durable(meta / MANIFEST_NAME, manifest.canonical())
        # Every file's bytes were synced by put_file; the names linking them still need their
        # directories synced. One fsync per directory, not per file (thousands of small files).
        for dirpath, _, filenames in os.walk(self.work, topdown=False):
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), READ_ONLY_FILE)
            _sync(Path(dirpath))
            os.chmod(dirpath, READ_ONLY_DIR)
        # The revision directory itself stays writable by its owner so that rename works;
        # everything inside is read-only.
        os.chmod(self.work, 0o755)
        faultpoints.pause("publish", str(self.final))
        try:
            os.rename(self.work, self.final)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            # A directory without a manifest (made by hand, or by a writer that did not lock).
            existing = self._published()
            self._remove_work()
            if existing is None:
                raise Conflict(
                    f"{self.final} exists without a manifest; refusing to overwrite",
                    hint="nothing reads it as a revision; move it away and re-run",
                ) from None
            self._same_or_conflict(existing, manifest)
            return
        _sync(self.final.parent)

    def abort(self) -> None:
        with self._locked(fcntl.LOCK_EX):
            self._remove_work()

    def _remove_work(self) -> None:
        if self.work.exists():
            _make_writable(self.work)
            shutil.rmtree(self.work)
