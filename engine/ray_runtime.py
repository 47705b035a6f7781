"""The Ray runtime: one async actor per stage instance, one acker actor.

Actors are named ``<flow>/<stage>/<index>`` (the acker ``<flow>/acker``) in
namespace ``driftstream``. Data moves as batches between stage actors; every
stage actor flushes its XOR acks to the acker in per-sender sequence; the
acker pushes watermarks to every stage actor. The driver waits for the
watermark to reach TOP (or for a failure), collects results and kills every
actor it started.

>>> # doctest: +SKIP
>>> result = run_on_ray(flow.plan(parallelism=2))
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any, Optional

import ray

from driftstream.ordering.acker import Acker
from driftstream.ordering.meta import TOP

from .errors import StepError
from .plan import Plan
from .result import RunResult, merge_instances
from .source import SourceReader
from .stage import StageRuntime

NAMESPACE = "driftstream"

#: Lean Ray settings for small machines (no task events, no metrics, no usage stats).
LEAN_RAY_ENV = {
    "RAY_task_events_report_interval_ms": "0",
    "RAY_enable_metrics_collection": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def ensure_ray(address: Optional[str] = None) -> bool:
    """Connect to Ray unless already connected; True if this call started the connection."""
    if ray.is_initialized():
        return False
    for k, v in LEAN_RAY_ENV.items():
        os.environ.setdefault(k, v)
    kwargs: dict = {"namespace": NAMESPACE, "log_to_driver": True, "configure_logging": False}
    if address is None:
        kwargs["include_dashboard"] = False
    ray.init(address=address, **kwargs)
    return True


@ray.remote(num_cpus=0)
class AckerActor:
    """Wraps :class:`~driftstream.ordering.acker.Acker`: orders each sender's flushes,
    pushes watermarks (coalesced), and tells the driver when the run ends or fails."""

    def __init__(self, sources: int) -> None:
        self.acker = Acker(sources)
        self.next_seq: dict = {}
        self.held: dict = {}
        self.subscribers: list = []
        self.pushed = self.acker.watermark
        self.push_scheduled = False
        self.error: Optional[BaseException] = None
        self.done: Optional[asyncio.Event] = None
        self.advanced: Optional[asyncio.Event] = None
        self.updates = 0

    async def connect(self, subscribers: list) -> None:
        """``subscribers``: the stage actors that hold keyed state or barriers (they get every watermark)."""
        self.subscribers = subscribers
        self.done = asyncio.Event()
        self.advanced = asyncio.Event()

    async def watermark_after(self, w: tuple) -> tuple:
        """Return the watermark once it is above ``w``: how a source out of credit waits.

        Sources pull instead of being pushed every watermark: fewer wake-ups of
        processes on the latency path.
        """
        while self.acker.watermark <= w and self.error is None:
            await self.advanced.wait()
        return self.acker.watermark

    async def ack(self, sender: Any, seq: int, xors: dict, source_index: Optional[int], bound: Optional[tuple]) -> None:
        # Ray does not promise order for async actors; a bound must never overtake its XORs.
        held = self.held.setdefault(sender, {})
        held[seq] = (xors, source_index, bound)
        expected = self.next_seq.get(sender, 0)
        while expected in held:
            xors, source_index, bound = held.pop(expected)
            self.acker.update(xors, source_index, bound)
            self.updates += 1
            expected += 1
        self.next_seq[sender] = expected
        if self.acker.watermark > self.pushed and not self.push_scheduled:
            self.push_scheduled = True
            asyncio.get_running_loop().call_soon(self._push)
            self.advanced.set()
            self.advanced = asyncio.Event()

    def _push(self) -> None:
        self.push_scheduled = False
        w = self.acker.watermark
        if w <= self.pushed:
            return
        self.pushed = w
        refs = [s.watermark.remote(w) for s in self.subscribers]
        if w == TOP:
            asyncio.get_running_loop().create_task(self._finish(refs))

    async def _finish(self, refs: list) -> None:
        try:
            await asyncio.gather(*refs)
        except Exception as exc:  # a stage failed while releasing its last output
            self.error = self.error or exc
        self.done.set()

    async def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.done.set()
        self.advanced.set()

    async def wait(self) -> Optional[BaseException]:
        await self.done.wait()
        return self.error

    async def status(self) -> dict:
        return {"watermark": self.acker.watermark, "in_flight": self.acker.in_flight(), "updates": self.updates}


@ray.remote(num_cpus=0)
class StageActor:
    """One stage instance around a pure :class:`StageRuntime`."""

    def __init__(self, plan: Plan, stage_index: int, instance: int, options: dict) -> None:
        self.key = (stage_index, instance)
        self.rt = StageRuntime(plan, stage_index, instance, sample_every=options.get("sample_every", 1))
        stage = plan.stages[stage_index]
        self.reader: Optional[SourceReader] = None
        self.source_index: Optional[int] = None
        if stage.source_id >= 0:
            step = plan.steps[stage.source_id]
            self.reader = SourceReader(
                step.source, step.id, instance, stage.parallelism, options.get("max_inflight", 2_000), options.get("batch_size", 256)
            )
            self.source_index = plan.source_instances.index(self.key)
        self.batch_size = options.get("batch_size", 256)
        self.chaos = options.get("chaos")
        self.rng = random.Random(options.get("seed"))
        self.seq = 0
        self.last_bound = None
        self.inbox: list = []
        self.drain_scheduled = False
        self.failed = False
        self.acker = None
        self.peers: dict = {}

    async def connect(self, acker, peers: dict) -> None:
        self.acker, self.peers = acker, peers

    async def start(self) -> None:
        if self.reader is not None:
            asyncio.get_running_loop().create_task(self._source_loop())

    async def push(self, batch) -> None:
        # Batches queued behind each other are processed together (see StageRuntime.receive_many).
        self.inbox.append(batch)
        if not self.drain_scheduled:
            self.drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        self.drain_scheduled = False
        batches, self.inbox = self.inbox, []
        if self.failed:
            return
        try:
            self.rt.receive_many(batches)
        except StepError as exc:
            return self._fail(exc)
        self._flush()

    async def watermark(self, w: tuple) -> None:
        self._apply_watermark(w)

    def _apply_watermark(self, w: tuple) -> None:
        if self.failed:
            return
        try:
            self.rt.on_watermark(w)
        except StepError as exc:
            return self._fail(exc)
        if self.reader is not None:
            self.reader.on_watermark(w)

    async def report(self) -> dict:
        self.rt.close()
        return {
            "collected": self.rt.collected(),
            "metrics": self.rt.metrics(),
            "emit_times": self.rt.emit_times,
            "release_times": self.rt.release_times,
        }

    async def ping(self) -> bool:
        return True

    def _fail(self, exc: StepError) -> None:
        self.failed = True
        self.acker.fail.remote(exc)

    def _flush(self) -> None:
        for stage, inst, batch in self.rt.take_batches():
            peer = self.peers[(stage, inst)]
            if self.chaos:
                asyncio.get_running_loop().call_later(self.rng.uniform(0, self.chaos), peer.push.remote, batch)
            else:
                peer.push.remote(batch)
        acks = self.rt.take_acks()
        bound = None
        if self.reader is not None:
            bound = self.reader.bound()
            if bound == self.last_bound:
                bound = None
            else:
                self.last_bound = bound
        if acks or bound is not None:
            self.acker.ack.remote(self.key, self.seq, acks, self.source_index, bound)
            self.seq += 1

    async def _source_loop(self) -> None:
        reader = self.reader
        while not reader.done and not self.failed:
            if not reader.has_credit():
                self._apply_watermark(await self.acker.watermark_after.remote(self.rt.watermark))
                continue
            items = reader.poll(self.batch_size)
            if items:
                try:
                    self.rt.process_source(items)
                except StepError as exc:
                    return self._fail(exc)
            self._flush()
            if items:
                await asyncio.sleep(0)
            else:
                wait = reader.next_ready_in()
                await asyncio.sleep(min(wait if wait is not None else 0.001, 0.01))
        if not self.failed:
            self._flush()


def run_on_ray(
    plan: Plan,
    address: Optional[str] = None,
    seed: Optional[int] = None,
    batch_size: int = 256,
    max_inflight: int = 2_000,
    chaos: Optional[float] = None,
    sample_every: int = 1,
    timeout: Optional[float] = None,
) -> RunResult:
    """Run ``plan`` on Ray to the end; see :meth:`driftstream.engine.Flow.run`."""
    started_ray = ensure_ray(address)
    handles: list = []
    try:
        _check_no_leftovers(plan.flow_name)
        options = {"batch_size": batch_size, "max_inflight": max_inflight, "chaos": chaos, "sample_every": sample_every}
        spread = {"scheduling_strategy": "SPREAD"}
        acker = AckerActor.options(name=f"{plan.flow_name}/acker", namespace=NAMESPACE, **spread).remote(len(plan.source_instances))
        handles.append(acker)
        actors: dict = {}
        for s in plan.stages:
            for i in range(s.parallelism):
                opts = dict(options, seed=None if seed is None else seed * 1000 + len(actors))
                actors[(s.index, i)] = StageActor.options(name=s.actor_names[i], namespace=NAMESPACE, **spread).remote(plan, s.index, i, opts)
                handles.append(actors[(s.index, i)])
        subscribers = [actors[key] for key in actors if _needs_watermarks(plan, key[0])]
        ray.get([a.connect.remote(acker, actors) for a in actors.values()] + [acker.connect.remote(subscribers)])
        t0 = time.time()
        ray.get([a.start.remote() for a in actors.values()])
        error = _wait(acker, list(actors.values()), timeout)
        wall = time.time() - t0
        if error is not None:
            raise error
        reports = ray.get([a.report.remote() for a in actors.values()])
        sinks = [s.name for s in plan.steps if s.kind == "sink"]
        return merge_instances(reports, wall, sinks)
    finally:
        _kill(plan.flow_name, handles)
        if started_ray:
            ray.shutdown()


def _needs_watermarks(plan: Plan, stage_index: int) -> bool:
    kinds = {plan.steps[sid].kind for sid in plan.stages[stage_index].step_ids}
    return bool(kinds & {"stateful_map", "stateful_flat_map", "sink"})


def _wait(acker, actors: list, timeout: Optional[float]) -> Optional[BaseException]:
    """Wait for the end of the run; notice dead actors (they cannot report a failure)."""
    done_ref = acker.wait.remote()
    deadline = None if timeout is None else time.time() + timeout
    while True:
        ready, _ = ray.wait([done_ref], timeout=1.0)
        if ready:
            return ray.get(done_ref)
        try:
            ray.get([a.ping.remote() for a in actors] + [acker.status.remote()], timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            return RuntimeError(f"a driftstream actor died or hung: {exc}")
        if deadline is not None and time.time() > deadline:
            return TimeoutError(f"run did not finish within {timeout}s")


def _check_no_leftovers(flow_name: str) -> None:
    prefix = f"{flow_name}/"
    if any(a["name"].startswith(prefix) for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE):
        raise RuntimeError(
            f"actors of a flow named {flow_name!r} are already running in namespace {NAMESPACE!r}: "
            "wait for that run to end or give this flow another name"
        )


def _kill(flow_name: str, handles: list) -> None:
    for h in handles:
        try:
            ray.kill(h, no_restart=True)
        except Exception:
            pass
    prefix = f"{flow_name}/"
    deadline = time.time() + 10
    while time.time() < deadline:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]
        if not any(n.startswith(prefix) for n in names):
            return
        time.sleep(0.05)
