"""A run's own error reaches the user as itself and at once: a source that cannot be opened in
its actor, a PostgreSQL slot or publication that is missing (checked on the driver before any
actor starts). Only the coordinator's own death starts a new coordinator (that restart is
test_exactly_once.py's test_coordinator_killed_a_new_one_resumes)."""

from __future__ import annotations

import time
import uuid

import pytest

from driftstream.engine import Flow, PostgresSource
from driftstream.engine.model.errors import FlowError
from driftstream.engine.testing import MemorySink, MemorySource
from tests.conftest import flow_actors

pytestmark = pytest.mark.ray

#: Seconds within which a run's own error must reach the driver; it took ~17-23 s, and came
#: as "actors of a flow named ... are already running", when it was taken for the coordinator's death.
PROMPT_S = 15.0


class _UnopenableSource(MemorySource):
    """Opens nowhere: as a source whose table or topic went missing after the driver looked."""

    def open(self, partition, source_id, start=None):
        raise LookupError(f"partition {partition}: the table 'orders' is gone; recreate it, then start the flow again")


def _unopenable(name: str) -> Flow:
    flow = Flow(name)
    flow.source(_UnopenableSource(range(100), partitions=2), name="orders").key_by(lambda x: x % 3).count(name="n").sink(MemorySink("out"))
    return flow


def test_a_source_that_cannot_be_opened_in_its_actor_fails_the_run_with_its_own_error_at_once(ray_session, tmp_path):
    options = dict(parallelism=2, guarantee="exactly-once", snapshot_interval=0.2, snapshot_dir=str(tmp_path / "snaps"))
    started = time.time()
    with pytest.raises(LookupError, match="the table 'orders' is gone; recreate it") as raised:
        _unopenable("unopenable").run(**options)
    assert time.time() - started < PROMPT_S
    notes = "".join(raised.value.__notes__)
    assert "raised as unopenable/orders/" in notes and "in open" in notes  # which instance, and its traceback down to open()
    assert flow_actors("unopenable/") == []  # no coordinator was started again, nothing is left running
    # start() refuses alike, with the same error, before it returns a handle
    started = time.time()
    with pytest.raises(LookupError, match="the table 'orders' is gone"):
        _unopenable("unopenable").start(**options)
    assert time.time() - started < PROMPT_S
    assert flow_actors("unopenable/") == []


def _cdc(pg, name: str, **source) -> Flow:
    flow = Flow(name)
    flow.source(PostgresSource(pg.dsn, **source), name="changes").sink(MemorySink("out"))
    return flow


def test_a_missing_slot_or_publication_is_said_before_any_actor_starts(ray_session, postgres, tmp_path):
    tag = uuid.uuid4().hex[:8]
    options = dict(guarantee="exactly-once", snapshot_dir=str(tmp_path / "snaps"))
    cases = [
        (dict(publication=f"pub_{tag}", slot=f"slot_{tag}"), f"no publication 'pub_{tag}': create it"),
        (dict(publication=f"pub_{tag}", slot=f"slot_{tag}", tables=[f"t_{tag}"], create_slot=False),
         f"no replication slot 'slot_{tag}' \\(create_slot=False\\)"),
    ]
    import psycopg

    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE t_{tag} (id int PRIMARY KEY)")
    for source, message in cases:
        started = time.time()
        with pytest.raises(FlowError, match=message) as raised:
            _cdc(postgres, f"cdc-{tag}", **source).run(**options)
        assert time.time() - started < PROMPT_S
        assert any(f"source 'changes' of flow 'cdc-{tag}'" in note for note in raised.value.__notes__)
        assert flow_actors(f"cdc-{tag}/") == []  # checked on the driver: no actor was started


def test_an_error_in_the_coordinators_own_setup_is_raised_as_itself_not_taken_for_its_death(ray_session):
    import pyarrow as pa

    started = time.time()
    with pytest.raises(pa.ArrowInvalid, match="Unrecognized filesystem type in URI: nosuchscheme://"):
        _unopenable("unstorable").run(parallelism=1, guarantee="exactly-once", snapshot_dir="nosuchscheme://bucket/snaps")
    assert time.time() - started < PROMPT_S
    assert flow_actors("unstorable/") == []
