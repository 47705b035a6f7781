"""The engine's shared vocabulary, with no Ray: the compiled plan (stages, steps,
channels), errors, the run configuration, manifests and the
recovery rules, and a run's results and metrics.

May import: the pure core (ordering, barriers, snapshots' pure modules) only.
"""
