"""What users build and hold: :class:`~.flow.Flow`, ``Stream``, ``KeyedStream`` (the
operators, checked at build time) and :class:`~.handle.FlowHandle` (a running flow).

May import: control, runtime (to run a flow), connectors, model, the pure core.
"""
