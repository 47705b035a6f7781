"""``driftstream bench acker``: the acker's capacity, in acks/s, and the cluster size where it binds.

One acker per flow folds every stage instance's flush (:class:`~driftstream.engine.runtime.protocol.Ack`)
and pushes each watermark to every instance. Three measurements:

* ``fold``: the real :class:`~driftstream.engine.runtime.acker_host.AckerHost` in this
  process over synthetic flushes: µs of CPU per ack for the fold, the frame's unpickling,
  and the watermark pushes (pickled for each subscriber, as the data plane does), with
  ``turn`` acks per event-loop turn (the pushes of a turn coalesce into one).
* ``ray``: a real :class:`~driftstream.engine.runtime.actors.AckerActor` on Ray and N
  synthetic sender actors sending ack frames over the real data plane on a wall-clock
  schedule, a ladder of total ack rates: the acks/s it folds, its CPU per ack, and the
  lag from a time's last ack being due to its watermark reaching the senders.
* ``flows``: the inverted index (files basis) and Nexmark q5 in a backlog at parallelism 2:
  the acks/s the acker receives, per stage instance and per CPU-second of the stage
  instances (what one instance on a core of its own would send), and the acker's own CPU per ack.

    driftstream bench acker                              # all three, about a minute
    driftstream bench acker --only fold --instances 16,256,1024
    driftstream bench acker --only ray --senders 8 --rates 2000,8000,16000 --seconds 4 --json out.json

The synthetic protocol: sender ``i``'s ``k``-th flush XORs in a new id at time ``T(k)`` and
XORs out its id of flush ``k - 1`` (a batch sent, the previous one acked), and half the
senders are sources whose bound is ``T(k)``; so ``T(k)`` settles once every sender sent
flush ``k + 1``, and the watermark then reaches ``T(k + 1)``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from driftstream.ordering.ack_shards import AckShard, shard_of

from driftstream.engine.runtime.acker_host import AckerHost
from driftstream.engine.runtime.protocol import Ack, ShardFlush, Watermark


def t_of(k: int, sender: int = 0) -> tuple:
    """The global time of flush ``k`` in the synthetic protocol (of ``sender``'s, spread: see :func:`synthetic_flush`)."""
    return (k, 0, sender, k)


def flush_id(sender: int, k: int) -> int:
    """The 64-bit id sender ``sender`` XORs in at its flush ``k`` (a batch it sent), the same in every process.

    >>> flush_id(0, 1) == flush_id(0, 1) != flush_id(1, 0)
    True
    """
    return (hash((0x5EED, sender, k)) & 0xFFFF_FFFF_FFFF_FFFF) | 1


def synthetic_flush(k: int, sender: int, senders: int, source_index: Optional[int], spread: bool = False) -> Ack:
    """Flush ``k`` of ``sender``: its own id of flush ``k`` XORed in at ``T(k)`` (a batch sent),
    the previous sender's id of flush ``k - 1`` XORed out at ``T(k - 1)`` (that batch acked: a
    pair split between two instances, as a sender's and its receiver's are); a source
    sends ``T(k)`` as its bound. ``spread``: each sender's times its own (``t_of(k, sender)``),
    so that no two flushes share a time and a shard's batch cancels nothing (the fold's cost
    at its highest; the watermark's lag is measured without).

    >>> a = synthetic_flush(1, 0, 2, 0); sorted(a.xors) == [t_of(0), t_of(1)], a.xors[t_of(0)] == flush_id(1, 0), a.bound
    (True, True, (1, 0, 0, 1))
    >>> sorted(synthetic_flush(1, 0, 2, None, spread=True).xors)
    [(0, 0, 1, 0), (1, 0, 0, 1)]
    """
    previous = (sender - 1) % senders
    xors = {t_of(k, sender if spread else 0): flush_id(sender, k)}
    if k:
        xors[t_of(k - 1, previous if spread else 0)] = flush_id(previous, k - 1)
    return Ack(xors, source_index, None if source_index is None else t_of(k))


def synthetic_acks(senders: int, flushes: int, spread: bool = False) -> list:
    """Every sender's ``flushes`` flushes, round-robin (sender 0's flush k, sender 1's flush k, ...);
    senders ``0 .. senders // 2`` (at least one) are the sources.

    >>> acker = AckerHost(1, lambda to, m: None)
    >>> for ack in synthetic_acks(2, 3):
    ...     acker.receive(ack)
    >>> acker.pushed                   # T(2) is held by each sender's last flush
    (2, 0, 0, 2)
    """
    sources = max(1, senders // 2)
    return [synthetic_flush(k, i, senders, i if i < sources else None, spread) for k in range(flushes) for i in range(senders)]


def shard_batches(acks: list, instances: int, shards: int, per_batch: int) -> list:
    """``acks`` (round-robin over ``instances`` senders) through ``shards`` acker shards, each
    sending its batch after every ``per_batch`` flushes: the root's messages, in order.

    >>> batches = shard_batches(synthetic_acks(4, 3), 4, 2, 3)
    >>> [b.flushes for b in batches], sum(len(b.xors) for b in batches) <= 2 * 12
    ([3, 3, 3, 3], True)
    """
    shards_ = [AckShard() for _ in range(shards)]
    out = []
    for i, ack in enumerate(acks):
        shard = shards_[shard_of(i % instances, shards)]
        shard.add(ack.xors, ack.source_index, ack.bound)
        if shard.flushes == per_batch:
            batch = shard.drain()
            out.append(ShardFlush(batch.xors, batch.bounds, batch.flushes, []))
    for shard in shards_:
        batch = shard.drain()
        if batch is not None:
            out.append(ShardFlush(batch.xors, batch.bounds, batch.flushes, []))
    return out


def fold_cost(instances: int, flushes: int, turn: int = 8, rounds: int = 3, shards: int = 0, spread: bool = False) -> dict:
    """µs of CPU per ack of the real AckerHost over ``instances`` synthetic senders (each
    also a subscriber), ``turn`` acks per loop turn; the best of ``rounds``. ``decode``: the
    frames' ``pickle.loads``; ``fold``: ``receive`` (the table, its heap, the bounds);
    ``push``: the coalesced watermarks, one pickled frame per subscriber. ``shards``: the
    root's part alone, its messages the batches of that many shards (each of ``turn``
    flushes, a batch per shard a turn), its pushes a frame per shard (they pass them on);
    what the shards spend is the one acker's fold and pushes split.
    ``spread``: see :func:`synthetic_flush`."""
    acks = synthetic_acks(instances, flushes, spread)
    messages = acks if not shards else shard_batches(acks, instances, shards, turn)
    frames = [pickle.dumps(a, protocol=pickle.HIGHEST_PROTOCOL) for a in messages]
    per_turn = turn if not shards else shards
    best: dict = {}
    for _ in range(rounds):
        deferred: list = []
        pushed = [0]

        def send(to: Any, message: Any) -> None:
            pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            pushed[0] += 1

        host = AckerHost(max(1, instances // 2), send, defer=deferred.append, subscribers=list(range(instances)),
                         relays=[("shard", j) for j in range(shards)] if shards else None)
        t0 = time.process_time()
        decoded = [pickle.loads(f) for f in frames]
        t1 = time.process_time()
        fold = push = 0.0
        for i in range(0, len(decoded), per_turn):
            a = time.process_time()
            for message in decoded[i:i + per_turn]:
                host.receive(message)
            b = time.process_time()
            while deferred:
                deferred.pop(0)()
            push += time.process_time() - b
            fold += b - a
        n = len(acks)
        figures = {"decode_us": (t1 - t0) / n * 1e6, "fold_us": fold / n * 1e6, "push_us": push / n * 1e6,
                   "pushes": pushed[0] // max(1, instances), "watermark_frames": pushed[0]}
        figures["total_us"] = figures["decode_us"] + figures["fold_us"] + figures["push_us"]
        if not best or figures["total_us"] < best["total_us"]:
            best = figures
    best.update(instances=instances, acks=len(acks), turn=turn, shards=shards, spread=spread, root_messages=len(frames),
                capacity_acks_per_s=round(1e6 / best["total_us"]))
    for k in ("decode_us", "fold_us", "push_us", "total_us"):
        best[k] = round(best[k], 2)
    return best


def settled_count(w: tuple, settled: int) -> int:
    """How many synthetic times ``T(0), T(1), ...`` lie below watermark ``w``, counting on from ``settled``.

    >>> settled_count((3, 0, 0, 3), 0), settled_count((3, 0, 0, 4), 1), settled_count((float("inf"),), 5)
    (3, 4, 5)
    """
    if w[0] == float("inf"):
        return settled
    while t_of(settled) < w:
        settled += 1
    return settled


def lag_summary(lags: list) -> dict:
    """p50 / p99 / max of lags in ms.

    >>> lag_summary([0.001, 0.002, 0.003])
    {'p50_ms': 2.0, 'p99_ms': 3.0, 'max_ms': 3.0, 'samples': 3}
    """
    if not lags:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None, "samples": 0}
    s = sorted(lags)
    return {"p50_ms": round(s[len(s) // 2] * 1e3, 2), "p99_ms": round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3, 2),
            "max_ms": round(s[-1] * 1e3, 2), "samples": len(s)}


def _sender_class() -> Any:
    import ray

    from driftstream.engine.runtime.transport import Endpoint

    @ray.remote(num_cpus=0)
    class SyntheticSender:
        """A stage instance reduced to its acks: flushes on a wall-clock schedule, and the
        watermarks it receives turned into lags (the time ``T(k)`` settled - when its last ack was due)."""

        def __init__(self, index: int, key: Any, source_index: Optional[int]) -> None:
            self.index, self.key, self.source_index = index, key, source_index
            self.settled, self.lags, self.due = 0, [], []

        async def listen(self) -> tuple:
            self.endpoint = Endpoint(self.key, self._on_message, me=f"sender-{self.index}")
            return await self.endpoint.listen("127.0.0.1")

        async def connect(self, address: tuple) -> None:
            await self.endpoint.connect("acker", address)

        def _on_message(self, message: Any) -> None:
            if type(message) is Watermark:
                now, before = time.time(), self.settled
                self.settled = settled_count(message.t, before)
                due = self.due
                for k in range(before, min(self.settled, len(due))):
                    self.lags.append(now - due[k])

        async def watermark(self, w: tuple) -> None:
            """The last watermark's Ray call (never sent here: no source reaches TOP)."""

        async def prepare(self, flushes: int, senders: int) -> None:
            """Pickle the ``flushes`` frames beforehand (the transport's framing, ``transport._LEN``):
            the sender's own cost kept small, so that on a small machine the acker is what saturates."""
            self.frames = []
            for k in range(flushes):
                data = pickle.dumps(synthetic_flush(k, self.index, senders, self.source_index), protocol=pickle.HIGHEST_PROTOCOL)
                self.frames.append(len(data).to_bytes(4, "big") + data)

        async def run(self, epoch: float, rate: float) -> dict:
            """Send the prepared flushes, flush ``k`` due at ``epoch + k / rate``, every millisecond
            all that are due in one write; the lags of the times settled."""
            frames = self.frames
            flushes = len(frames)
            # T(k) settles once every sender sent flush k + 1, due at epoch + (k + 1) / rate
            self.due = [epoch + (k + 1) / rate for k in range(flushes)]
            writer = self.endpoint.writers["acker"]
            sent, late = 0, 0.0
            while sent < flushes:
                now = time.time()
                due = min(flushes, int((now - epoch) * rate) + 1)
                if due > sent:
                    late = max(late, now - (epoch + (sent + 1) / rate))
                    writer.write(b"".join(frames[sent:due]))
                    sent = due
                    await writer.drain()
                await asyncio.sleep(max(0.0, min(0.001, epoch + sent / rate - time.time())))
            await asyncio.sleep(0.5)  # the last watermarks
            return {"lags": self.lags, "late_s": late, "settled": self.settled}

        async def close(self) -> None:
            await self.endpoint.close()

    return SyntheticSender


def _acker_probe(actor: Any) -> dict:
    """The acker actor's pid, CPU seconds so far and acks folded (one call into its process)."""
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: {"pid": os.getpid(), "cpu_s": time.process_time(),
                                                           "updates": self.host.updates, "entries": self.host.entries}))


def ray_ladder(senders: int, rates: list, seconds: float, shards: int = 0) -> list:
    """The real acker actor under ``senders`` synthetic senders at each total ack rate of
    ``rates`` for ``seconds``: acks/s folded, the acker's CPU per ack, the watermark's lag.
    ``shards``: that many :class:`~driftstream.engine.runtime.acker_shard_actor.AckShardActor`
    between the senders (sender ``i`` to shard ``i % shards``) and the acker, which pushes its
    watermarks to the shards, each passing them on to its senders; their CPU per ack beside the root's."""
    import ray

    from driftstream.engine.model.data_plane import PlaneKey
    from driftstream.engine.runtime.acker_shard_actor import AckShardActor
    from driftstream.engine.runtime.actors import AckerActor

    Sender = _sender_class()
    rows = []
    for rate in rates:
        key = PlaneKey.new()
        sources = max(1, senders // 2)
        acker = AckerActor.remote(sources, key)
        actors = [Sender.remote(i, key, i if i < sources else None) for i in range(senders)]
        acker_address = ray.get(acker.listen.remote())
        addresses = dict(zip(range(senders), ray.get([a.listen.remote() for a in actors])))
        shard_actors = [AckShardActor.remote(key, f"acker shard {j}") for j in range(shards)]
        if shards:  # the senders' acks through their shard; the root's watermarks to the shards, and on
            shard_addresses = ray.get([s.listen.remote() for s in shard_actors])
            keys = [("shard", j) for j in range(shards)]
            ray.get(acker.connect.remote(dict(zip(keys, shard_actors)), dict(zip(keys, shard_addresses))))
            ray.get([s.connect.remote(acker_address) for s in shard_actors])
            ray.get([s.connect_instances.remote({i: addresses[i] for i in range(senders) if i % shards == j}) for j, s in enumerate(shard_actors)])
            ray.get([a.connect.remote(shard_addresses[i % shards]) for i, a in enumerate(actors)])
        else:
            ray.get(acker.connect.remote(dict(zip(range(senders), actors)), addresses))
            ray.get([a.connect.remote(acker_address) for a in actors])
        per_sender = rate / senders
        flushes = max(2, int(per_sender * seconds))
        ray.get([a.prepare.remote(flushes, senders) for a in actors])
        before, shards_before = _acker_probe(acker), ray.get([s.stats.remote() for s in shard_actors])
        epoch = time.time() + 0.2
        results = ray.get([a.run.remote(epoch, per_sender) for a in actors])
        after, shards_after = _acker_probe(acker), ray.get([s.stats.remote() for s in shard_actors])
        span = time.time() - 0.5 - epoch
        folded = after["updates"] - before["updates"]
        lags = [x for r in results for x in r["lags"]]
        row = {"senders": senders, "offered_acks_per_s": rate, "folded_acks_per_s": round(folded / span),
               "acker_cpu_us_per_ack": round((after["cpu_s"] - before["cpu_s"]) / max(1, folded) * 1e6, 1),
               "acker_cpu_share": round((after["cpu_s"] - before["cpu_s"]) / span, 3),
               "senders_late_max_s": round(max(r["late_s"] for r in results), 3),
               "settled_all": all(r["settled"] >= flushes - 1 for r in results), **lag_summary(lags)}
        if shards:
            batches = sum(b["sent"] - a["sent"] for a, b in zip(shards_before, shards_after))
            row.update(shards=shards, root_batches=batches, flushes_per_batch=round(folded / max(1, batches), 1),
                       shard_cpu_us_per_ack=round(sum(b["cpu_s"] - a["cpu_s"] for a, b in zip(shards_before, shards_after)) / max(1, folded) * 1e6, 1),
                       shard_errors=[b["error"] for b in shards_after if b["error"]])
        rows.append(row)
        print(json.dumps(row), flush=True)
        ray.get([a.close.remote() for a in [*actors, *shard_actors, acker]])
        for a in [*actors, *shard_actors, acker]:
            ray.kill(a)
    return rows


def _flow(kind: str, size: int, workdir: Path) -> Any:
    """The flow measured by :func:`flow_acks`: the inverted index from two JSON-lines files, or Nexmark q5 from two event files."""
    import orjson

    from driftstream.engine.connectors.file_sink import FileSink
    from driftstream.engine.connectors.file_source import FileSource

    tag = f"{kind}-{time.time_ns()}"
    if kind == "index":
        from driftstream.examples.benchmarks.backlog import documents
        from driftstream.examples.inverted_index.pipeline import build

        docs = documents(size)
        (workdir / tag).mkdir(parents=True)
        for i in range(2):
            (workdir / tag / f"docs-{i}.jsonl").write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs[i::2]))
        flow = build(FileSource(str(workdir / tag / "*.jsonl")), FileSink(str(workdir / f"out-{tag}"), name="changes"), name=f"acks-{tag}")
    else:
        from driftstream.examples.nexmark.flink_queries import write_event_files
        from driftstream.examples.nexmark.generator import event_time, events
        from driftstream.examples.nexmark.queries import build

        write_event_files(events(size), workdir / tag, 2)
        source = FileSource(sorted(str(p) for p in (workdir / tag).glob("events-*.json")), timestamp=event_time)
        flow = build(kind, source, FileSink(str(workdir / f"out-{tag}"), name=kind), name=f"acks-{tag}")
    flow.dead_letters(FileSink(str(workdir / f"dlq-{tag}"), name="dlq"))
    return flow


def flow_acks(kind: str, size: int, parallelism: int = 2, poll_s: float = 0.1) -> dict:
    """Run ``kind`` ("index": ``size`` documents; "q5": ``size`` Nexmark events) in a backlog,
    exactly-once with 1 s snapshots, polling its acker's counter and every actor's CPU time:
    acks/s while busy, per stage instance, per CPU-second of the stage instances, and the
    acker's CPU per ack."""
    import psutil
    import ray

    from driftstream.engine.control.launcher import acker_name_of
    from driftstream.engine.runtime.ray_session import NAMESPACE

    workdir = Path(tempfile.mkdtemp(prefix="acker-capacity-"))
    flow = _flow(kind, size, workdir)
    plan = flow.plan(parallelism)
    handle = flow.start(parallelism, guarantee="exactly-once", snapshot_interval=1.0, snapshot_dir=str(workdir / "snaps"))
    samples: list = []  # (time, acks folded, {actor: CPU seconds}) once every actor's process is known
    procs: dict = {}
    pids: dict = {}  # actor -> the ref of its pid (asked without waiting: a busy loop answers late)
    acker = None
    while handle._thread is not None and handle._thread.is_alive():
        try:
            if acker is None:
                acker = ray.get_actor(acker_name_of(plan), namespace=NAMESPACE)
                pids["acker"] = acker.__ray_call__.remote(lambda self: os.getpid())
                for inst in plan.instances:
                    pids[inst] = ray.get_actor(plan.actor_name(inst), namespace=NAMESPACE).__ray_call__.remote(lambda self: os.getpid())
            for name, ref in list(pids.items()):
                if ray.wait([ref], timeout=0)[0]:
                    procs[name] = psutil.Process(ray.get(ref))
                    del pids[name]
            probe = _acker_probe(acker)
            if not pids:
                samples.append((time.time(), probe["updates"], {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}, probe["entries"]))
        except (ValueError, ray.exceptions.RayError, psutil.Error):
            pass  # not launched yet, or the run is ending
        time.sleep(poll_s)
    handle.wait()
    busy = [s for s in samples if s[1] > samples[0][1]] if samples else []
    if len(busy) < 2:
        raise RuntimeError(f"bench acker: the {kind} run ended before its acker could be sampled twice: give it more input")
    (t0, u0, c0, e0), (t1, u1, c1, e1) = busy[0], busy[-1]
    stage_cpu = sum(c1[k] - c0[k] for k in c1 if k != "acker")
    instances = len(plan.instances)
    return {"flow": kind, "size": size, "parallelism": parallelism, "instances": instances, "busy_s": round(t1 - t0, 2),
            "acks": u1 - u0, "acks_per_s": round((u1 - u0) / (t1 - t0)), "acks_per_s_per_instance": round((u1 - u0) / (t1 - t0) / instances),
            "stage_cpu_s": round(stage_cpu, 2), "acks_per_instance_cpu_s": round((u1 - u0) / stage_cpu) if stage_cpu else None,
            "acker_cpu_us_per_ack": round((c1["acker"] - c0["acker"]) / max(1, u1 - u0) * 1e6, 1),
            "times_per_ack": round((e1 - e0) / max(1, u1 - u0), 1)}


def binding_size(capacity_acks_per_s: float, acks_per_instance_s: float) -> int:
    """Stage instances, each sending ``acks_per_instance_s``, that one acker of ``capacity_acks_per_s`` keeps up with.

    >>> binding_size(40_000, 400)
    100
    """
    return int(capacity_acks_per_s // acks_per_instance_s)


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def main(argv: Optional[list] = None) -> int:
    """``driftstream bench acker``: see the module's docstring."""
    parser = argparse.ArgumentParser(prog="driftstream bench acker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("fold", "ray", "flows"), default=None, help="one of the three measurements")
    parser.add_argument("--instances", type=_ints, default=[4, 16, 64, 256, 1024], help="fold: subscribers = senders (comma-separated)")
    parser.add_argument("--flushes", type=int, default=0, help="fold: flushes per sender (default: about 40,000 acks in all)")
    parser.add_argument("--turn", type=int, default=8, help="fold: acks per event-loop turn (default 8)")
    parser.add_argument("--spread", action="store_true", help="fold: each sender's times its own (no time shared by two flushes)")
    parser.add_argument("--senders", type=int, default=8, help="ray: synthetic sender actors (default 8)")
    parser.add_argument("--rates", type=_ints, default=[1000, 4000, 8000, 16000, 32000], help="ray: total acks/s, the ladder")
    parser.add_argument("--seconds", type=float, default=3.0, help="ray: seconds per rung (default 3)")
    parser.add_argument("--shards", type=_ints, default=[0, 4], help="fold and ray: acker shards, a run for each (default 0,4; 0: none)")
    parser.add_argument("--docs", type=int, default=10_000, help="flows: documents of the inverted index (default 10,000)")
    parser.add_argument("--events", type=int, default=300_000, help="flows: Nexmark q5 events (default 300,000)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    figures: dict = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count()}
    if args.only in (None, "fold"):
        figures["fold"] = []
        for shards in args.shards:
            for n in args.instances:
                row = fold_cost(n, args.flushes or max(4, 40_000 // n), args.turn, shards=shards, spread=args.spread)
                figures["fold"].append(row)
                print(json.dumps(row), flush=True)
    if args.only in (None, "ray", "flows"):
        from driftstream.engine.runtime.ray_session import ensure_ray

        ensure_ray(None)
        if args.only in (None, "ray"):
            figures["ray"] = [row for shards in args.shards for row in ray_ladder(args.senders, args.rates, args.seconds, shards)]
        if args.only in (None, "flows"):
            figures["flows"] = []
            for kind, size in (("index", args.docs), ("q5", args.events)):
                row = flow_acks(kind, size)
                figures["flows"].append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
