"""A rescale's record has one form: a rescale to the parallelism the flow already has reports
the same keys as one that moved the flow (it lacked steps_s and resets_s)."""

from __future__ import annotations

from driftstream.engine.control.rescaler import Rescale


def test_a_rescale_that_did_nothing_reports_the_same_keys_as_one_that_moved():
    moved = Rescale(10.0, 2, 3, 7, 0.1, 0.4, steps_s={"reassign": 0.01}, resets_s={"f/k/0": {"setup": 0.1}}).report()
    nothing = Rescale(10.0, 2, 2, None, 0.0, 0.0, first_output_s=0.0).wait_first_output(5.0).report()
    assert set(nothing) == set(moved) and nothing["snapshot"] is None and nothing["steps_s"] == {}
