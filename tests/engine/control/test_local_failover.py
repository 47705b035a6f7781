"""LocalFailover's decisions without Ray: in which rounds the survivors take their part of a
local recovery (the replacement's receivers before its senders, else one round)."""

from __future__ import annotations

from driftstream.engine import Flow
from driftstream.engine.connectors.file_sink import FileSink
from driftstream.engine.control.local_failover import part_rounds
from driftstream.engine.testing import MemorySource


def _plan(tmp_path, second_stage: bool):
    """src -> by_key (a running count) [-> par (a count per parity)] -> sink, parallelism 2."""
    flow = Flow("rounds")
    keyed = flow.source(MemorySource([("k", 1)], partitions=2), name="src").key_by(lambda x: x[0], name="by_key") \
        .stateful_map(lambda n, v: ((n or 0) + 1, v), name="sum")
    if second_stage:
        keyed = keyed.key_by(lambda v: v[1] % 2, name="par").stateful_map(lambda n, v: ((n or 0) + 1, v), name="count")
    keyed.sink(FileSink(tmp_path / "out", name="out"))
    return flow.plan(parallelism=2)


def _rounds(plan, victim) -> list:
    peers = [(k, plan.actor_name(k)) for k in plan.instances if k != victim]
    return [[name.split("/", 1)[1] for _, name in r] for r in part_rounds(plan, victim, peers)]


def test_survivors_unrelated_to_the_replacement_take_their_part_with_its_senders(tmp_path):
    """A keyed instance with no downstream stage: nobody receives from the replacement, so its
    senders' replay may go at once with the others' parts (two rounds to busy instances were one
    round trip more before the first output)."""
    plan = _plan(tmp_path, second_stage=False)
    assert _rounds(plan, plan.instances[3]) == [["src/0", "src/1", "by_key/0"]]


def test_a_source_replacement_has_no_senders_one_round(tmp_path):
    plan = _plan(tmp_path, second_stage=True)
    assert _rounds(plan, plan.instances[0]) == [["src/1", "by_key/0", "by_key/1", "par/0", "par/1"]]


def test_the_replacements_receivers_go_before_its_senders(tmp_path):
    """by_key/0 feeds par: par (and the others that do not send to it) first, then the sources."""
    plan = _plan(tmp_path, second_stage=True)
    assert _rounds(plan, plan.instances[2]) == [["by_key/1", "par/0", "par/1"], ["src/0", "src/1"]]
