"""Per-user directories for what driftstream keeps on a machine by default.

A shared ``/tmp`` is predictable and world-readable: another user could create
``/tmp/driftstream-kafka.json`` first and point ``driftstream kafka stop`` at a process of
their choosing, or read and plant snapshots. So defaults live in directories only this
user can enter (mode 0700), and a directory or a state file is trusted only if this user
owns it and nobody else may write it. An existing directory of this user that others may
only read or enter (0755, as ``os.makedirs`` leaves one under the usual umask) is made
0700, with a WARNING: nothing in it can have been planted, but snapshots should not be
readable by others.

- :func:`runtime_dir`: short-lived state (the local broker's pid and port):
  ``$XDG_RUNTIME_DIR/driftstream`` (a per-user tmpfs) or else ``~/.cache/driftstream/run``.
- :func:`data_dir`: what must outlive a login (the default snapshot directory):
  ``$XDG_CACHE_HOME/driftstream`` or ``~/.cache/driftstream``.

>>> import tempfile, os, stat
>>> base = tempfile.mkdtemp()
>>> d = private(os.path.join(base, "a", "b"))
>>> oct(stat.S_IMODE(os.stat(d).st_mode))
'0o700'
>>> os.chmod(d, 0o755)
>>> oct(stat.S_IMODE(os.stat(private(d)).st_mode))
'0o700'
>>> oct(stat.S_IMODE(os.stat(os.path.join(base, "a")).st_mode))   # a parent it made, too
'0o700'
>>> os.chmod(d, 0o777)
>>> private(d)
Traceback (most recent call last):
...
PermissionError: ... is writable by other users: not trusted (remove it, or chmod 700 it if it is yours)
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)


def runtime_dir() -> Path:
    """This user's directory for short-lived state, created 0700."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return private(os.path.join(base, "driftstream"))
    return private(str(data_dir() / "run"))  # data_dir first: its mode is checked (and fixed) too


def data_dir() -> Path:
    """This user's directory for data that outlives a login, created 0700."""
    return private(os.path.join(_cache_home(), "driftstream"))


def _cache_home() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def private(path: str) -> Path:
    """``path`` as a directory only this user can enter: created 0700 when missing (each
    missing parent too); PermissionError if it exists but is another user's or others may
    write it; made 0700, with a WARNING, if it is this user's and others may read or enter it."""
    _make_dirs(path)
    check_trusted(path)
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode & 0o077:
        os.chmod(path, 0o700)
        log.warning("%s was open to other users (mode %s): made 0700, as driftstream keeps its per-user directories",
                    path, oct(mode))
    return Path(path)


def _make_dirs(path: str) -> None:
    """Create ``path`` and its missing parents, each 0700 (``os.makedirs`` gives only the last
    one its mode: the parents got 0755, the corpus cache's ``~/.cache/driftstream`` so)."""
    missing = []
    here = os.path.abspath(path)
    while not os.path.lexists(here):
        missing.append(here)
        here = os.path.dirname(here)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:  # another process made it meanwhile: checked like any existing one
            pass


def check_trusted(path: str) -> None:
    """PermissionError unless this user owns ``path`` (not following a symlink) and no
    other user may write it. O(1): one ``lstat``."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise PermissionError(f"{path} is a symbolic link: not trusted (remove it)")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to user id {st.st_uid}, not to this user ({os.getuid()}): not trusted")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is writable by other users: not trusted (remove it, or chmod 700 it if it is yours)")
