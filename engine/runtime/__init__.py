"""How one stage instance runs: :class:`~.stage.StageRuntime` (pure: the fused steps,
keyed state, barriers), its snapshots, the data-plane transport, the Ray actors that
host them, the Ray session, and the single-process simulator.

May import: connectors, model, the pure core.
"""
