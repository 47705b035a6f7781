"""The codec harness (``driftstream bench kafka-codecs``) on a small index: every codec's
batches read back whole, and each one saves bytes on the index's JSON output (figures
printed, times not asserted)."""

from __future__ import annotations

from driftstream.engine.testing import MemorySink, MemorySource
from driftstream.examples.benchmarks.kafka_codecs import CODECS, codec_figures, format_figures
from driftstream.examples.inverted_index.pipeline import build

WORDS = "stream order state time key word page index change record batch codec broker topic".split()


def test_every_codec_reads_back_and_saves_bytes_on_the_index_output():
    docs = [{"page_id": p, "text": " ".join(WORDS[(p * 7 + i * 3) % len(WORDS)] for i in range(40))} for p in range(30)]
    elements = build(MemorySource(docs), MemorySink("changes")).run(runtime="simulator", seed=1).output_with_meta("changes")
    figures = codec_figures(elements, repeats=1)  # raises if a codec's batches do not read back whole
    print(format_figures(figures))
    assert [f.codec for f in figures] == ["none", "gzip", "snappy", "lz4", "zstd"] * 2 and len(CODECS) == 5
    assert all(f.records == len(elements) for f in figures)
    assert all(f.saved_pct > 50 for f in figures if f.codec != "none")
