"""Kafka: :mod:`.source` (KafkaSource), :mod:`.sink` (KafkaSink), :mod:`.wire` (fetch and
produce over the wire protocol), :mod:`.partition_log` (a partition as a reader at an
isolation level sees it), :mod:`.transactions` (which records read_committed delivers),
:mod:`.offset_gaps` (holes waited for), :mod:`.codecs` (compression codecs), :mod:`.io`
(small kafka-python helpers)."""
