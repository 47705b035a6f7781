"""A flow over data-plane TLS on Ray: exactly-once through a killed stateful actor, the
output equal to a run without TLS or kills."""

from __future__ import annotations

import pytest

from driftstream.engine.connectors.file_sink import FileSink, read_file_sink
from driftstream.engine.model.errors import FlowError
from tests.engine.control.test_exactly_once import build, failure_free_output, kill_when
from tests.tls_files import make_tls

pytestmark = pytest.mark.ray


def test_exactly_once_over_tls_with_a_kill(ray_session, tmp_path, tmp_path_factory):
    tls = make_tls(tmp_path / "tls")
    expected = failure_free_output(tmp_path_factory)  # a run without TLS or kills

    out = tmp_path / "eo"
    killer = kill_when(lambda: len(read_file_sink(out, "out")) if out.exists() else 0, ["tls-eo/by_key/1"])
    # paced at 1,500/s (4 s): at 3,000 a loaded CI machine once finished the run before the kill
    result = build("tls-eo", FileSink(out, name="out"), paced=True, rate=1500).run(
        parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"),
        data_plane_tls={"ca": tls.ca, "cert": tls.cert, "key": tls.key},
    )
    killer.join(timeout=5)
    assert not killer.errors
    assert result.metrics.recoveries == 1
    assert read_file_sink(out, "out") == expected


def test_tls_files_that_cannot_be_read_fail_before_anything_starts(tmp_path):
    flow = build("tls-missing", FileSink(tmp_path / "x", name="out"), paced=False)
    with pytest.raises(FlowError, match="data_plane_tls: cert file .*missing.pem is not readable"):
        flow.run(parallelism=1, data_plane_tls={"ca": __file__, "cert": str(tmp_path / "missing.pem"), "key": __file__})


def test_a_missing_data_plane_key_file_fails_the_start_naming_it(ray_session, tmp_path):
    flow = build("key-missing", FileSink(tmp_path / "x", name="out"), paced=False)
    with pytest.raises(FlowError, match=r"key file .*nowhere.key on node .* does not exist: .*give data_plane_key"):
        flow.run(parallelism=1, data_plane_key=str(tmp_path / "nowhere.key"), snapshot_dir=str(tmp_path / "snaps"))


def test_a_flow_runs_with_its_own_data_plane_key_file(ray_session, tmp_path):
    key = tmp_path / "plane.key"
    key.write_bytes(__import__("os").urandom(48))
    key.chmod(0o600)
    out = tmp_path / "out"
    result = build("key-given", FileSink(out, name="out"), paced=False).run(parallelism=2, data_plane_key=str(key),
                                                                              snapshot_dir=str(tmp_path / "snaps"))
    assert result.metrics.recoveries == 0 and len(read_file_sink(out, "out")) > 0
