"""Running a flow on Ray: the coordinator actor, the supervisor (launching actors,
snapshots and their commits, failure detection, recovery), the snapshot stream from
the acker, the export of a run's figures as Ray metrics, and launching a run from the driver.

May import: runtime, connectors, model, the pure core (snapshots for the store).
"""
