"""Per-user directories: created 0700, and a directory or state file that another user
could have planted (writable by others, a symlink) is refused, never trusted."""

from __future__ import annotations

import json
import os
import stat

import pytest

from driftstream.engine.connectors import local_kafka
from driftstream.engine.model.private_dir import data_dir, runtime_dir


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "run").mkdir(mode=0o700)
    return tmp_path


def test_defaults_are_private_directories(home):
    for d in (runtime_dir(), data_dir()):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700 and os.stat(d).st_uid == os.getuid()
    assert runtime_dir() == home / "run" / "driftstream"
    from driftstream.engine.control.snapshot_committer import default_snapshot_dir

    assert default_snapshot_dir("orders") == str(home / "cache" / "driftstream" / "snapshots" / "orders")


def test_a_planted_directory_or_symlink_is_refused(home):
    planted = home / "run" / "driftstream"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)  # writable by anyone, as a directory someone else made in a shared place
    with pytest.raises(PermissionError, match="writable by other users"):
        runtime_dir()
    planted.rmdir()
    planted.symlink_to(home)
    with pytest.raises(PermissionError, match="symbolic link"):
        runtime_dir()


def test_kafka_stop_never_signals_a_process_it_did_not_start(home):
    # A state file naming this very test process (alive, not a broker): nothing is signalled.
    local_kafka.state_file().write_text(json.dumps({"pid": os.getpid(), "port": 1}))
    assert local_kafka.cli_stop() is False
    assert not local_kafka.state_file().exists()
    # A state file others may write is not read at all.
    path = local_kafka.state_file()
    path.write_text(json.dumps({"pid": os.getpid(), "port": 1}))
    os.chmod(path, 0o666)
    with pytest.raises(PermissionError, match="writable by other users"):
        local_kafka.cli_stop()


def test_kafka_start_and_stop_through_the_private_state_file(home):
    bootstrap = local_kafka.cli_start()
    try:
        path = local_kafka.state_file()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert local_kafka.cli_start() == bootstrap  # the running one is found again
    finally:
        assert local_kafka.cli_stop() is True
    assert local_kafka.cli_stop() is False


def test_an_own_directory_others_may_read_is_made_private_with_a_warning(home, monkeypatch, caplog):
    """What the corpus cache left before it made its directories private: ~/.cache/driftstream 0755."""
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    shared = home / "cache" / "driftstream"
    shared.mkdir(parents=True)
    os.chmod(shared, 0o755)
    with caplog.at_level("WARNING", logger="driftstream.engine.model.private_dir"):
        assert runtime_dir() == shared / "run"  # its parent, the data directory, is checked too
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(shared / "run").st_mode) == 0o700
    assert f"{shared} was open to other users (mode 0o755): made 0700" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="driftstream.engine.model.private_dir"):
        data_dir()
    assert caplog.text == ""  # said once: it is private now


def test_missing_parents_are_made_private_too(home):
    """os.makedirs gives only the last directory its mode: the data directory under a
    missing cache home came out 0755."""
    d = data_dir()
    assert d == home / "cache" / "driftstream"
    for path in (home / "cache", d):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory another user's takes root")
def test_another_users_directory_is_refused_and_left_as_it_is(home):
    theirs = home / "cache" / "driftstream"
    theirs.mkdir(parents=True)
    os.chmod(theirs, 0o755)
    os.chown(theirs, 4242, 4242)
    with pytest.raises(PermissionError, match="belongs to user id 4242"):
        data_dir()
    assert stat.S_IMODE(os.stat(theirs).st_mode) == 0o755
