"""``verify="reexecute:N"`` in the simulator: what a caught silent corruption does to the run
(issue 58).

A :class:`~.reexecuted_step.SilentCorruption` raised by an instance's keyed step (a re-run that
disagreed, or a settled read that does not match what was written) rolls every instance back
(:meth:`SimulatedCorruptions.caught`) to the newest committed snapshot that holds the state
right: the snapshots at or past the record's ``before`` are set aside when the corrupt value
was read from settled state (taken after it went bad, they may hold it:
:func:`.reexecuted_step.set_aside_since`); a re-run's difference lies in a log, above every
committed snapshot. None left: the beginning. Exactly-once sinks drop what they hold, as after
a crash; what was caught before its batch's outputs left reaches no sink. The faults tests
inject are :mod:`.state_faults`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from driftstream.engine.model.manifest import Manifest
from driftstream.engine.runtime.reexecuted_step import set_aside_since

log = logging.getLogger(__name__)


class SimulatedCorruptions:
    """The corruptions ``sim`` (a :class:`~.simulator.Simulation`) caught (``records``, in order)
    and the rollback each caused (``restored``: the snapshot's id and time, None for the beginning)."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.records: list = []
        self.restored: list = []

    def caught(self, record: Any) -> None:
        """Every instance restarts from the newest committed snapshot below ``record.before``."""
        sim = self.sim
        self.records.append(record)
        manifest = self._target(record)
        log.warning("%s; rolling back to %s", record.line(), "the beginning" if manifest is None else f"snapshot {manifest.snapshot_id}")
        sim.stop_every_instance()
        self.restored.append(None if manifest is None else (manifest.snapshot_id, tuple(manifest.t)))
        sim._start_incarnation(manifest, recovering=True)

    def report(self) -> list:
        """Per corruption caught, what ``RunMetrics.corruptions`` lists."""
        return [{**dataclasses.asdict(record), "restored": None if r is None else r[0], "restored_t": None if r is None else r[1]}
                for record, r in zip(self.records, self.restored)]

    def _target(self, record: Any) -> Optional[Manifest]:
        store = self.sim.store
        set_aside_since(store, record.before, record.line())
        data = store.read_latest_manifest()
        return None if data is None else Manifest.from_json(data)
