"""Ground truth for the inverted-index benchmark: a PySpark batch job over the corpus Parquet.

Given the send sequence (see :mod:`corpus`), it computes

- the final index ``{word: {page_id: positions}}`` (each page's last version), and
- the change records an order-preserving engine emits, in send order: by ``seq``,
  then within a send in the order of :func:`documents.page_changes` (removes in the
  previous version's word order, then adds in the new version's word order), each
  with the exact ``df`` (number of pages holding the word after the change).

Spark does the work: each send's words with their positions (from
:func:`documents.word_positions` in a Python UDF, so the tokenization is exactly the
engine's) are exploded into one row per (send, word), joined with the same page's
previous send (a full outer join per word: removes, adds, re-positioned words), and
``df`` is a running sum of +1/-1/0 over a window per word ordered by ``seq``. Only
the result is collected to the driver.

:func:`check` compares an engine's output against the truth;
:func:`reference_changes` is a small pure-Python reference for tests.

>>> rows = [{"seq": 0, "page_id": 1, "text": "a b"}, {"seq": 1, "page_id": 2, "text": "b c"},
...         {"seq": 2, "page_id": 1, "text": "b a x"}]
>>> [(r["op"], r["word"], r["page_id"], r["df"]) for r in reference_changes(rows)]
[('add', 'a', 1, 1), ('add', 'b', 1, 1), ('add', 'b', 2, 2), ('add', 'c', 2, 1), ('add', 'b', 1, 2), ('add', 'a', 1, 1), ('add', 'x', 1, 1)]
>>> truth = GroundTruth(reference_index(rows), reference_changes(rows))
>>> check(reference_changes(rows), truth)
[]
>>> check(reference_changes(rows)[:-1], truth)[0]
"word 'x': 0 records, expected 1; first difference at #0: got nothing, expected page 1: add x [2] df=1"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Optional

from .documents import page_changes, rebuild_index, word_positions


@dataclass
class GroundTruth:
    """``index``: ``{word: {page_id: positions}}``; ``changes``: the change records in send order."""

    index: dict = field(default_factory=dict)
    changes: list = field(default_factory=list)

    def by_page(self) -> dict:
        """``{page_id: [change records of that page, in order]}``."""
        return _by_page(self.changes)

    def n_changes_by_page(self) -> dict:
        return {p: len(rs) for p, rs in self.by_page().items()}


def _word_positions_udf_body(text):
    """``documents.word_positions(text)`` as two parallel lists: the words (first-occurrence order), their positions."""
    wp = word_positions(text or "")
    return list(wp), list(wp.values())


def ground_truth(parquet_path: str, spark=None) -> GroundTruth:
    """Compute the final index and the expected change records of the corpus at ``parquet_path`` (see the module doc)."""
    from .corpus import spark_session

    with spark_session(spark, "driftstream-ground-truth") as sp:
        return _ground_truth(sp, parquet_path)


def _ground_truth(spark, parquet_path: str) -> GroundTruth:
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    pair = T.StructType([T.StructField("words", T.ArrayType(T.StringType())), T.StructField("positions", T.ArrayType(T.ArrayType(T.IntegerType())))])
    positions_of = F.udf(_word_positions_udf_body, pair, useArrow=False)
    sends = spark.read.parquet(parquet_path).select("seq", "page_id", "text")
    # one row per (send, distinct word); "first" is the word's rank in first-occurrence order
    wp = (
        sends.select("seq", "page_id", positions_of("text").alias("wp"))
        .select("seq", "page_id", F.posexplode("wp.words").alias("first", "word"), F.col("wp.positions").alias("all"))
        .select("seq", "page_id", "word", F.col("all")[F.col("first")].alias("positions"), "first")
        .cache()
    )
    per_page = Window.partitionBy("page_id").orderBy("seq")
    chain = sends.select(
        "seq",
        "page_id",
        F.lead("seq").over(per_page).alias("next_seq"),
    ).cache()
    # the words of each send, seen from the page's next send ("old" there)
    old = (
        wp.join(chain.where(F.col("next_seq").isNotNull()), ["seq", "page_id"])
        .select(F.col("next_seq").alias("seq"), "page_id", "word", F.col("positions").alias("old_positions"), F.col("first").alias("old_first"))
    )
    new = wp.select("seq", "page_id", "word", F.col("positions").alias("new_positions"), F.col("first").alias("new_first"))
    joined = new.join(old, ["seq", "page_id", "word"], "full_outer")
    removed = F.col("new_positions").isNull()
    changes = joined.where(removed | F.col("old_positions").isNull() | (F.col("new_positions") != F.col("old_positions"))).select(
        "seq",
        "page_id",
        "word",
        F.when(removed, F.lit(0)).otherwise(F.lit(1)).alias("kind"),  # removes before adds within a send
        F.when(removed, F.col("old_first")).otherwise(F.col("new_first")).alias("first"),
        F.col("new_positions").alias("positions"),
        F.when(removed, F.lit(-1)).when(F.col("old_positions").isNull(), F.lit(1)).otherwise(F.lit(0)).alias("delta"),
    )
    running = Window.partitionBy("word").orderBy("seq").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    changes = changes.withColumn("df", F.sum("delta").over(running).cast("long"))
    # the send order: (seq, kind, first) identifies a record; sorted on the driver by Arrow (cheaper than a Spark sort here)
    ordered = changes.select("seq", "kind", "first", "word", "page_id", "positions", "df")

    last = chain.where(F.col("next_seq").isNull()).select("seq", "page_id")
    final = wp.join(last, ["seq", "page_id"]).select("word", "page_id", "positions")

    ct = ordered.toArrow().sort_by([("seq", "ascending"), ("kind", "ascending"), ("first", "ascending")])
    out: list = []
    for kind, word, page_id, positions, df in zip(*(ct.column(c).to_pylist() for c in ("kind", "word", "page_id", "positions", "df"))):
        if kind:
            out.append({"op": "add", "word": word, "page_id": page_id, "positions": positions, "df": df})
        else:
            out.append({"op": "remove", "word": word, "page_id": page_id, "df": df})
    ft = final.toArrow()
    index: dict = {}
    for word, page_id, positions in zip(*(ft.column(c).to_pylist() for c in ("word", "page_id", "positions"))):
        index.setdefault(word, {})[page_id] = positions
    wp.unpersist()
    chain.unpersist()
    return GroundTruth(index=index, changes=out)


# ---------------------------------------------------------------- pure-Python reference


def _rows_in_order(rows: Iterable) -> list:
    rows = [dict(r) for r in rows]
    if rows and "seq" in rows[0]:
        rows.sort(key=lambda r: r["seq"])
    return rows


def reference_changes(rows: Iterable) -> list:
    """The change records of the sends ``rows`` (dicts with page_id, text, optionally seq), sequentially."""
    pages: dict = {}
    df: dict = defaultdict(int)
    out: list = []
    for r in _rows_in_order(rows):
        pid = r["page_id"]
        new = word_positions(r["text"])
        for op, word, positions in page_changes(pages.get(pid), new):
            if op == "remove":
                df[word] -= 1
                out.append({"op": "remove", "word": word, "page_id": pid, "df": df[word]})
            else:
                if word not in (pages.get(pid) or {}):
                    df[word] += 1
                out.append({"op": "add", "word": word, "page_id": pid, "positions": list(positions), "df": df[word]})
        pages[pid] = new
    return out


def reference_index(rows: Iterable) -> dict:
    """The final index of the sends ``rows``, from each page's last version."""
    last: dict = {}
    for r in _rows_in_order(rows):
        last[r["page_id"]] = r["text"]
    index: dict = {}
    for pid, text in last.items():
        for word, positions in word_positions(text).items():
            index.setdefault(word, {})[pid] = positions
    return index


