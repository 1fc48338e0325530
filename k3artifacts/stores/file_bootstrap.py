"""``k3a bootstrap file:///PATH --group GROUP``: give a file store to a team of accounts.

A file store on a shared disk (an FSx for Lustre mount, NFS, a build machine's ``/srv``) is
used by several people, each acting as their own account (``policy/actor.py``): one stages, a
second reviews and approves, a third promotes. Bootstrap makes the store the group's, once:

* the root directory and everything under it get the group (``chgrp``), every directory the
  set-group-ID bit (what is made inside inherits the group);
* the group gets what the owner has (``chmod g=u``): records stay read-only, directories the
  owner may write to the group may write to, and sealed revision directories stay sealed;
* others keep what they had: nothing is opened wider than its writer's umask made it.

From then on the store keeps it so for what k3a writes (``stores/file_modes.py``). Before
changing anything, bootstrap refuses a group that does not exist, an account that is not in
it (only root or a member may give a file to a group) and a root the group's members cannot
reach (a directory on the way they may not pass through, such as a home directory). Symbolic
links under the root are neither followed nor changed. A second run changes nothing.
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from k3artifacts.errors import ConfigError
from k3artifacts.stores.file import FileStore
from k3artifacts.stores.file_modes import AccessDenied, denied

#: How many paths a report or a refusal names before it counts the rest.
SHOWN = 5


@dataclass
class TeamReport:
    root: str
    group: str
    dry_run: bool
    created: bool = False
    #: Paths whose group or mode was (or, in a dry run, would be) changed.
    changed: list[str] = field(default_factory=list)
    #: Symbolic links under the root, left alone.
    links: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"root": self.root, "group": self.group, "dry_run": self.dry_run,
                "created": self.created, "changed": self.changed, "links": self.links}


def _gid(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(
            f"there is no group {group!r} on this machine",
            hint=f"an administrator makes it and adds each member: `groupadd {group}`, "
            f"`usermod -aG {group} ACCOUNT`",
        ) from None


def _may_give_to(gid: int, group: str) -> None:
    if os.geteuid() == 0 or gid == os.getegid() or gid in os.getgroups():
        return
    raise ConfigError(
        f"this account is not in group {group}: only root or a member may give files to it",
        hint=f"`usermod -aG {group} $(id -un)` (an administrator), log in again, re-run; or "
        "run bootstrap as root",
    )


def _reachable(root: Path, gid: int, group: str) -> None:
    """Every directory on the way to ``root`` lets the group's members through."""
    for step in reversed(root.parents):
        try:
            st = os.stat(step)
        except FileNotFoundError:
            return  # made by this run, with the umask's mode
        passes = st.st_mode & stat.S_IXOTH or (st.st_gid == gid and st.st_mode & stat.S_IXGRP)
        if not passes:
            raise ConfigError(
                f"members of {group} cannot reach {root}: {step} is "
                f"{stat.filemode(st.st_mode)} (no way through for them)",
                hint=f"`chmod o+x {step}` lets any account pass through it (not list it), or "
                "make the store where shared files belong (such as /srv/k3a or the FSx mount)",
            )


def _wanted(mode: int, is_dir: bool) -> int:
    """``mode`` with the group given the owner's bits (and, for a directory, set-group-ID)."""
    owner_as_group = (mode & stat.S_IRWXU) >> 3
    wanted = (stat.S_IMODE(mode) & ~stat.S_IRWXG) | owner_as_group
    return wanted | stat.S_ISGID if is_dir else wanted & ~stat.S_ISGID


def share(url: str, group: str, *, dry_run: bool = False) -> TeamReport:
    """Give the file store at ``url`` to ``group`` (see the module's doc)."""
    root = FileStore.from_url(url).root
    gid = _gid(group)
    _may_give_to(gid, group)
    _reachable(root, gid, group)
    report = TeamReport(root=str(root), group=group, dry_run=dry_run)
    if not root.is_dir():
        report.created = True
        if dry_run:
            return report
        root.mkdir(parents=True)
    refused: list[PermissionError] = []
    for path in [root, *_tree(root, report.links, refused)]:
        st = os.lstat(path)
        mode = _wanted(st.st_mode, stat.S_ISDIR(st.st_mode))
        if st.st_gid == gid and stat.S_IMODE(st.st_mode) == mode:
            continue
        report.changed.append(str(path))
        if dry_run:
            continue
        try:
            if st.st_gid != gid:
                os.chown(path, -1, gid, follow_symlinks=False)
            # After chown, which clears set-group-ID on a file changed by a non-root owner.
            os.chmod(path, mode)
        except PermissionError as exc:
            refused.append(exc)
    if refused:
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        first = denied(root, refused[0], "give to the group")
        raise AccessDenied(f"{first}{more}: owned by another account",
                           hint="run bootstrap as root, or as the owner of those paths")
    return report


def _tree(root: Path, links: list[str], refused: list[PermissionError]) -> list[Path]:
    """Every directory and file under ``root``, symbolic links set aside (never followed),
    directories this account may not list added to ``refused``."""

    def unlisted(exc: OSError) -> None:
        if isinstance(exc, PermissionError):
            refused.append(exc)

    found = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=unlisted):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            if path.is_symlink():
                links.append(str(path))
            else:
                found.append(path)
    return found
