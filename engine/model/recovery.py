"""How a run starts, and starts again after a failure, from its newest manifest: what
each stage instance is given, which replayed output it drops, and where an
at-most-once replay stops. Pure decisions: the supervisor on Ray and the simulator
take them here, so the simulator's seeded failures test the same rules.

>>> from driftstream.engine.model.config import RunConfig
>>> rules = RecoveryRules(RunConfig(guarantee="exactly-once", seed=2), snapshot_dir="/tmp/s")
>>> c = rules.instance_config(Instance(1, 0), ordinal=3, manifest=None, recovering=True)
>>> c.seed, c.skip_released, c.restore
(2003, True, SnapshotPart(states={}, sources={}, error=None, counts=None))
>>> replay_limit([None, (4, 0, 0, 4), (2, 0, 1, 2)])
(4, 0, 0, 4)
>>> drained((5,), [None, (4, 0, 0, 4)]), drained((4, 0, 0, 4), [(4, 0, 0, 4)])
(True, False)
"""

from __future__ import annotations

from typing import Iterable, Optional

from driftstream.ordering.meta import BOTTOM

from driftstream.engine.model.config import Guarantee, InstanceConfig, RunConfig, reexecute_every
from driftstream.engine.model.manifest import Manifest, SnapshotPart
from driftstream.engine.model.plan import Instance


class RecoveryRules:
    """The decisions of one run's (re)starts, from its :class:`RunConfig`."""

    def __init__(self, config: RunConfig, snapshot_dir: Optional[str], defaults: Optional[dict] = None) -> None:
        """``defaults``: instance settings the runtime chooses when the run does not
        (``batch_size``, ``max_inflight``)."""
        self.config = config
        self.snapshot_dir = snapshot_dir
        given = {"batch_size": config.batch_size, "max_inflight": config.max_inflight}
        self.settings = {**(defaults or {}), **{k: v for k, v in given.items() if v is not None}}

    @property
    def drops_released(self) -> bool:
        """Whether a restarted barrier drops replayed output its sink already holds: under
        exactly-once (it is there once) and at-most-once (it must not come twice);
        at-least-once sends it again."""
        return self.config.guarantee in (Guarantee.EXACTLY_ONCE, Guarantee.AT_MOST_ONCE)

    @property
    def skips_backlog(self) -> bool:
        """At-most-once: a restart replays only what released output depends on (see :func:`replay_limit`)."""
        return self.config.guarantee is Guarantee.AT_MOST_ONCE

    def instance_config(self, instance: Instance, ordinal: int, manifest: Optional[Manifest], recovering: bool) -> InstanceConfig:
        """What ``instance`` (the ``ordinal``-th of the plan) starts with: its part of
        ``manifest`` (None: from the beginning), and after a failure (``recovering``, or a
        resumed run) whether it drops what its sinks hold."""
        c = self.config
        return InstanceConfig(
            **self.settings,
            chaos=c.chaos,
            sample_every=c.sample_every,
            snapshot_dir=self.snapshot_dir,
            state_cache_bytes=c.state_cache_bytes,
            source_alignment=c.source_alignment,
            input_merge=c.input_merge,
            seed=None if c.seed is None else c.seed * 1000 + ordinal,
            skip_released=recovering and self.drops_released,
            restore=SnapshotPart() if manifest is None else manifest.part(instance),
            restore_t=None if manifest is None else tuple(manifest.t),
            recovering=recovering,
            reexecute=reexecute_every(c.verify),
        )


def replay_limit(t_lasts: Iterable[Optional[tuple]]) -> tuple:
    """At-most-once: the time up to which a restart replays, the latest ``t_last`` over the
    instances (None: one whose sinks hold nothing). State then agrees with that output;
    the backlog past it is skipped."""
    known = [t for t in t_lasts if t is not None]
    return max(known) if known else BOTTOM


def drained(watermark: tuple, horizons: Iterable[Optional[tuple]]) -> bool:
    """Whether a snapshot at ``watermark``, taken with the sources stopped and the watermark
    settled, leaves the sinks holding exactly the output below it: none of them holds output
    at or past it from before the last recovery (``horizons``: each barrier's ``t_last``, what
    its sink held when it was restored; None: nothing). Only such a snapshot restores at
    another parallelism, where the replayed elements are routed to other sink partitions
    than those that hold them."""
    return all(h is None or h < watermark for h in horizons)
