"""Where data comes from and goes to: every connector (in-memory sources and sinks, files,
Kafka with its wire protocol, PostgreSQL, Iceberg), the reader of one source instance, the
retrying write policy the sinks share, and the local Kafka-protocol broker. The interfaces
they implement are :mod:`driftstream.engine.model.connectors`.

May import: model, the pure core.
"""
