"""Who may have chosen a file: data dirs, secrets and keys are trusted only if ours.

A data directory holds checkpoints (pickled state) and the link secret; a secret lets
its holder send pickles to the service. So a data dir, a secret or a TLS key that another
user owns, or that sits in a directory another user can change, may hold whatever that
user chose: a process running as root would unpickle their checkpoint or accept their
calls. The rule, as OpenSSH checks its files (``safe_path`` in ``misc.c``):

- the data directory and everything the coordinator keeps in it belong to the user
  running the process (``os.geteuid()``); a secret file or a TLS key belongs to that
  user or to root (root can replace any file anyway);
- every directory consulted on the way to them (each ancestor up to ``/``, and the
  directories a symbolic link leads through) belongs to that user or to root, and
  neither group nor others can write it unless its sticky bit is set: in a sticky
  directory such as ``/tmp`` only an entry's owner can rename or remove it, so a data dir
  of ours in ``/tmp`` is ours to keep; every symbolic link followed belongs to that user
  or to root (its owner can point it elsewhere).

A refusal is one :class:`OwnershipError` line naming the path, its owner (name and uid)
and the fix; callers re-raise it as their own error type. Nothing here changes a mode or
an owner: refusing comes before :func:`.modes.tighten` takes another user's directory
for ours.
"""

from __future__ import annotations

import enum
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

from ...hashseed import DATA_DIR_ENV

__all__ = [
    "OwnershipError",
    "Trusted",
    "check_data_dir",
    "check_file",
    "check_owned",
    "check_way",
    "open_trusted",
    "owner_name",
]

_MAX_LINKS = 40  # as the kernel's limit on symbolic links followed in one lookup
_WRITERS = {stat.S_IWGRP: "its group", stat.S_IWOTH: "others"}
_WRITERS[stat.S_IWGRP | stat.S_IWOTH] = "its group and others"
_DIR_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0)


class OwnershipError(Exception):
    """A path another user could have chosen: refused, in one line."""


class Trusted(enum.Enum):
    """What a path is, for the message, its fix, and whose it may be."""

    DATA_DIR = "the data dir"
    DATA_FILE = "the file"
    SECRET = "the link secret"
    TLS_KEY = "the TLS key"

    @property
    def root_may_own(self) -> bool:
        # Root's secret or key is as safe as our own; a data dir is written by its user.
        return self in (Trusted.SECRET, Trusted.TLS_KEY)

    def fix(self, owner: str) -> str:
        """What to do instead, ``owner`` being the user the path belongs to."""
        if self is Trusted.DATA_DIR:
            return (
                f"run as {owner}, or use a data dir of your own (--data-dir or "
                f"${DATA_DIR_ENV}); nothing was changed"
            )
        if self is Trusted.DATA_FILE:
            return f"run as {owner}, or remove it if you did not put it there; nothing was changed"
        if self is Trusted.SECRET:
            return f"run as {owner}, or use a secret file of your own (mode 0600)"
        return f"run as {owner}, or use a key file of your own"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def owner_name(uid: int) -> str:
    """``name (uid N)``: who a path belongs to, for a message."""
    name = _user(uid)
    return f"{name} (uid {uid})" if name != f"uid {uid}" else f"uid {uid} (no such user)"


def _refuse_owner(path: Path, uid: int, what: Trusted) -> None:
    me = os.geteuid()
    if uid == me or (uid == 0 and what.root_may_own):
        return
    raise OwnershipError(
        f"{what.value} {path} is owned by {owner_name(uid)}, not by {owner_name(me)}, who "
        f"runs this: what is in it may be another user's choice; {what.fix(_user(uid))}"
    )


def _check_directory(directory: Path, st: os.stat_result, path: Path, what: Trusted) -> None:
    """A directory on the way to ``path``: ours or root's, and only they can change it."""
    if st.st_uid not in (0, os.geteuid()):
        raise OwnershipError(
            f"{what.value} {path} is under {directory}, owned by {owner_name(st.st_uid)}, "
            f"who could replace it; use a path whose directories are yours or root's"
        )
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not st.st_mode & stat.S_ISVTX:
        who = _WRITERS[writable]
        raise OwnershipError(
            f"{what.value} {path} is under {directory}, which {who} can write (mode "
            f"{stat.S_IMODE(st.st_mode):04o}, no sticky bit), so they could replace it; "
            f"chmod go-w {directory}, or use another path"
        )


