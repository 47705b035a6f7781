"""The instance's side of re-runs on the verifier: a difference becomes the in-process mismatch's
record (its ``before`` the least time re-run), snapshot parts wait in order for the verdicts
below their T, and a verifier that falls behind, dies or hangs never holds the flow: samples past
the bound are dropped, a failed call and a verdict past the deadline are given up, counted."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from driftstream.ordering.reexecution import Mismatch
from driftstream.ordering.shipped_reexecution import Expected, Verdict

from driftstream.engine.runtime.verifier_link import VerifierLink


def _link(bound: int = 4):
    calls, timers, parts, caught = [], [], [], []
    link = VerifierLink(lambda shipment: calls.append(Future()) or calls[-1], later=lambda s, fn: timers.append(fn), bound=bound)
    link.wire(caught.append, lambda t, part: parts.append(part))
    return link, calls, timers, parts, caught


def _expected(t: int) -> Expected:
    return Expected(((t,), (t + 1,)), (t,))


def test_a_difference_is_the_in_process_mismatch_record_with_the_least_time_re_run():
    link, calls, _, parts, caught = _link()
    link.submit(None, _expected(5), "sum", "1/0", (4,))
    link.hold_part((9,), "p9")
    calls[0].set_result(Verdict([Mismatch("output", None, 1, 2), Mismatch("state", "k", 7, 8)]))
    (exc,) = caught
    record = exc.record
    assert (record.step, record.instance, record.t_range, record.watermark, record.before) == ("sum", "1/0", ((5,), (6,)), (4,), (5,))
    assert record.found == [Mismatch("output", None, 1, 2), Mismatch("state", "k", 7, 8)]
    assert parts == []  # the process exits: the part that may hold the bad value never goes


def test_parts_go_in_order_once_the_verdicts_below_their_time_are_in():
    link, calls, _, parts, caught = _link()
    link.submit(None, _expected(5), "sum", "1/0", ())
    link.submit(None, _expected(2), "sum", "1/0", ())
    for t in (1, 3, 6):
        link.hold_part((t,), f"p{t}")
    assert parts == ["p1"]
    calls[0].set_result(Verdict([]))
    assert parts == ["p1"]  # the batch at 2 is still out
    calls[1].set_result(Verdict([]))
    assert parts == ["p1", "p3", "p6"] and not caught and link.verified == 2


def test_a_sink_write_at_the_least_time_re_run_waits_and_one_with_no_time_keeps_its_place():
    link, calls, _, _, _ = _link()
    done: list = []
    link.submit(None, _expected(5), "sum", "1/0", ())
    link.hold((4, 9), lambda: done.append("w4"))
    link.hold((5,), lambda: done.append("w5"))  # may hold what the batch at 5 made
    link.hold(None, lambda: done.append("empty"))
    assert done == ["w4"]
    calls[0].set_result(Verdict([]))
    assert done == ["w4", "w5", "empty"]


def test_past_the_bound_samples_are_dropped_and_a_dead_or_hung_verifier_is_given_up():
    link, calls, timers, parts, caught = _link(bound=2)
    assert link.submit(None, _expected(1), "sum", "1/0", ()) and link.submit(None, _expected(2), "sum", "1/0", ())
    assert link.full() and not link.submit(None, _expected(3), "sum", "1/0", ())
    link.hold_part((5,), "p5")
    calls[0].set_exception(RuntimeError("the verifier died"))
    timers[1]()  # the second's deadline
    calls[1].set_result(Verdict([Mismatch("output", None, 1, 2)]))  # too late: not compared
    assert parts == ["p5"] and not caught
    stats = link.stats()
    assert (stats["sent"], stats["dropped"], stats["lost"], stats["late"], stats["verified"], stats["outstanding"]) == (2, 1, 1, 1, 0, 0)


def test_drained_returns_once_every_verdict_is_in():
    link, calls, _, _, _ = _link()
    link.submit(None, _expected(1), "sum", "1/0", ())

    async def main():
        waiting = asyncio.ensure_future(link.drained())
        await asyncio.sleep(0.03)
        assert not waiting.done()
        calls[0].set_result(Verdict([]))
        await asyncio.wait_for(waiting, 1)

    asyncio.run(main())
