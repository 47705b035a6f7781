"""A safe, deterministic binary encoding for operator state and keys.

Snapshots are read back from files that outlive the process that wrote them (and
may come from a shared store), so they are never unpickled: decoding builds only
plain data — None, bool, int, float, str, bytes, list, tuple, dict, set and
frozenset, nested in any way — and never runs code or imports anything.

>>> data = encode({"a": [1, 2, 3], (1, "x"): {2, 3}, 10**30: b"\\x00"})
>>> decode(data)
{'a': [1, 2, 3], (1, 'x'): {2, 3}, 1000000000000000000000000000000: b'\\x00'}
>>> decode(encode((float("inf"), frozenset({3, 1}), True, -0.0)))
(inf, frozenset({1, 3}), True, -0.0)

Format: one version byte, then MessagePack (the ``msgpack`` C extension, which
Ray already depends on). None, bool, int64, float (always 64-bit, so inf, nan and
-0.0 survive), str (UTF-8, lone surrogates allowed), bytes, list and dict are
MessagePack's own types; tuples, sets, frozensets and ints beyond 64 bits are
extension types (:data:`_TUPLE` ...) whose payload is again this encoding.
Decoding unpacks with MessagePack's size limits bound to the input's length, so
a forged count cannot make it allocate more than the input holds.

Determinism: the same value gives the same bytes in every process. Set elements
are written sorted by their encoding (a set's iteration order depends on the
per-process str hash). Dicts are written in insertion order, because that order
is observable: a user function that iterates its state must see the same order
after a restore as in an uninterrupted run, so two equal dicts built in different
orders encode differently. Types are exact: subclasses such as namedtuples,
IntEnum or defaultdict are refused (TypeError) rather than silently decoded as
their base class; the one exception is binary data: ``bytearray`` and
``memoryview`` are written as bytes (MessagePack has one binary type) and come
back as ``bytes``. Nesting deeper than 512 levels raises ValueError.

Costs: encode and decode are O(size of the value) in C, except for one Python
call per tuple, set, frozenset or big int (a set also sorts its element
encodings). A dict of 1,000 int -> list-of-10-ints entries round-trips in about
0.2 ms on 2 cores (the pure-Python codec this replaced took 3 ms), which matters
because a snapshot encodes every state that changed since the last one.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

import msgpack

from driftstream.ordering.accelerators import accelerator

__all__ = ["encode", "encode_many", "decode", "encode_key", "encode_keys", "DecodeError", "SUPPORTED_TYPES"]

#: The types ``encode`` accepts (exactly these types, not subclasses).
SUPPORTED_TYPES = (type(None), bool, int, float, str, bytes, list, tuple, dict, set, frozenset)

_VERSION = 2  # 1 was a pure-Python tagged format
_HEADER = bytes([_VERSION])

# MessagePack extension type codes (0..127 are the application's).
_TUPLE, _SET, _FROZENSET, _BIGINT = 1, 2, 3, 4


class DecodeError(ValueError):
    """The bytes are not a value written by ``encode`` (truncated, corrupt, or another format)."""


def _unsupported(value: Any) -> TypeError:
    names = ", ".join("None" if t is type(None) else t.__name__ for t in SUPPORTED_TYPES)
    return TypeError(
        f"cannot encode a value of type {type(value).__qualname__}: supported types are {names} (exact types, not subclasses)"
    )


def _extension(v: Any) -> msgpack.ExtType:
    """MessagePack's ``default``: called (strict types) for everything it has no exact type for."""
    t = type(v)
    if t is tuple:
        return msgpack.ExtType(_TUPLE, _pack(list(v)))
    if t is set or t is frozenset:
        parts = sorted(_pack(x) for x in v)
        return msgpack.ExtType(_SET if t is set else _FROZENSET, _array_header(len(parts)) + b"".join(parts))
    if t is int:  # beyond 64 bits
        return msgpack.ExtType(_BIGINT, v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True))
    raise _unsupported(v)


_local = threading.local()  # Packers are not thread-safe; snapshots encode in a background thread


def _new_packer() -> msgpack.Packer:
    return msgpack.Packer(
        default=_extension, use_bin_type=True, strict_types=True, use_single_float=False,
        unicode_errors="surrogatepass", datetime=False, autoreset=True,
    )


def _pack(value: Any) -> bytes:
    # _extension re-enters for nested tuples and sets, and a Packer is not re-entrant
    # while it packs: each nesting depth has a Packer of its own (making one per
    # tuple cost more than packing it).
    packers = getattr(_local, "packers", None)
    if packers is None:
        packers = _local.packers = []
        _local.depth = 0
    depth = _local.depth
    if depth == len(packers):
        packers.append(_new_packer())
    _local.depth = depth + 1
    try:
        return packers[depth].pack(value)
    finally:
        _local.depth = depth


def _array_header(n: int) -> bytes:
    return msgpack.Packer().pack_array_header(n)


