"""The engine's shared vocabulary, with no Ray: the compiled plan (stages, steps,
channels), errors, and a run's results and metrics.

May import: the pure core (ordering, barriers) only.
"""
