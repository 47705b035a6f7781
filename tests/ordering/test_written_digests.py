"""Checked backends: a settled value that changed behind the engine's back is reported at its
read, with the watermark since when it was known right; what the engine writes is not."""

from __future__ import annotations

from driftstream.ordering.entry_state import DELETED, DictEntryBackend, EntryKeyedState
from driftstream.ordering.keyed_state import DictBackend, DriftingKeyedState
from driftstream.ordering.meta import Meta
from driftstream.ordering.written_digests import CheckedEntries, CheckedValues, digest


def _sum(state, x):
    return (state or 0) + x, (state or 0) + x


def test_a_value_state_over_a_checked_backend_reports_a_flip_at_its_next_read_only():
    ks = DriftingKeyedState(_sum, backend=CheckedValues(DictBackend()))
    ks.backend.at = (1,)
    ks.apply(Meta(1, 0, 0, 1), 5, "k")
    ks.advance((2,))
    ks.backend.at = (2,)
    assert ks.backend.written["k"] == (digest(5), (1,))
    ks.apply(Meta(3, 0, 0, 3), 1, "k")
    assert ks.backend.corrupt == []
    ks.advance((4,))
    ks.backend.inner.put("k", 7)  # a flip
    assert ks.apply(Meta(5, 0, 0, 5), 1, "k")[0][1] == 8  # read, and reported
    [bad] = ks.backend.corrupt
    assert (bad.key, bad.written, bad.read, bad.since) == ("k", digest(6), digest(7), (2,))


def test_a_record_never_written_gets_its_digest_at_its_first_read():
    inner = DictBackend()
    inner.put("restored", 3)
    checked = CheckedValues(inner)
    checked.at = (9,)
    assert checked.get("restored") == 3 and checked.written["restored"] == (digest(3), (9,))
    inner.put("restored", 2)
    checked.get("restored")
    assert [c.since for c in checked.corrupt] == [(9,)]


def test_an_entry_state_over_a_checked_backend_reports_a_flipped_entry():
    def put(entries, x):
        entries.put("n", entries.get("n", 0) + x)
        return entries.get("n")

    ks = EntryKeyedState(put, backend=CheckedEntries(DictEntryBackend()))
    ks.apply(Meta(1, 0, 0, 1), 5, "k")
    ks.advance((2,))
    assert ks.backend.get(("k", "n")) == 5 and ks.backend.corrupt == []
    ks.backend.inner.fold([(("k", "n"), 4)])
    assert ks.apply(Meta(3, 0, 0, 3), 1, "k")[0][1] == 5
    assert {c.key for c in ks.backend.corrupt} == {("k", "n")}  # (read twice: for the put, and its size)


def test_removed_records_are_forgotten():
    checked = CheckedValues(DictBackend())
    checked.fold("a", 1, [1])
    checked.remove_many(["a"])
    checked.put("b", 2)
    checked.remove("b")
    assert checked.written == {} and checked.get("a") is None and checked.corrupt == []
    assert CheckedEntries(DictEntryBackend()).get(("k", "e")) is DELETED