def encode(value: Any) -> bytes:
    """Encode ``value`` to bytes; raise TypeError on a type the codec does not support.

    >>> encode([1, "a"]) == encode([1, "a"])
    True
    >>> encode(object())
    Traceback (most recent call last):
    ...
    TypeError: cannot encode a value of type object: supported types are None, bool, int, float, str, ...
    """
    return _HEADER + _pack(value)


def encode_key(key: Any) -> bytes:
    """Encode a dict key so that keys equal under ``==`` give equal bytes.

    A dict treats ``1``, ``1.0`` and ``True`` (and ``0.0`` and ``-0.0``) as one key,
    and ``stable_hash`` routes them to one instance; a store keyed by bytes must
    too, so bools and integral floats are written as ints, also inside tuples and
    frozensets. Decoding gives the canonical key back (``1`` for ``1.0``), which
    is equal to the original. Unhashable keys raise TypeError, as in a dict.

    >>> encode_key(1.0) == encode_key(True) == encode_key(1)
    True
    >>> decode(encode_key(("a", 2.0, False)))
    ('a', 2, 0)
    """
    t = type(key)
    if t is str or t is int:  # the common keys: nothing to canonicalise
        return encode(key)
    if t is tuple:  # e.g. (key, entry) of entry state: one per entry read, base row and delta row
        for x in key:
            tx = type(x)
            if tx is not str and tx is not int:
                return encode(_canonical_key(key))
        return _encode_tuple(key)
    return encode(_canonical_key(key))


def encode_keys(keys: Iterable) -> list:
    """:func:`encode_key` of each of ``keys``, in one call: a base encodes a key per entry
    it writes, and a pair whose first item is a str (entry state's ``(key, entry)``) is packed
    without the calls of :func:`encode_key`, its str once per call (:func:`encode_pairs`).

    >>> keys = [("the", 7), ("a", 2**70), "x", (1.0, "b"), ("b", True), ("the", 8)]
    >>> encode_keys(keys) == [encode_key(k) for k in keys]
    True
    """
    starts: dict = {}

    def start_of(first: str) -> tuple:
        start = starts[first] = (b"", pair_start(first))
        return start

    return encode_pairs(keys, starts, start_of, encode_key)


def pair_start(first: str) -> bytes:
    """The packed start of the payload of a ``(first, second)`` key: the array header and ``first``.
    :func:`encode_pairs` appends the second item, so a caller may keep this per ``first``.

    >>> encode_key(("the", 7)).endswith(pair_start("the") + bytes([7]))
    True
    """
    return b"\x92" + _flat_packer().pack(first)


def encode_pairs(keys: Iterable, starts: dict, start_of: Callable[[str], tuple], other: Callable[[Any], bytes]) -> list:
    """``prefix + encode_key(key)`` of each of ``keys``: for a pair whose first item is a str,
    the str's ``(prefix, pair_start(str))`` from ``starts`` (a caller's cache: a word's entries
    share them), else from ``start_of(str)``; only the second item is packed here (an int at
    once, anything else once per call: entry state's size entry, one a word in every base);
    any other key is ``other(key)``. A base writes a key per entry (200k entry keys of 1,000
    words with their groups: 0.61 -> 0.37 us a key, through :meth:`.StateKeys.encode_many`).

    >>> start_of = lambda s: (b"G", pair_start(s))
    >>> keys = [("the", 7), ("a", 2**70), ("b", -3), "x", ("c", ("size",)), ("d", 1.0), ("e", 0.5)]
    >>> encode_pairs(keys, {}, start_of, lambda k: b"G" + encode_key(k)) == [b"G" + encode_key(k) for k in keys]
    True

    The loop runs in C where ``snapshots/_written.c`` is built (``pair_keys``: 0.4-0.7 us a
    key here, a third of a base row); this one is the reference, and the one without it.
    """
    if _pair_keys is not None:
        return _pair_keys(keys if type(keys) is list else list(keys), starts, start_of, other, _tail_of, _TUPLE_HEADS)
    return _encode_pairs(keys, starts, start_of, other)


def _tail_of(second: Any) -> bytes:
    """The packed second item of a pair key that is not an int (or is past 64 bits), as
    :func:`encode_key` packs it."""
    return _pack(_canonical_key(second))


def _encode_pairs(keys: Iterable, starts: dict, start_of: Callable[[str], tuple], other: Callable[[Any], bytes]) -> list:
    """:func:`encode_pairs` in Python: the reference of its C loop."""
    pack, heads, get = _flat_packer().pack, _TUPLE_HEADS, starts.get
    tails: dict = {}  # second items that are not ints, packed as encode_key packs them
    out = []
    append = out.append
    for key in keys:
        if type(key) is tuple and len(key) == 2 and type(key[0]) is str:
            second = key[1]
            if type(second) is int:
                tail = pack(second)
            else:
                # keys equal under == (1.0, True, 1) share the canonical form, and the cache's slot
                tail = tails.get(second)
                if tail is None:
                    tail = tails[second] = _pack(_canonical_key(second))
            cached = get(key[0])
            prefix, start = cached if cached is not None else start_of(key[0])
            n = len(start) + len(tail)
            if n < 256:
                append(prefix + heads[n] + start + tail)
                continue
        append(other(key))
    return out


