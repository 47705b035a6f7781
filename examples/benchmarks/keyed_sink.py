"""What ``KafkaSink(key=...)`` costs against the unkeyed sink, in the same invocation (the ratio
is the figure; this machine is shared and noisy).

    driftstream bench keyed-sink                          # a local broker (Tansu), 4 partitions
    driftstream bench keyed-sink --records 200000 --flow-records 100000 --json keyed.json

- ``write``: one sink partition in this process writing ``--records`` count records (``{"k",
  "i", "n"}``, 1,000 keys) in bundles of ``--bundle``: records/s and µs a record, unkeyed (one
  partition) against keyed (each record keyed, murmur2, split over the topic's partitions).
- ``flow``: a flow on Ray at ``--parallelism`` (MemorySource -> map -> sink) over
  ``--flow-records``: records/s from ``flow.run`` to its return; the keyed flow has the
  shuffle by Kafka partition before its sink. Both alternate for ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Optional

from driftstream.barriers.bundle import Bundle
from driftstream.ordering.meta import Meta


def _elements(n: int, keys: int = 1000) -> list:
    return [(Meta(i, 0, 0, i), {"k": f"key-{i % keys}", "i": i, "n": i // keys + 1}) for i in range(n)]


def write_figures(bs: str, records: int, bundle: int, partitions: int = 4) -> dict:
    """µs a record of one sink partition's ``write``, unkeyed and keyed, on fresh topics."""
    from driftstream.engine.connectors.kafka.io import ensure_topic
    from driftstream.engine.connectors.kafka.sink import KafkaSink

    elements = _elements(records)
    out = {}
    for label, key in (("unkeyed", None), ("keyed", lambda c: c["k"])):
        topic = f"bench-keyed-{uuid.uuid4().hex[:8]}"
        ensure_topic(bs, topic, partitions)
        part = KafkaSink(topic, bs, key=key).open(0, 1)
        part.write(Bundle(elements[:bundle]))  # connections opened before the clock starts
        began = time.perf_counter()
        for at in range(bundle, records, bundle):
            part.write(Bundle(elements[at:at + bundle]))
        seconds = time.perf_counter() - began
        part.close()
        n = records - bundle
        out[label] = {"records": n, "seconds": round(seconds, 3), "records_per_s": round(n / seconds), "us_per_record": round(seconds / n * 1e6, 2)}
    out["keyed_over_unkeyed"] = round(out["keyed"]["records_per_s"] / out["unkeyed"]["records_per_s"], 3)
    return out


def flow_figures(bs: str, records: int, parallelism: int, rounds: int, partitions: int = 4) -> dict:
    """records/s of a flow into each sink on Ray, alternating, ``rounds`` times."""
    from driftstream.engine import Flow
    from driftstream.engine.connectors.kafka.io import ensure_topic
    from driftstream.engine.connectors.kafka.sink import KafkaSink
    from driftstream.engine.testing import MemorySource

    docs = [{"k": f"key-{i % 1000}", "i": i} for i in range(records)]
    runs: dict = {"unkeyed": [], "keyed": []}
    for r in range(rounds):
        for label, key in (("unkeyed", None), ("keyed", lambda c: c["k"])):
            topic = f"bench-keyed-flow-{uuid.uuid4().hex[:8]}"
            ensure_topic(bs, topic, partitions)
            flow = Flow(f"bench-{label}-{r}")
            flow.source(MemorySource(docs, partitions=parallelism), name="docs").map(lambda d: {**d, "n": 1}, name="m").sink(
                KafkaSink(topic, bs, name="out", key=key))
            began = time.perf_counter()
            flow.run(parallelism=parallelism)
            runs[label].append(round(records / (time.perf_counter() - began)))
    out = {label: {"records_per_s": rates, "median": sorted(rates)[len(rates) // 2]} for label, rates in runs.items()}
    out["keyed_over_unkeyed"] = round(out["keyed"]["median"] / out["unkeyed"]["median"], 3)
    return out


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="driftstream bench keyed-sink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None, help="a broker (default: a local Tansu, started and stopped here)")
    parser.add_argument("--records", type=int, default=100_000, help="records of the write figures (default 100,000)")
    parser.add_argument("--bundle", type=int, default=500, help="records a bundle (default 500)")
    parser.add_argument("--flow-records", type=int, default=50_000, help="records of each flow run on Ray; 0: no flow runs (default 50,000)")
    parser.add_argument("--parallelism", "-p", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="flow runs of each sink, alternating (default 2)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    broker = None
    bs = args.bootstrap_servers
    if bs is None:
        from driftstream.engine.connectors.local_kafka import start_local_kafka

        broker = start_local_kafka()
        bs = broker.bootstrap_servers
    try:
        figures = {"write": write_figures(bs, args.records, args.bundle)}
        if args.flow_records:
            figures["flow"] = flow_figures(bs, args.flow_records, args.parallelism, args.rounds)
    finally:
        if broker is not None:
            broker.stop()
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
