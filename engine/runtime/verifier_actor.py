"""The flow's verifier under ``verify="reexecute:N"`` (``reexecute_on="verifier"``, issue 58):
a process of its own that re-runs the batches its instances ship
(:class:`~driftstream.ordering.shipped_reexecution.Shipment`) with the plan's step functions,
from fresh states, compares them with the live outputs and post-state shipped along, and
answers with the differences (:mod:`.verifier_link` takes them). A bad core's error repeats when the check runs on it: Orthrus
validates on other cores, here on another process (another node's when the cluster has one).

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySink, MemorySource
>>> from driftstream.ordering.keyed_state import DriftingKeyedState
>>> from driftstream.ordering.meta import Meta
>>> from driftstream.ordering.shipped_reexecution import ship
>>> def add(s, x): return (s or 0) + x, (s or 0) + x
>>> f = Flow("verifier"); f.source(MemorySource([1])).key_by(str).stateful_map(add).sink(MemorySink("o"))
>>> plan = f.plan(1); sid = [s.id for s in plan.steps if s.kind.name == "stateful_map"][0]
>>> live, batch = DriftingKeyedState(add), [(Meta(1, 0, 0, 1), 5, "k")]
>>> shipment = ship(live, sid, batch); out = live.apply_items(batch); shipment.add_settled(live); shipment.add_live(live, out)
>>> Verifier(plan).rerun(shipment).found
[]

Costs: per batch shipped, its unpickling and its re-run (see shipped_reexecution.py); the
instances it serves pay the shipping. One call at a time: a verifier that falls behind makes
its instances drop samples past their bound, never wait.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Optional

import ray

from driftstream.ordering.shipped_reexecution import Shipment, Verdict, rerun

from driftstream.engine.model.plan import Plan
from driftstream.engine.runtime.operator_registry import keyed_state


class Verifier:
    """Re-runs shipped batches of ``plan``'s keyed steps (None: a warm one, given its plan by
    :meth:`use`)."""

    def __init__(self, plan: Optional[Plan] = None) -> None:
        self.plan = plan
        self.reruns = 0
        self.busy_s = 0.0

    def use(self, plan: Plan) -> None:
        """Serve ``plan`` (a new flow's, or a rescale's: its steps, the same functions)."""
        self.plan = plan

    def rerun(self, shipment: Shipment) -> Verdict:
        """Re-run ``shipment`` as its step of the plan; its digests."""
        t0 = time.process_time()
        verdict = rerun(shipment, functools.partial(keyed_state, self.plan.steps[shipment.step]))
        self.reruns += 1
        self.busy_s += time.process_time() - t0
        return verdict

    def stats(self) -> dict:
        """Batches re-run, and the CPU seconds they took, since this process started."""
        return {"reruns": self.reruns, "cpu_s": round(self.busy_s, 3)}

    def ping(self) -> bool:
        return True


#: Ray restarts it when its process dies (the calls then in flight fail: their instances count
#: them lost and go on); a call is not retried (the instance's deadline covers a slow restart).
VerifierActor: Any = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(Verifier)

__all__ = ["Verifier", "VerifierActor"]