def encode_many(values: Iterable) -> list:
    """:func:`encode` of each of ``values``, in one call (a base encodes a state per row:
    0.47 -> 0.25 us for a list of a few ints).

    >>> vals = [[1, 2], (3, "a"), {"k": {4}}, 2**70, None]
    >>> encode_many(vals) == [encode(v) for v in vals]
    True
    """
    # the flat packer at the top: a nested tuple or set re-enters through _pack's own packers
    pack, header = _flat_packer().pack, _HEADER
    return [header + pack(v) for v in values]


def _flat_packer() -> msgpack.Packer:
    """This thread's packer for the outermost value of a call that does not nest in another
    (:func:`_encode_tuple`, :func:`encode_pairs`, :func:`encode_many`): a tuple or set inside
    the value re-enters through :func:`_pack`'s packers, never this one."""
    packer = getattr(_local, "flat", None)
    if packer is None:
        packer = _local.flat = _new_packer()
    return packer


def _encode_tuple(key: tuple) -> bytes:
    """``encode(key)`` for a tuple of str and int, without MessagePack's Python ``default``
    callback and the ``ExtType`` it builds: the same bytes, the extension header written
    here (2.1 us -> 0.6 us for ``(word, page)``; a snapshot encodes one per entry). The
    payload is packed as :func:`_extension` packs it, by a packer of its own: it holds no
    tuple or set, so only a big int re-enters the codec (through ``_pack``'s packers)."""
    return _tuple_bytes(_flat_packer().pack(list(key)))


def _tuple_bytes(payload: bytes) -> bytes:
    """A tuple's packed items with the codec's header and the tuple extension's before them."""
    n = len(payload)
    return (_TUPLE_HEADS[n] if n < 256 else _HEADER + _ext_header(_TUPLE, n)) + payload


#: MessagePack's fixext headers, by payload length: (format byte, type code) follow.
_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}


def _ext_header(code: int, n: int) -> bytes:
    """MessagePack's header of an extension value of type ``code`` with an ``n``-byte payload
    (fixext 1/2/4/8/16, else ext 8/16/32), as its packer writes it."""
    fixed = _FIXEXT.get(n)
    if fixed is not None:
        return bytes((fixed, code))
    if n < 1 << 8:
        return bytes((0xC7, n, code))
    if n < 1 << 16:
        return b"\xc8" + n.to_bytes(2, "big") + bytes((code,))
    return b"\xc9" + n.to_bytes(4, "big") + bytes((code,))


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _TUPLE:
        items = _unpack(data)
        if type(items) is not list:
            raise DecodeError("a tuple's payload is not an array")
        return tuple(items)
    if code == _SET or code == _FROZENSET:
        items = _unpack(data)
        if type(items) is not list:
            raise DecodeError("a set's payload is not an array")
        return set(items) if code == _SET else frozenset(items)
    if code == _BIGINT:
        return int.from_bytes(data, "little", signed=True)
    raise DecodeError(f"unknown extension type {code}")


def _unpack(data: bytes) -> Any:
    # timestamp=2: MessagePack's own timestamp extension (-1), which encode never writes,
    # decodes to a plain int rather than to a msgpack.Timestamp object.
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False, ext_hook=_ext_hook,
                           unicode_errors="surrogatepass", timestamp=2)


def decode(data: bytes) -> Any:
    """Decode bytes written by ``encode``; raise DecodeError on anything else.

    >>> decode(encode({1: (2, 3)}))
    {1: (2, 3)}
    >>> decode(b"garbage")
    Traceback (most recent call last):
    ...
    driftstream.snapshots.codec.DecodeError: unsupported codec version 103 (this build reads version 2)
    """
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if not len(buf):
        raise DecodeError("empty input")
    if buf[0] != _VERSION:
        raise DecodeError(f"unsupported codec version {buf[0]} (this build reads version {_VERSION})")
    try:
        return _unpack(buf[1:])
    except DecodeError:
        raise
    except msgpack.ExtraData as exc:
        raise DecodeError(f"trailing bytes after the value ({exc})") from exc
    except Exception as exc:  # truncated, malformed, or an unhashable key or set element
        raise DecodeError(f"malformed input: {exc!r}") from exc


def _canonical_key(k: Any) -> Any:
    """The representative of ``k``'s ``==`` class: bools and integral floats become ints."""
    t = type(k)
    if t is bool:
        return int(k)
    if t is float:
        return int(k) if k.is_integer() else k  # -0.0 -> 0; inf and nan stay floats
    if t is tuple:
        return tuple(_canonical_key(x) for x in k)
    if t is frozenset:
        return frozenset(_canonical_key(x) for x in k)
    if t is list or t is dict or t is set:
        raise TypeError(f"unhashable key type: {t.__name__}")
    return k


#: the version byte and a tuple's extension header, by payload length below 256
_TUPLE_HEADS = [_HEADER + _ext_header(_TUPLE, n) for n in range(256)]

_written = accelerator("driftstream.snapshots._written")
#: encode_pairs's loop in C (snapshots/_written.c), or None: the Python alone
_pair_keys = getattr(_written, "pair_keys", None)
