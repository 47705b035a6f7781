"""Why a failure in a simulated run under ``recovery="local"`` is not recovered locally, as Ray
decides it (the supervisor: :mod:`driftstream.engine.control.local_failover`,
:mod:`~driftstream.engine.control.replica_failover`; the acker: ``local_refusal``,
``replica_refusal``): the run then rolls back globally, every instance and every replica
restored from the newest manifest, and says why (``Simulation.fallback_reasons``).

- Any failure while a local recovery is under way (its replacement catching up, or the
  instances still told frontiers of their own): the replacement's log is whole only once it
  caught up, and a cut must be at or past every frontier told.
- A crash (``crashes=``) while the instances restore; with replicas, while a replacement
  replica catches up or a failover's re-sends are not all in (its cut would be wrong).
- A crash of an instance with replicas: it kills every replica of it (its last live one is
  gone). A single replica's death is ``replica_crashes=`` (a failover, no restore).

>>> from driftstream.engine.model.plan import Instance
>>> victim_refusal(Instance(1, 0), replicated={Instance(1, 0): [4, 5]})
'1/0 lost its last live replica'
>>> victim_refusal(Instance(0, 0), replicated={Instance(1, 0): [4, 5]}) is None
True
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from driftstream.engine.model.plan import Instance


def recovery_refusal(local: Any, acker: Any) -> Optional[str]:
    """Why no failure can be recovered locally now because a local recovery is under way
    (``local``: the run's :class:`~.local_recovery.LocalRecovery`, ``acker``: its
    :class:`~.acker_host.AckerHost`); None: none is."""
    if local.catching_up:
        return "a replacement was still catching up"  # its log is whole only once it has
    if acker.frontiers is not None:
        return "the instances were still told frontiers of their own"  # a cut must be at or past every frontier told
    return None


def crash_refusal(local: Any, acker: Any, replicas: Any, restoring: bool) -> Optional[str]:
    """Why a crash (``crashes=``) now cannot be recovered locally, whichever instance it
    strikes (``replicas``: the run's :class:`~.simulated_replicas.SimulatedReplicas` or None;
    ``restoring``: a global rollback's instances are still restoring); None: it can."""
    if restoring:
        return "the instances were still restoring"
    why = recovery_refusal(local, acker)
    if why is None and replicas is not None:
        if replicas.replacements.catching_up:
            why = "a replacement replica was still catching up"
        elif acker.table.holds:
            why = "a failover was still under way"  # its re-sends not all in: the cut would be wrong
    return why


def victim_refusal(victim: Instance, replicated: Mapping) -> Optional[str]:
    """Why a crash of ``victim`` cannot be recovered locally (``replicated``: the instances with
    live replicas, e.g. ``SimulatedReplicas.sets``): it kills every replica of an instance that
    has them. None: it has none (a source instance, or a stage ``replicas={...}`` does not name)."""
    if victim in replicated:
        return f"{victim.label} lost its last live replica"
    return None
