"""Where data comes from and goes to: the source interface and the reader of one source
instance, in-memory sources and sinks, Kafka (source, sink, the wire protocol), and the
local Kafka-protocol broker.

May import: model, the pure core.
"""