def n_changes(rows: Iterable) -> list:
    """Per send (in order), the number of change records it produces."""
    pages: dict = {}
    out = []
    for r in _rows_in_order(rows):
        new = word_positions(r["text"])
        out.append(len(page_changes(pages.get(r["page_id"]), new)))
        pages[r["page_id"]] = new
    return out


# ---------------------------------------------------------------- checking an engine's output


def _norm(r: dict, compare_df: bool = True) -> tuple:
    op = r.get("op")
    positions = tuple(r.get("positions") or ()) if op == "add" else None
    return (op, r.get("word"), r.get("page_id"), positions, r.get("df") if compare_df else None)


def _show(t: Optional[tuple]) -> str:
    if t is None:
        return "nothing"
    op, word, _, positions, df = t
    s = f"{op} {word}"
    if positions is not None:
        s += f" {list(positions)}"
    if df is not None:
        s += f" df={df}"
    return s


def _show_page(t: Optional[tuple]) -> str:
    return "nothing" if t is None else f"page {t[2]}: {_show(t)}"


def _by_word(records: Iterable[dict]) -> dict:
    out: dict = defaultdict(list)
    for r in records:
        out[r.get("word")].append(r)
    return dict(out)


def _by_page(records: Iterable[dict]) -> dict:
    out: dict = defaultdict(list)
    for r in records:
        out[r.get("page_id")].append(r)
    return dict(out)


