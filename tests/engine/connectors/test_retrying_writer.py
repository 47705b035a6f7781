"""The sinks' one retrying write policy, on a partition simulated in memory (pure logic):
a write that failed after landing in part sends only the rest; past ``retry_s`` it fails
naming the sink, where it writes, the setting and the error; refused credentials and other
errors are never retried; a lost race is retried at once, up to ``max_conflicts``."""

from __future__ import annotations

import time

import pytest

from driftstream.barriers.bundle import Bundle
from driftstream.engine.connectors.retrying_writer import RetryingWriter, RetryPolicy, WriteErrors
from driftstream.ordering.meta import Meta


class Refused(ConnectionError):
    """A transient type's subclass that no retry fixes (as a failed SASL login is a KafkaError)."""


class Conflict(Exception):
    """Another writer committed first: the commit was refused whole."""


ERRORS = WriteErrors(transient=(OSError,), refused=(Refused,), conflicts=(Conflict,), failure=TimeoutError, setting="TestSink retry_s")


class Partition:
    """Holds what landed; ``fail`` says what each next send does: land ``n`` items then raise."""

    def __init__(self, fail: list) -> None:
        self.held: list = []
        self.sends: list = []
        self.fail = list(fail)
        self.reads = 0

    def send(self, bundle: Bundle, items: list) -> None:
        self.sends.append(list(items))
        landed, error = self.fail.pop(0) if self.fail else (len(items), None)
        self.held.extend(items[:landed])
        if error is not None:
            raise error

    def landed(self, timeout_s: float) -> "Meta | None":
        assert timeout_s > 0
        self.reads += 1
        return Meta(self.held[-1], 0, 0, self.held[-1]) if self.held else None


def _bundle(*ts: int) -> Bundle:
    return Bundle([(Meta(t, 0, 0, t), t) for t in ts])


def _writer(retry_s: float = 5.0, **kw) -> RetryingWriter:
    return RetryingWriter("out", "topic[2]", RetryPolicy(retry_s=retry_s, first_pause_s=0.01, max_pause_s=0.02, **kw), ERRORS)


def test_a_write_that_landed_in_part_sends_only_the_rest():
    part = Partition([(2, OSError("reset")), (0, OSError("refused")), (1, OSError("reset"))])
    dropped = []
    writer = _writer()
    writer.on_error = lambda: dropped.append(1)
    writer.write(_bundle(1, 2, 3, 4, 5), [1, 2, 3, 4, 5], part.send, part.landed)
    assert part.held == [1, 2, 3, 4, 5]  # each once
    assert part.sends == [[1, 2, 3, 4, 5], [3, 4, 5], [3, 4, 5], [4, 5]]
    assert part.reads == 3 and writer.retries == 3 and len(dropped) == 3


def test_a_write_whose_every_item_landed_before_the_error_sends_nothing_more():
    part = Partition([(3, OSError("reset after the ack was sent"))])
    _writer().write(_bundle(1, 2, 3), [1, 2, 3], part.send, part.landed)
    assert part.held == [1, 2, 3] and len(part.sends) == 1


def test_past_retry_s_the_write_fails_naming_the_sink_the_target_the_setting_and_the_error():
    part = Partition([(0, OSError("no route to host"))] * 1000)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        _writer(retry_s=0.3).write(_bundle(1, 2), [1, 2], part.send, part.landed)
    assert time.monotonic() - start < 3
    text = str(err.value)
    assert text.startswith("sink 'out': writes to topic[2] failed for 0.3 s (TestSink retry_s): OSError('no route to host')"), text
    assert isinstance(err.value.__cause__, OSError)


def test_refused_credentials_and_other_errors_are_raised_at_once():
    for error in (Refused("bad password"), ValueError("a column refuses the row")):
        part = Partition([(0, error)])
        with pytest.raises(type(error)):
            _writer().write(_bundle(1), [1], part.send, part.landed)
        assert len(part.sends) == 1 and part.reads == 0


def test_a_lost_race_is_retried_at_once_up_to_max_conflicts():
    part = Partition([(0, Conflict())] * 3)
    writer = _writer(max_conflicts=4)
    writer.write(_bundle(1, 2), [1, 2], part.send, part.landed)
    assert part.held == [1, 2] and len(part.sends) == 4 and part.reads == 3
    assert writer.retries == 0  # not an outage: no pause, no warning
    part = Partition([(0, Conflict())] * 4)
    with pytest.raises(RuntimeError, match=r"sink 'out': 4 commits to topic\[2\] in a row lost to other writers"):
        _writer(max_conflicts=4).write(_bundle(1, 2), [1, 2], part.send, part.landed)


def test_an_empty_bundle_sends_nothing():
    part = Partition([])
    _writer().write(Bundle([]), [], part.send, part.landed)
    assert part.sends == []


def test_an_outage_is_one_warning_not_one_per_attempt(caplog):
    import logging

    part = Partition([(0, OSError("refused"))] * 5)
    with caplog.at_level(logging.DEBUG, logger="driftstream.engine.connectors.retrying_writer"):
        _writer().write(_bundle(1, 2), [1, 2], part.send, part.landed)
    levels = [r.levelname for r in caplog.records]
    assert levels == ["WARNING"] + ["DEBUG"] * 4 + ["INFO"], levels
    assert "retrying for up to 5 s (TestSink retry_s)" in caplog.records[0].getMessage()
    assert caplog.records[-1].getMessage() == "sink out: a write to topic[2] went through after 5 retries"
