"""Who may read the files the service keeps: owner-only by default.

The catalog holds the update log and the sealed manager tokens, a wrapper's state holds
unacknowledged updates, the replica a copy of the source: none of it is for the other
users of the machine. ``pvm serve`` and ``pvm wrapper run`` set the umask ``PRIVATE_UMASK``
first thing, so whatever they (and the libraries they call) create is owner-only; the files
that matter most are also created with an explicit mode, so that they are private even in a
process that did not set the umask (tests, an embedding program). Files an earlier version
left readable by others are tightened on start, with a log line.

>>> import os, tempfile
>>> root = Path(tempfile.mkdtemp())
>>> old = root / "old.db"
>>> _ = old.write_text("x"); os.chmod(old, 0o644)
>>> PRIVATE.secure(old)
1
>>> oct(os.stat(old).st_mode & 0o7777)
'0o600'
>>> PRIVATE.secure(old)  # already private: nothing to do
0
"""

from __future__ import annotations

import grp
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077


def restrict_umask() -> None:
    """Files and directories this process creates from now on are owner-only (0600/0700).
    Call it at process start, before anything is written."""
    os.umask(PRIVATE_UMASK)


@dataclass(frozen=True)
class FileModes:
    """The modes (and, optionally, the group) of a tree of files: ``dir_mode`` for its
    directories, ``file_mode`` for its files. With a ``group``, directories also get the
    set-group-ID bit, so that files created in them later (by Spark, say) belong to it."""

    dir_mode: int
    file_mode: int
    group: str | None = None

    def make_dir(self, path: Path) -> Path:
        """``path`` as a directory of these modes. Missing parents are made with them too;
        existing parents keep theirs (they may be shared, like ``~/.local/state``)."""
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir(exist_ok=True)
            self._apply(directory, os.lstat(directory))
        if not missing and self._apply(path, os.lstat(path)):
            log.warning("changed the modes of %s to %s", path, self.describe())
        return path

    def create_file(self, path: Path) -> Path:
        """``path`` as an (empty, if new) file of these modes, before a library opens it:
        SQLite gives its ``-wal`` and ``-shm`` files the mode of the database file."""
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, self.file_mode)
        os.close(fd)
        self._apply(path, os.lstat(path))
        return path

    def secure(self, *paths: Path) -> int:
        """Give ``paths`` (files, or directories and everything under them) these modes where
        they have others; returns how many entries changed, and logs one line if any did.
        Symbolic links are left alone (their targets are someone else's)."""
        changed = sum(self._secure_tree(path) for path in paths)
        if changed:
            log.warning(
                "changed the modes of %d files and directories to %s: %s",
                changed, self.describe(), ", ".join(str(p) for p in paths),
            )  # fmt: skip
        return changed

    def _secure_tree(self, path: Path) -> int:
        changed = self._secure_entry(path)
        if path.is_dir() and not path.is_symlink():
            for root, dirs, files in os.walk(path):
                changed += sum(self._secure_entry(Path(root, name)) for name in dirs + files)
        return changed

    def _secure_entry(self, path: Path) -> int:
        try:
            return int(self._apply(path, os.lstat(path)))
        except FileNotFoundError:  # absent, or removed meanwhile (a finished temporary file)
            return 0

    def describe(self) -> str:
        """The modes as a person reads them, e.g. ``0700/0600``."""
        group = f", group {self.group}" if self.group else ""
        return f"{self.dir_mode:04o}/{self.file_mode:04o}{group}"

    def _apply(self, path: Path, st: os.stat_result) -> bool:
        if stat.S_ISLNK(st.st_mode):
            return False
        is_dir = stat.S_ISDIR(st.st_mode)
        changed = False
        if self.group is not None:
            gid = grp.getgrnam(self.group).gr_gid
            if st.st_gid != gid:
                os.chown(path, -1, gid, follow_symlinks=False)
                changed = True
        wanted = self.dir_mode if is_dir else self.file_mode
        if is_dir and self.group is not None:
            wanted |= stat.S_ISGID
        if stat.S_IMODE(st.st_mode) != wanted:
            os.chmod(path, wanted)
            changed = True
        return changed


PRIVATE = FileModes(dir_mode=0o700, file_mode=0o600)
"""The catalog, its key, the admin token file, a wrapper's state, outbox and replica files."""


def write_private_file(path: Path, text: str) -> Path:
    """Replace ``path`` with a 0600 file holding ``text``; the text is never in a file
    others could open, not even for a moment (a new file is made, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE.file_mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
