"""Kafka: :mod:`.source` (KafkaSource), :mod:`.sink` (KafkaSink), :mod:`.wire` (fetch and
produce over the wire protocol), :mod:`.io` (small kafka-python helpers)."""
