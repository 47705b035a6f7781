"""The Ray runtime: one async actor per stage instance, one acker actor.

Actors are named ``<flow>/<stage>/<index>`` (the acker ``<flow>/acker``) in
namespace ``driftstream``. Ray places, starts and kills them; batches, acks
and watermarks travel on the data plane (:mod:`.transport`, TCP between the
actors). Every stage actor flushes its XOR acks to the acker; the acker pushes
watermarks to every stage actor. The driver waits for the
watermark to reach TOP (or for a failure), collects results and kills every
actor it started.

>>> # doctest: +SKIP
>>> result = run_on_ray(flow.plan(parallelism=2))
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
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
from .transport import Endpoint

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


def _node_ip() -> str:
    return ray.util.get_node_ip_address()


@ray.remote(num_cpus=0)
class AckerActor:
    """Wraps :class:`~driftstream.ordering.acker.Acker`: folds the stage actors' flushes,
    pushes watermarks (coalesced) and tells the driver when the run ends or fails.

    Flushes arrive on one TCP connection per stage actor, so each sender's flushes
    are folded in the order it sent them: a bound never overtakes its XORs.
    """

    def __init__(self, sources: int, token: bytes) -> None:
        self.acker = Acker(sources)
        self.endpoint = Endpoint(token, self._on_message)
        self.subscribers: dict = {}
        self.pushed = self.acker.watermark
        self.push_scheduled = False
        self.error: Optional[BaseException] = None
        self.done: Optional[asyncio.Event] = None
        self.updates = 0

    async def listen(self) -> tuple:
        self.done = asyncio.Event()
        return await self.endpoint.listen(_node_ip())

    async def connect(self, subscribers: dict, addresses: dict) -> None:
        """``subscribers``: every stage actor by key, with its data-plane address."""
        self.subscribers = subscribers
        for key in subscribers:
            await self.endpoint.connect(key, addresses[key])

    def _on_message(self, message: tuple) -> None:
        _, xors, source_index, bound = message
        self.acker.update(xors, source_index, bound)
        self.updates += 1
        if self.acker.watermark > self.pushed and not self.push_scheduled:
            self.push_scheduled = True
            asyncio.get_running_loop().call_soon(self._push)

    def _push(self) -> None:
        self.push_scheduled = False
        w = self.acker.watermark
        if w <= self.pushed:
            return
        self.pushed = w
        if w == TOP:
            # The last watermark goes by Ray call so that the driver can wait for every
            # stage to have released its output before it collects results.
            refs = [h.watermark.remote(w) for h in self.subscribers.values()]
            asyncio.get_running_loop().create_task(self._finish(refs))
            return
        for key in self.subscribers:
            self.endpoint.send(key, ("wm", w))

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

    async def wait(self) -> Optional[BaseException]:
        await self.done.wait()
        return self.error

    async def status(self) -> dict:
        return {"watermark": self.acker.watermark, "in_flight": self.acker.in_flight(), "updates": self.updates}

    async def close(self) -> None:
        await self.endpoint.close()


@ray.remote(num_cpus=0)
class StageActor:
    """One stage instance around a pure :class:`StageRuntime`."""

    def __init__(self, plan: Plan, stage_index: int, instance: int, options: dict, token: bytes) -> None:
        self.key = (stage_index, instance)
        self.plan = plan
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
        self.last_bound = None
        self.inbox: list = []
        self.drain_scheduled = False
        self.failed = False
        self.acker = None
        self.endpoint = Endpoint(token, self._on_message)
        self.credit: Optional[asyncio.Event] = None

    async def listen(self) -> tuple:
        self.credit = asyncio.Event()
        return await self.endpoint.listen(_node_ip())

    async def connect(self, acker, addresses: dict) -> None:
        """Open data-plane connections to the acker and to every instance of a downstream stage."""
        self.acker = acker
        await self.endpoint.connect("acker", addresses["acker"])
        stage = self.plan.stages[self.key[0]]
        downstream = {ch.dst_stage for sid in stage.step_ids for ch in self.plan.channels[sid]}
        for key in addresses:
            if key != "acker" and key[0] in downstream:
                await self.endpoint.connect(key, addresses[key])

    async def start(self) -> None:
        if self.reader is not None:
            asyncio.get_running_loop().create_task(self._source_loop())

    def _on_message(self, message: tuple) -> None:
        if message[0] == "push":
            # Batches queued behind each other are processed together (see StageRuntime.receive_many).
            self.inbox.append(message[1])
            if not self.drain_scheduled:
                self.drain_scheduled = True
                asyncio.get_running_loop().call_soon(self._drain)
        else:
            self._apply_watermark(message[1])

    def _drain(self) -> None:
        self.drain_scheduled = False
        batches, self.inbox = self.inbox, []
        if self._guarded(self.rt.receive_many, batches):
            self._flush()

    async def watermark(self, w: tuple) -> None:
        self._apply_watermark(w)

    def _apply_watermark(self, w: tuple) -> None:
        if self._guarded(self.rt.on_watermark, w) and self.reader is not None:
            self.reader.on_watermark(w)
            self.credit.set()

    async def report(self) -> dict:
        self.rt.close()
        await self.endpoint.close()
        metrics = self.rt.metrics()
        if self.reader is not None:
            metrics["dead_letters"] = self.reader.dead_letters
            self.reader.close()
        return {
            "collected": self.rt.collected(),
            "metrics": metrics,
            "emit_times": self.rt.emit_times,
            "release_times": self.rt.release_times,
        }

    async def ping(self) -> bool:
        return True

    def _guarded(self, fn, *args) -> bool:
        """Run ``fn(*args)`` unless the run has failed; a StepError fails the run. True if it ran."""
        if self.failed:
            return False
        try:
            fn(*args)
            return True
        except StepError as exc:
            self.failed = True
            self.acker.fail.remote(exc)
            return False

    def _flush(self) -> None:
        send = self.endpoint.send
        for stage, inst, batch in self.rt.take_batches():
            if self.chaos:
                asyncio.get_running_loop().call_later(self.rng.uniform(0, self.chaos), send, (stage, inst), ("push", batch))
            else:
                send((stage, inst), ("push", batch))
        acks = self.rt.take_acks()
        bound = None
        if self.reader is not None:
            bound = self.reader.bound()
            if bound == self.last_bound:
                bound = None
            else:
                self.last_bound = bound
        if acks or bound is not None:
            send("acker", ("ack", acks, self.source_index, bound))

    async def _source_loop(self) -> None:
        reader = self.reader
        while not reader.done and not self.failed:
            if not reader.has_credit():
                self.credit.clear()
                await self.credit.wait()
                continue
            items = reader.poll(self.batch_size)
            if items and not self._guarded(self.rt.process_source, items):
                return
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
        token = secrets.token_bytes(32)
        acker = AckerActor.options(name=f"{plan.flow_name}/acker", namespace=NAMESPACE, **spread).remote(len(plan.source_instances), token)
        handles.append(acker)
        actors: dict = {}
        for s in plan.stages:
            for i in range(s.parallelism):
                opts = dict(options, seed=None if seed is None else seed * 1000 + len(actors))
                actors[(s.index, i)] = StageActor.options(name=s.actor_names[i], namespace=NAMESPACE, **spread).remote(
                    plan, s.index, i, opts, token
                )
                handles.append(actors[(s.index, i)])
        keys = list(actors)
        addresses = dict(zip(keys + ["acker"], ray.get([actors[k].listen.remote() for k in keys] + [acker.listen.remote()])))
        ray.get([a.connect.remote(acker, addresses) for a in actors.values()] + [acker.connect.remote(actors, addresses)])
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
