"""Kafka's compression codecs: their names, their ids in a record batch, and the package
each needs.

A batch says its codec in its attributes (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd);
kafka-python compresses and decompresses with the libraries its ``kafka/codec.py``
imports (gzip from the standard library, ``python-snappy``, ``lz4``, ``zstandard``:
dependencies of driftstream). A library that is missing anyway is an error that names
the topic, the codec and the package to install, raised where the codec is first needed:
when a :class:`.KafkaSink` is built, or when a source meets a batch compressed with it.

>>> compression_type("zstd"), compression_type(None)
(4, 0)
>>> compression_type("brotli")
Traceback (most recent call last):
...
driftstream.engine.model.errors.FlowError: unknown Kafka compression 'brotli': choose one of None, 'gzip', 'snappy', 'lz4', 'zstd'
"""

from __future__ import annotations

from typing import Optional

import kafka.codec as kafka_codec
import kafka.errors as kafka_errors

from driftstream.engine.model.errors import FlowError

#: codec name -> (id in a batch's attributes, kafka-python's check that its library loads, package to install)
CODECS = {
    "gzip": (1, kafka_codec.has_gzip, None),
    "snappy": (2, kafka_codec.has_snappy, "python-snappy"),
    "lz4": (3, kafka_codec.has_lz4, "lz4"),
    "zstd": (4, kafka_codec.has_zstd, "zstandard"),
}

_NAMES = {codec_id: name for name, (codec_id, _, _) in CODECS.items()}
#: the ids a record batch may say (0: none)
KNOWN_CODEC_IDS = frozenset([0, *_NAMES])


class MissingCodec(kafka_errors.UnsupportedCodecError):
    """A batch is (or is to be) compressed with a codec whose library is not installed."""


def codec_name(codec_id: int) -> str:
    """``'lz4'`` for 3, ``'none'`` for 0."""
    return "none" if codec_id == 0 else _NAMES.get(codec_id, f"unknown codec {codec_id}")


def missing_codec(codec_id: int, where: str) -> Optional[MissingCodec]:
    """The error to raise for a batch of ``where`` compressed with ``codec_id`` if its
    library cannot be loaded, else None."""
    name = codec_name(codec_id)
    if name not in CODECS:
        return None  # none, or an id Kafka does not have: corrupt bytes, for the caller to say
    _, available, package = CODECS[name]
    if available():
        return None
    return MissingCodec(f"{where}: record batches compressed with {name}, and the library for {name} is not installed: "
                        f"pip install {package} (a dependency of driftstream: reinstall it)")


def compression_type(name: Optional[str], topic: str = "") -> int:
    """The batch codec id for ``name`` (None: no compression). FlowError if Kafka has no such
    codec or its library is not installed."""
    if name is None or name == "none":
        return 0
    if name not in CODECS:
        choices = ", ".join(["None"] + [repr(n) for n in CODECS])
        raise FlowError(f"unknown Kafka compression {name!r}: choose one of {choices}")
    error = missing_codec(CODECS[name][0], f"KafkaSink({topic!r}, compression={name!r})")
    if error is not None:
        raise FlowError(str(error))
    return CODECS[name][0]
