"""The pgoutput decoder on messages built from the protocol's documentation (not from a
server), and on junk: it never raises anything but PgOutputError."""

from __future__ import annotations

import struct
from decimal import Decimal

import pytest
from hypothesis import given, settings, strategies as st

from driftstream.engine.connectors.pgoutput import Begin, Commit, Message, PG_EPOCH_US, PgOutputDecoder, PgOutputError
from driftstream.engine.connectors.row_changes import Delete, Insert, Truncate, Update

REL = 16384


def relation(columns, relid=REL, namespace=b"public", name=b"users") -> bytes:
    out = b"R" + struct.pack(">I", relid) + namespace + b"\0" + name + b"\0" + b"d" + struct.pack(">H", len(columns))
    for col, oid, key in columns:
        out += bytes([1 if key else 0]) + col + b"\0" + struct.pack(">Ii", oid, -1)
    return out


def tuple_data(values) -> bytes:
    out = struct.pack(">H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "TOAST":
            out += b"u"
        else:
            out += b"t" + struct.pack(">i", len(v)) + v
    return out


COLUMNS = [(b"id", 23, True), (b"name", 25, False), (b"score", 1700, False), (b"ok", 16, False),
           (b"doc", 3802, False), (b"at", 1184, False), (b"f", 701, False)]


def decoder() -> PgOutputDecoder:
    d = PgOutputDecoder()
    assert d.decode(relation(COLUMNS)) is None
    return d


def test_begin_and_commit_carry_the_commit_lsn_and_time():
    ts_us = 849_202_701_519_271  # microseconds since 2000-01-01
    begin = PgOutputDecoder().decode(b"B" + struct.pack(">QqI", 22185056, ts_us, 726))
    assert begin == Begin(22185056, (ts_us + PG_EPOCH_US) // 1000, 726)
    assert begin.commit_ms == 1795887501519  # 2026-11-28 UTC, in epoch ms
    assert PgOutputDecoder().decode(b"C" + struct.pack(">BQQq", 0, 22185056, 22185104, ts_us)) == Commit(22185056, 22185104)


def test_rows_become_typed_values_and_other_types_keep_their_text():
    d = decoder()
    row = [b"7", b"ann", b"12.50", b"t", b'{"a": [1, 2]}', b"2026-11-28 17:00:00+00", b"0.25"]
    change = d.decode(b"I" + struct.pack(">I", REL) + b"N" + tuple_data(row))
    assert change == Insert("public.users", {"id": 7, "name": "ann", "score": Decimal("12.50"), "ok": True,
                                             "doc": {"a": [1, 2]}, "at": "2026-11-28 17:00:00+00", "f": 0.25})


def test_an_update_keeps_its_old_key_and_names_the_unchanged_toasted_columns():
    d = decoder()
    old = [b"7", None, None, None, None, None, None]
    new = [b"8", b"bob", None, b"f", "TOAST", None, None]
    change = d.decode(b"U" + struct.pack(">I", REL) + b"K" + tuple_data(old) + b"N" + tuple_data(new))
    assert change == Update("public.users", {"id": 8, "name": "bob", "score": None, "ok": False, "at": None, "f": None},
                            old={"id": 7}, unchanged=("doc",))
    plain = d.decode(b"U" + struct.pack(">I", REL) + b"N" + tuple_data(new))
    assert plain.old is None and plain.row["id"] == 8


def test_a_delete_holds_its_key_or_under_identity_full_the_whole_row():
    d = decoder()
    keyed = d.decode(b"D" + struct.pack(">I", REL) + b"K" + tuple_data([b"7", None, None, None, None, None, None]))
    assert keyed == Delete("public.users", {"id": 7})
    full = d.decode(b"D" + struct.pack(">I", REL) + b"O" + tuple_data([b"7", b"ann", None, b"t", None, None, None]))
    assert full.row == {"id": 7, "name": "ann", "score": None, "ok": True, "doc": None, "at": None, "f": None}


def test_a_truncate_names_its_table_and_one_of_several_is_refused():
    d = decoder()
    assert d.decode(relation([(b"x", 23, True)], relid=99, name=b"other")) is None
    assert d.decode(b"T" + struct.pack(">IB", 1, 0) + struct.pack(">I", REL)) == Truncate("public.users")
    with pytest.raises(PgOutputError, match="one per statement"):
        d.decode(b"T" + struct.pack(">IB", 2, 0) + struct.pack(">II", REL, 99))


def test_a_logical_message_keeps_its_prefix_and_content():
    body = b"M" + bytes([1]) + struct.pack(">Q", 99) + b"driftstream-tick\0" + struct.pack(">I", 3) + b"abc"
    assert PgOutputDecoder().decode(body) == Message(True, "driftstream-tick", b"abc")
    with pytest.raises(PgOutputError, match="cut short"):
        PgOutputDecoder().decode(body[:-1])


def test_what_it_cannot_read_is_named():
    with pytest.raises(PgOutputError, match="no Relation message described"):
        PgOutputDecoder().decode(b"I" + struct.pack(">I", 5) + b"N" + tuple_data([b"1"]))
    with pytest.raises(PgOutputError, match="unknown type"):
        PgOutputDecoder().decode(b"Z123")
    with pytest.raises(PgOutputError, match="described with 7"):
        decoder().decode(b"I" + struct.pack(">I", REL) + b"N" + tuple_data([b"1"]))
    with pytest.raises(PgOutputError, match="truncated or malformed"):
        decoder().decode(b"I" + struct.pack(">I", REL) + b"N" + tuple_data([b"1"] * 7)[:-3])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from(b"BCRIUDTYOM"))
def test_junk_gives_a_pgoutput_error_or_a_message_never_a_crash(tail, kind):
    d = decoder()
    try:
        d.decode(bytes([kind]) + struct.pack(">I", REL) + tail)
    except PgOutputError:
        pass
