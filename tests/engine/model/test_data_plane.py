"""The run's data-plane secret never crosses Ray: a PlaneKey pickles (as Ray's actor
creation and ``reset`` calls do) to a nonce, a key file's path and a check; the actor
derives the secret from its node's key file, and a missing, unsafe or different key file
is an error naming the file and what to do."""

from __future__ import annotations

import os
import pickle

from ray import cloudpickle
import pytest

from driftstream.engine.model import data_plane
from driftstream.engine.model.data_plane import PlaneKey
from driftstream.engine.model.errors import FlowError


@pytest.fixture
def key_file(tmp_path):
    path = str(tmp_path / "plane.key")
    data_plane._create_key_file(path)
    return path


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle (Ray's)"])
def test_what_crosses_ray_holds_no_secret_and_the_receiver_derives_the_same_one(key_file, dumps):
    key = PlaneKey.new(key_file=key_file)
    sent = dumps(key)
    assert key.secret not in sent and open(key_file, "rb").read() not in sent
    arrived = pickle.loads(sent)
    assert arrived._secret is None  # nothing secret came with it
    assert arrived.secret == key.secret and len(arrived.secret) == 32


def test_each_launch_has_its_own_secret_under_one_key_file(key_file):
    assert len({PlaneKey.new(key_file=key_file).secret for _ in range(5)}) == 5


def test_the_default_key_file_is_made_once_private_to_this_user(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = PlaneKey.new()
    path = tmp_path / "cache" / "driftstream" / data_plane.KEY_FILE_NAME
    assert first.key_file == str(path) and oct(path.stat().st_mode & 0o777) == "0o600"
    content = path.read_bytes()
    second = PlaneKey.new()
    assert path.read_bytes() == content and len(content) == data_plane.KEY_BYTES
    assert pickle.loads(pickle.dumps(second)).secret == second.secret != first.secret


def test_a_node_without_the_key_file_is_told_what_to_do(key_file):
    sent = pickle.dumps(PlaneKey.new(key_file=key_file))
    os.unlink(key_file)
    with pytest.raises(FlowError, match=r"key file .*plane.key on node .* does not exist: .*give data_plane_key"):
        pickle.loads(sent).secret


def test_a_node_whose_key_file_differs_is_refused_by_name(key_file):
    sent = pickle.dumps(PlaneKey.new(key_file=key_file))
    with open(key_file, "wb") as f:
        f.write(os.urandom(32))
    with pytest.raises(FlowError, match="is not the one the run was launched with"):
        pickle.loads(sent).secret


@pytest.mark.parametrize("mode, content, message", [
    (0o644, bytes(range(32)), "others can neither read nor write"),
    (0o620, bytes(range(32, 64)), "others can neither read nor write"),
    (0o600, b"short", "fewer than 32"),
], ids=["others-read", "group-writes", "short"])
def test_an_unsafe_or_short_key_file_is_refused(tmp_path, mode, content, message):
    path = tmp_path / "k"
    path.write_bytes(content)
    path.chmod(mode)
    with pytest.raises(FlowError, match=message):
        PlaneKey.new(key_file=str(path))


def test_a_key_holding_its_secret_is_never_pickled():
    with pytest.raises(TypeError, match="never sent"):
        pickle.dumps(PlaneKey(b"s" * 32))