def _check_path(path: Path, what: Trusted) -> None:
    """Check every directory looked up on the way to ``path`` and every link followed.

    Resolves the path one component at a time from ``/`` (as the kernel does), so a
    symbolic link anywhere, the last component included, is checked where it is and
    followed to where it leads. Components that do not exist end the walk: creating
    them is the caller's business, and a missing file is reported by whoever opens it.
    """
    pending = list(reversed(path.absolute().parts[1:]))
    current = Path("/")
    seen_links = 0
    try:
        _check_directory(current, os.stat(current), path, what)
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":
                current = current.parent  # checked on the way down to ``current``
                continue
            step = current / name
            try:
                st = os.lstat(step)
            except FileNotFoundError:
                return
            if stat.S_ISLNK(st.st_mode):
                seen_links += 1
                if seen_links > _MAX_LINKS:
                    raise OwnershipError(f"{what.value} {path}: too many symbolic links")
                if st.st_uid not in (0, os.geteuid()):
                    raise OwnershipError(
                        f"{what.value} {path} goes through the symbolic link {step}, owned "
                        f"by {owner_name(st.st_uid)}, who can point it elsewhere; use a "
                        "path whose links are yours or root's"
                    )
                target = Path(os.readlink(step))
                pending.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
                if target.is_absolute():
                    current = Path("/")
                continue
            if not pending:
                return  # the path itself: its owner is the caller's check (on its fd)
            if not stat.S_ISDIR(st.st_mode):
                return  # not a directory: the caller's open reports it
            _check_directory(step, st, path, what)
            current = step
    except OSError as exc:
        raise OwnershipError(
            f"cannot check who owns {what.value} {path}: {exc.strerror} ({exc.filename})"
        ) from None


def check_way(path: Path, what: Trusted) -> None:
    """The directories and links on the way to ``path`` are trusted, as far as they
    exist: before a missing data dir is made, so it is never made under a directory
    another user controls."""
    _check_path(path, what)


def open_trusted(path: Path, flags: int, what: Trusted) -> int:
    """``os.open(path, flags)`` of a path that is trusted, or :class:`OwnershipError`.

    The way to ``path`` is checked first (without following anything, so a link another
    user planted is named rather than followed); the owner is then checked on the open
    file, so the check is of what is read, not of what the name meant a moment before.
    An :class:`OSError` of the open itself is the caller's to report.
    """
    _check_path(path, what)
    fd = os.open(path, flags)
    try:
        _refuse_owner(path, os.fstat(fd).st_uid, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_data_dir(path: Path) -> None:
    """The data dir ``path`` (which exists) is ours, and so is the way to it."""
    try:
        fd = open_trusted(path, _DIR_FLAGS, Trusted.DATA_DIR)
    except NotADirectoryError:
        raise OwnershipError(f"the data dir {path} is not a directory") from None
    except OSError as exc:
        raise OwnershipError(f"cannot open the data dir {path}: {exc.strerror}") from None
    os.close(fd)


def check_file(path: Path, what: Trusted) -> None:
    """A file something else reads by name (``ssl`` loads keys so) is trusted.

    The directories on the way are ours or root's, so nobody else can swap the file
    between this check and the read. A file that does not open is left to the reader to
    report, in its own words.
    """
    try:
        fd = open_trusted(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, what)
    except OSError:
        return
    os.close(fd)


def check_owned(paths: Iterable[Path], what: Trusted) -> None:
    """Each of ``paths`` that exists is ours (links are not followed: a link is checked
    as itself). For the files the coordinator keeps in a data dir it has checked."""
    for path in paths:
        try:
            uid = os.lstat(path).st_uid
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise OwnershipError(
                f"cannot check who owns {what.value} {path}: {exc.strerror}"
            ) from None
        _refuse_owner(path, uid, what)
