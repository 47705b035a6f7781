"""Incremental inverted-index maintenance over Wikipedia articles: the benchmark workload.

Modules:
- ``documents``: the input record, tokenization and the change records both engines emit.
- ``corpus``: the PySpark job that prepares the corpus as Parquet (and bulk-publishes it).
- ``feeder``: publishes the Parquet at a given docs/s with Poisson arrivals.
- ``ground_truth``: the PySpark batch job computing the final index.
- ``pipeline``: the driftstream pipeline.
- ``spark_baseline``: the same workload on Spark Structured Streaming.
"""
