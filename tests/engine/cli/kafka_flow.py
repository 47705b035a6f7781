"""A keyed Kafka flow for the detached-flow tests, configured by the environment of the
driver that loads it (``driftstream start tests.engine.cli.kafka_flow:flow``):
``DS_FLOW`` its name, ``DS_BOOTSTRAP`` the broker, ``DS_IN`` / ``DS_OUT`` its topics."""

from __future__ import annotations

import os

from driftstream.engine import Flow, KafkaSink, KafkaSource


def running_sum(total, record: dict):
    total = (total or 0) + record["v"]
    return total, {"k": record["k"], "sum": total}


def flow() -> Flow:
    env = os.environ
    f = Flow(env["DS_FLOW"])
    f.source(KafkaSource(env["DS_IN"], env["DS_BOOTSTRAP"]), name="events").key_by(lambda r: r["k"], name="by_key").stateful_map(
        running_sum, name="sums"
    ).sink(KafkaSink(env["DS_OUT"], env["DS_BOOTSTRAP"], name="out"))
    return f


def expected(records: list) -> dict:
    """Per key, the running sums in the order its records were produced (each key stays in
    one partition, so that is their order in t)."""
    sums: dict = {}
    for r in records:
        key_sums = sums.setdefault(r["k"], [])
        key_sums.append((key_sums[-1] if key_sums else 0) + r["v"])
    return sums
