"""Running a flow on Ray: the coordinator actor and its supervisor's watch loop, which wires
the launcher (starting a plan's actors), the snapshot committer (snapshots and their
commits, with their log), failover (failure detection, recovery) with the standbys, and
live status; the snapshot stream from the acker, the export of a run's figures as Ray
metrics, and launching a run from the driver.

May import: runtime, connectors, model, the pure core (snapshots for the store).
"""
