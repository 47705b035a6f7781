"""driftstream's public API.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink
"""

from driftstream.barriers.file_sink import FileSink

from .errors import FlowError, StepError
from .flow import Flow, KeyedStream, Stream
from .kafka_sink import KafkaSink
from .kafka_source import KafkaSource
from .result import Metrics, RunResult
from .source import Source, SourcePartition

__all__ = [
    "Flow",
    "Stream",
    "KeyedStream",
    "FlowError",
    "StepError",
    "RunResult",
    "Metrics",
    "Source",
    "SourcePartition",
    "KafkaSource",
    "KafkaSink",
    "FileSink",
]