def check(records: list, truth: GroundTruth, compare_df: bool = True, max_messages: int = 20) -> list:
    """Discrepancies between an engine's change records and the truth (empty when they match).

    Records are compared per word, in order: a word's records come from one output
    partition, so their order (the word's ``df`` sequence) is the engine's; the
    interleaving of partitions at the consumer is not, so records are not compared
    across words (equal per-word sequences mean equal records overall). Then the index the records rebuild must equal ``truth.index``.
    With ``compare_df=False`` a word's records are compared as a multiset without ``df``.
    Extra keys in the records are ignored.
    """
    msgs: list = []
    got, want = _by_word(records), _by_word(truth.changes)
    bad_words = 0
    for word in sorted(set(got) | set(want), key=str):
        g = [_norm(r, compare_df) for r in got.get(word, [])]
        w = [_norm(r, compare_df) for r in want.get(word, [])]
        if not compare_df:  # an engine that does not keep the order: compare as multisets
            g, w = sorted(g, key=repr), sorted(w, key=repr)
        if g == w:
            continue
        bad_words += 1
        if len(msgs) < max_messages:
            i = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            msgs.append(
                f"word {word!r}: {len(g)} records, expected {len(w)}; first difference at #{i}: "
                f"got {_show_page(g[i] if i < len(g) else None)}, expected {_show_page(w[i] if i < len(w) else None)}"
            )
    if bad_words > len(msgs):
        msgs.append(f"... {bad_words} words differ in all")
    index = rebuild_index(records)
    if index != truth.index:
        missing = [w for w in truth.index if w not in index]
        extra = [w for w in index if w not in truth.index]
        differ = [w for w in truth.index if w in index and index[w] != truth.index[w]]
        msgs.append(
            f"rebuilt index differs: {len(missing)} words missing (e.g. {missing[:5]}), {len(extra)} extra (e.g. {extra[:5]}), "
            f"{len(differ)} with other pages or positions (e.g. {differ[:5]})"
        )
    return msgs


# ---------------------------------------------------------------- CLI


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m driftstream.examples.inverted_index.ground_truth", description="Ground truth of a corpus Parquet.")
    p.add_argument("parquet")
    p.add_argument("--changes-out", default=None, help="write the expected change records as JSON lines here")
    args = p.parse_args(argv)
    t0 = time.time()
    truth = ground_truth(args.parquet)
    print(f"{len(truth.changes)} change records, {len(truth.index)} distinct words ({time.time() - t0:.1f} s)")
    if args.changes_out:
        with open(args.changes_out, "w", encoding="utf-8") as f:
            for r in truth.changes:
                f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
