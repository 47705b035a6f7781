"""driftstream's public API.

>>> from driftstream.engine import Flow
>>> from driftstream.engine.testing import MemorySource, MemorySink

The engine is in rooms by role; imports run one way, top to bottom:

- ``cli/``: the ``driftstream`` command;
- ``api/``: Flow, Stream, KeyedStream, FlowHandle;
- ``control/``: coordinator, supervisor, snapshots and recovery on Ray;
- ``runtime/``: StageRuntime, the Ray actors, the transport, the simulator;
- ``connectors/``: sources and sinks (memory, files, Kafka, PostgreSQL, Iceberg), the local broker;
- ``model/``: the plan, errors, results, the source and sink interfaces;
- then the pure core: ``driftstream.ordering``, ``driftstream.barriers``, ``driftstream.snapshots``.
"""

from driftstream.ordering.entry_state import MapState

from driftstream.engine.api.flow import Flow, KeyedStream, Stream
from driftstream.engine.connectors.file_sink import FileSink
from driftstream.engine.connectors.row_changes import Delete, Insert, RowChange, Truncate, Update
from driftstream.engine.model.connectors import Sink, SinkPartition, Source, SourcePartition
from driftstream.engine.model.config import Guarantee, RunConfig
from driftstream.engine.model.data_plane import DataPlaneTLS
from driftstream.engine.model.errors import DataPlaneError, DeadLetter, FlowError, StepError
from driftstream.engine.model.result import Metrics, RunResult

__all__ = [
    "Flow",
    "Stream",
    "KeyedStream",
    "FlowHandle",
    "attach",
    "list_flows",
    "warm_up",
    "MapState",
    "FlowError",
    "StepError",
    "DataPlaneError",
    "DataPlaneTLS",
    "DeadLetter",
    "RunConfig",
    "Guarantee",
    "RunResult",
    "Metrics",
    "Source",
    "SourcePartition",
    "Sink",
    "SinkPartition",
    "KafkaSource",
    "KafkaSink",
    "KafkaSecurity",
    "PostgresSink",
    "PostgresSource",
    "RowChange",
    "Insert",
    "Update",
    "Delete",
    "Truncate",
    "IcebergSink",
    "SchemaRegistry",
    "FileSink",
    "FileSource",
]


#: Connectors imported when first named: every actor process imports this package, and
#: a flow's actors need only the client libraries of the connectors the flow uses (Kafka's
#: alone costs ~0.1 s of each actor's start).
_CONNECTORS = {
    "FileSource": "driftstream.engine.connectors.file_source",
    "KafkaSecurity": "driftstream.engine.connectors.kafka.security",
    "KafkaSink": "driftstream.engine.connectors.kafka.sink",
    "KafkaSource": "driftstream.engine.connectors.kafka.source",
    "IcebergSink": "driftstream.engine.connectors.iceberg_sink",
    "SchemaRegistry": "driftstream.engine.connectors.kafka.schema_registry",
    "PostgresSink": "driftstream.engine.connectors.postgres_sink",
    "PostgresSource": "driftstream.engine.connectors.postgres_source",
}


def __getattr__(name: str):
    # The handle imports Ray; ``import driftstream.engine`` does not: a flow is defined,
    # checked and planned without it.
    if name in ("FlowHandle", "attach", "list_flows"):
        from driftstream.engine.api import handle

        return getattr(handle, name)
    if name == "warm_up":
        from driftstream.engine.control.warm_actors import warm_up

        return warm_up
    if name in _CONNECTORS:
        import importlib

        return getattr(importlib.import_module(_CONNECTORS[name]), name)
    raise AttributeError(f"module 'driftstream.engine' has no attribute {name!r}")
