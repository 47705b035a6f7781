"""Kafka partitions over the wire protocol on a blocking socket: fetch and produce.

kafka-python's clients run every request through their network layer (selector,
futures, tasks, an I/O thread in 3.x). A source fetches ~150 times a second while
its partition is idle (a broker may not answer a long poll early: Tansu holds an
empty fetch for its whole ``max_wait_ms``), and there that layer costs ~1 ms of
CPU per fetch in the caller and as much again in the I/O thread. A blocking
socket that encodes and decodes with kafka-python's protocol classes costs
0.2-0.4 ms, so here a reader or writer talks to its partitions' leader directly,
one request at a time; :func:`locate` finds the leader and the API versions the
broker speaks the same way.

A secured broker (:class:`.KafkaSecurity`: TLS, SASL) is reached the same way: the
socket is wrapped in TLS and authenticated (SaslHandshake, SaslAuthenticate) when it
opens, and opened again before the SASL session's lifetime runs out.

A moved leader or a broken connection is found again (metadata refresh, new
socket) for up to ``timeout_s``; any other error code raises.

A fetch answer is decoded into :class:`.Batch` es, control batches (transaction markers)
included, with the partition's last stable offset and the aborted transactions the broker
listed (:meth:`TopicFetcher.fetch_answers`); :mod:`.transactions` decides which records a
read_committed reader takes. A batch compressed with a codec whose library is missing
raises :class:`.MissingCodec` naming the partition, the codec and the package.

>>> docs = TopicFetcher("127.0.0.1:9092", "docs", [0])             # doctest: +SKIP
>>> [r.offset for r in docs.fetch({0: 0})[0]]                         # doctest: +SKIP
[0, 1, 2]
>>> PartitionWriter("127.0.0.1:9092", "docs", 0, compression_type=4).write([(b"{}", [])])  # doctest: +SKIP
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import kafka.errors as kafka_errors
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record import MemoryRecords
from kafka.record.memory_records import MemoryRecordsBuilder

from driftstream.engine.connectors.kafka.codecs import KNOWN_CODEC_IDS, missing_codec
from driftstream.engine.connectors.kafka.record_batch import encoded_batches
from driftstream.engine.connectors.kafka.security import PLAINTEXT, REFUSED, KafkaSecurity, TlsHandshakeTimeout
from driftstream.engine.connectors.kafka.transactions import Batch

#: Highest request versions used (those whose fields this module fills in).
FETCH_VERSION, PRODUCE_VERSION = 12, 9

#: Largest record batch one produce request carries: under the 1 MiB brokers accept by
#: default (``message.max.bytes``); more goes in several requests.
MAX_BATCH_BYTES = 512 * 1024

#: Bytes one fetch may return for the partition (Kafka's consumer default).
FETCH_MAX_BYTES = 1024 * 1024

#: A fetch's ``isolation_level``: every record up to the high watermark, or records up to the
#: last stable offset with the aborted transactions listed.
READ_UNCOMMITTED, READ_COMMITTED = 0, 1

#: Seconds one attempt of :func:`locate` gives a bootstrap server to connect and answer.
LOCATE_ATTEMPT_S = 5.0

#: Error codes after which the leader is looked up again rather than the request failed.
RELOCATE_ERRORS = frozenset(
    cls.errno
    for cls in (
        kafka_errors.NotLeaderForPartitionError,
        kafka_errors.LeaderNotAvailableError,
        kafka_errors.UnknownTopicOrPartitionError,
        kafka_errors.FencedLeaderEpochError,
        kafka_errors.UnknownLeaderEpochError,
        kafka_errors.NotEnoughReplicasError,
        kafka_errors.RequestTimedOutError,
    )
)

#: Largest reply a broker may announce: a length prefix past it is not a Kafka answer (a
#: TLS listener read as plaintext announces ~350 MB), and reading it would allocate it
#: whole. Kafka's own ceiling for one request is ``socket.request.max.bytes``, 100 MiB by
#: default; a fetch here asks for ``FETCH_MAX_BYTES`` per partition (a broker may exceed
#: it by one batch, ``message.max.bytes``), and metadata of even a large cluster is a few MB.
MAX_REPLY_BYTES = 100 * 1024 * 1024

_SIZE = struct.Struct(">i")
_FetchTopic = FetchRequest.FetchTopic
_FetchPartition = _FetchTopic.FetchPartition
_ProduceTopic = ProduceRequest.TopicProduceData


@dataclass(frozen=True)
class Leader:
    """Where a partition's leader listens, and the request versions it speaks."""

    host: str
    port: int
    fetch_version: int
    produce_version: int


#: The port of a bootstrap server given without one (Kafka's, as kafka-python assumes).
DEFAULT_PORT = 9092


def split_host_port(server: str) -> tuple:
    """``(host, port)`` of a bootstrap server: ``host:port``, ``[ipv6]:port``, or either
    without the port (then :data:`DEFAULT_PORT`); a bare IPv6 address is taken whole.
    ValueError naming ``server`` and the forms taken otherwise. O(len(server)).

    >>> split_host_port("kafka-0:9093"), split_host_port(" [::1]:9092"), split_host_port("::1")
    (('kafka-0', 9093), ('::1', 9092), ('::1', 9092))
    """
    text = server.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bootstrap server {server!r}: write an IPv6 address as [address]:port")
        port = rest[1:]
    elif text.count(":") > 1:
        host, port = text, ""  # a bare IPv6 address: its last group is no port
    else:
        host, _, port = text.partition(":")
    if not host or (port and not port.isdigit()) or (port and not 0 < int(port) < 65536):
        raise ValueError(f"bootstrap server {server!r} is not host:port, [ipv6]:port or host")
    return host, int(port) if port else DEFAULT_PORT


def join_host_port(host: str, port: int) -> str:
    """``host:port``, brackets around an IPv6 address (the inverse of :func:`split_host_port`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def topic_metadata(conn: "BrokerConnection", topic: str) -> tuple:
    """``(versions, metadata)``: the highest version of each API the broker takes, and its
    MetadataResponse for ``topic``, asked so that it is not created: Metadata version 4 can say
    so (a broker with auto.create.topics.enable would create it)."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

    versions = {v.api_key: v.max_version for v in conn.request(ApiVersionsRequest(), ApiVersionsResponse, 0).api_keys}
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False)
    return versions, conn.request(request, MetadataResponse, 4 if versions.get(MetadataRequest.API_KEY, 0) >= 4 else 1)


def locate(bootstrap_servers: str, topic: str, partitions: Sequence[int], timeout_s: float = 30.0,
           security: KafkaSecurity = PLAINTEXT) -> Leader:
    """The broker leading ``partitions`` of ``topic`` (waits up to ``timeout_s`` for one to
    be elected). ValueError if different brokers lead them.

    One connection to a bootstrap server, ApiVersions then Metadata: ~2 ms. (kafka-python's
    client took ~100 ms for the same metadata, in every reader and writer a recovery opens.)
    """

    wanted = set(partitions)
    deadline = time.monotonic() + timeout_s
    problem = "no bootstrap server answered"
    while True:
        for server in bootstrap_servers.split(","):
            host, port = split_host_port(server)
            try:
                # A stalled server (connections accepted, never answered) is given up on within
                # LOCATE_ATTEMPT_S, so that one that is back is found again at once.
                conn = BrokerConnection(host, port, "driftstream-locate", max(0.1, min(LOCATE_ATTEMPT_S, deadline - time.monotonic())), security)
            except REFUSED:
                raise
            except OSError as exc:
                problem = f"{server}: {exc!r}"
                continue
            try:
                versions, metadata = topic_metadata(conn, topic)
            except REFUSED:
                raise
            except (OSError, kafka_errors.CorrelationIdError) as exc:
                problem = f"{server}: {exc!r}"
                continue
            finally:
                conn.close()
            leaders = {p.partition_index: p.leader_id for t in metadata.topics if t.name == topic for p in t.partitions if p.error_code == 0}
            nodes = {leaders.get(p, -1) for p in wanted}
            if len(nodes) > 1 and min(nodes) >= 0:
                raise ValueError(f"{_name(topic, partitions)} are led by brokers {sorted(nodes)}: read them with one fetcher per leader")
            brokers = {b.node_id: b for b in metadata.brokers}
            node = nodes.pop() if len(nodes) == 1 else -1
            if node in brokers:
                return Leader(
                    brokers[node].host,
                    brokers[node].port,
                    min(FETCH_VERSION, versions.get(FetchRequest.API_KEY, 0)),
                    min(PRODUCE_VERSION, versions.get(ProduceRequest.API_KEY, 0)),
                )
            problem = "no leader elected"
            break  # the cluster answered: ask again after a pause
        if time.monotonic() > deadline:
            raise kafka_errors.LeaderNotAvailableError(f"no leader for {_name(topic, partitions)} after {timeout_s} s ({problem})")
        time.sleep(0.05)


def _name(topic: str, partitions: Sequence[int]) -> str:
    return f"{topic}[{','.join(map(str, partitions))}]"


class ReplyTooLarge(kafka_errors.KafkaProtocolError):
    """A broker announced a reply longer than :data:`MAX_REPLY_BYTES` (or negative)."""


class BrokerConnection:
    """A blocking socket to one broker: a request, then its response.

    O(request + response bytes) per call; no thread, no selector. Not thread-safe:
    one owner at a time. With ``security``, TLS and SASL are done when it opens;
    ``renew_at`` is when its SASL session should be replaced (None: never).
    """

    def __init__(self, host: str, port: int, client_id: str, timeout_s: float, security: KafkaSecurity = PLAINTEXT) -> None:
        self.client_id = client_id
        self.address = join_host_port(host, port)
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = security.wrap(sock, host)
            self._correlation_id = 0
            self.renew_at: Optional[float] = security.authenticate(self, f"{host}:{port}") if security.sasl else None
        except BaseException:
            sock.close()
            raise

    def request(self, request: Any, response_class: Any, version: int) -> Any:
        """Send ``request`` as ``version`` and return its decoded response."""
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        request.API_VERSION = version
        request.with_header(correlation_id=self._correlation_id, client_id=self.client_id)
        self._sock.sendall(request.encode(header=True, framed=True))
        (size,) = _SIZE.unpack(self._read(4))
        if not 0 <= size <= MAX_REPLY_BYTES:
            self.close()  # the rest of the stream cannot be framed again
            raise ReplyTooLarge(f"Kafka broker {self.address} announced a reply of {size:,} bytes to a {type(request).__name__}, "
                                f"outside 0..{MAX_REPLY_BYTES:,}: it is not speaking the Kafka protocol on this connection "
                                "(a TLS listener needs security_protocol 'SSL' or 'SASL_SSL'); check bootstrap_servers and security")
        response = response_class.decode(self._read(size), version=version, header=True)
        if response.header.correlation_id != self._correlation_id:
            raise kafka_errors.CorrelationIdError(f"sent request {self._correlation_id}, got the answer to {response.header.correlation_id}")
        return response

    def _read(self, n: int) -> memoryview:
        buf = memoryview(bytearray(n))
        got = 0
        while got < n:
            k = self._sock.recv_into(buf[got:])
            if not k:
                raise ConnectionError("the broker closed the connection")
            got += k
        return buf

    def close(self) -> None:
        self._sock.close()


#: Seconds :func:`check_broker` gives a broker to connect and answer.
CHECK_TIMEOUT_S = 5.0


def check_broker(bootstrap_servers: str, security: KafkaSecurity = PLAINTEXT, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Raise a clear error, within about ``timeout_s``, if the first bootstrap server that
    answers does not take ``security``: a TLS handshake that fails (not a TLS listener, a
    certificate that does not verify) or that gets no answer (a plaintext listener, most
    likely), refused SASL credentials or mechanism, or a broker that hangs up on a plaintext
    request (a TLS listener, most likely). A broker that cannot be reached or does not answer
    a plaintext request is no security matter: nothing is raised, the caller's own retries
    deal with it. kafka-python's clients, on these errors, retry until their bootstrap
    timeout (30 s) and then say only that they could not bootstrap.
    """
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    for server in bootstrap_servers.split(","):
        host, port = split_host_port(server)
        try:
            conn = BrokerConnection(host, port, "driftstream-check", timeout_s, security)
        except ssl.SSLError as exc:  # includes a certificate that does not verify
            raise kafka_errors.KafkaConnectionError(
                f"TLS with Kafka broker {server} failed ({exc.reason or exc}): check ssl_cafile and ssl_check_hostname, "
                f"and that {server} is a TLS listener") from None
        except TlsHandshakeTimeout:
            raise kafka_errors.KafkaConnectionError(
                f"Kafka broker {server} accepted the connection but did not answer the TLS handshake within {timeout_s:g} s: "
                "a plaintext listener needs security_protocol 'PLAINTEXT' or 'SASL_PLAINTEXT'") from None
        except (socket.timeout, OSError):
            continue  # not reachable (or not answering a TLS handshake): not a security matter
        try:
            # Metadata (of no topic), not ApiVersions: a broker answers ApiVersions before authentication.
            conn.request(MetadataRequest(topics=[]), MetadataResponse, 1)
            return
        except ConnectionError:
            hint = ("a TLS listener needs security_protocol 'SSL' or 'SASL_SSL', one that requires authentication 'SASL_PLAINTEXT' or 'SASL_SSL'"
                    if security.security_protocol == "PLAINTEXT" else "it may require authentication (SASL_PLAINTEXT or SASL_SSL)")
            raise kafka_errors.KafkaConnectionError(
                f"Kafka broker {server} hung up on a request sent with security_protocol {security.security_protocol!r}: {hint}") from None
        except OSError:
            continue
        finally:
            conn.close()


class _LeaderClient:
    """A connection to the leader of some partitions of a topic; finds the leader again
    when it moves."""

    def __init__(self, bootstrap_servers: str, topic: str, partitions: Sequence[int], client_id: str, timeout_s: float,
                 security: KafkaSecurity = PLAINTEXT) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.security = security
        self.topic = topic
        self.partitions = tuple(partitions)
        self.name = _name(topic, self.partitions)
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.leader = self._locate()
        self._conn: Optional[BrokerConnection] = None
        self._failing_since: Optional[float] = None

    def _connection(self) -> BrokerConnection:
        """The connection to the leader, opened if there is none (first use, after a failure,
        or when its SASL session is about to expire)."""
        if self._conn is not None and self._conn.renew_at is not None and time.monotonic() > self._conn.renew_at:
            self.close()
        if self._conn is None:
            self._conn = BrokerConnection(self.leader.host, self.leader.port, self.client_id, self.timeout_s, self.security)
        return self._conn

    def _locate(self) -> Leader:
        return locate(self.bootstrap_servers, self.topic, self.partitions, self.timeout_s, self.security)

    def _call(self, request: Any, response_class: Any, version: int) -> Optional[Any]:
        """The response, or None after a connection failure (the next call reconnects)."""
        try:
            return self._connection().request(request, response_class, version)
        except REFUSED:
            raise
        except (OSError, kafka_errors.CorrelationIdError) as exc:
            self._relocate(exc)
            return None

    def _check(self, error_code: int, what: str) -> bool:
        """True if ``error_code`` is 0; False after a leader move (try again); raises otherwise."""
        if error_code == 0:
            self._failing_since = None
            return True
        error = kafka_errors.for_code(error_code)
        if error_code in RELOCATE_ERRORS:
            self._relocate(error())
            return False
        raise error(f"{what} {self.name}: {error.__name__}")

    def _relocate(self, cause: BaseException) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since > self.timeout_s:
            raise kafka_errors.KafkaConnectionError(
                f"{self.name}: no working leader for {self.timeout_s} s (last: {cause!r})"
            ) from cause
        self.close()
        time.sleep(0.05)
        try:
            self.leader = self._locate()
        except kafka_errors.KafkaError:
            pass  # the bootstrap servers are unreachable too: the next call tries again

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class FetchWait:
    """How long the broker may hold the next fetch (``max_wait_ms``), adapted to how long
    the broker takes to find the records.

    Some brokers search the log within the fetch's ``max_wait_ms`` and answer with
    nothing when the time runs out first. Tansu's in-memory store lists every stored
    batch of the partition on each fetch (~1 us per batch here) and stops listing at
    that deadline: once a 5 ms wait is too short to list the partition, every fetch
    comes back empty though the partition holds data, and a reader with a fixed wait
    stalls for good. So an empty answer while the high watermark is past the offset
    (*starved*: the broker needs more than the wait) grows the wait by ``GROWTH``, and
    each answer with records (it needed less) shrinks it by ``DECAY`` towards
    ``floor_ms``: the wait hovers just above what the broker needs, at the cost of an
    empty answer every ten or so. The wait is not taken from answer times: a broker
    that keeps gathering newer batches until the deadline answers in about the wait
    itself, and the two would chase each other upwards (a first version that doubled
    on starvation and shrank 3% per answer held Tansu's fetches at ~5x what it needed).

    ``pause_s`` is how long to wait before the next fetch so that this reader keeps the
    broker busy at most ``duty`` of the time: a broker that takes 50 ms per fetch would
    otherwise spend a core on each reader. It is 0 while answers take under ``floor_ms``
    (a broker that indexes its log, e.g. Apache Kafka).

    O(1) per fetch.

    >>> w = FetchWait(floor_ms=5)
    >>> w.observe(took_s=0.001, got_records=True, starved=False); w.wait_ms, w.pause_s
    (5, 0.0)
    >>> w.observe(took_s=0.006, got_records=False, starved=True); w.wait_ms, w.starved
    (7, 1)
    >>> w.observe(took_s=0.008, got_records=False, starved=True); w.wait_ms
    11
    >>> w.observe(took_s=0.015, got_records=True, starved=False); w.wait_ms, w.pause_s
    (10, 0.015)
    >>> for _ in range(50): w.observe(took_s=0.001, got_records=True, starved=False)
    >>> w.wait_ms, w.pause_s
    (5, 0.0)
    """

    #: Factors by which the wait grows per starved answer and shrinks per answer with records.
    GROWTH, DECAY = 1.5, 0.9

    def __init__(self, floor_ms: int = 5, cap_ms: int = 5000, duty: float = 0.5) -> None:
        self.floor_ms = floor_ms
        self.cap_ms = cap_ms
        self.duty = duty
        self._wait = float(floor_ms)
        self.took_ms = 0.0  # the last answer with records: how long the broker took
        self.starved = 0  # empty answers although the partition held more
        self.pause_s = 0.0

    @property
    def wait_ms(self) -> int:
        return int(self._wait)

    def observe(self, took_s: float, got_records: bool, starved: bool) -> None:
        """Account for one answer: ``took_s`` its round trip, ``starved`` if it was empty
        although the high watermark was past the offset asked for."""
        if starved:
            self.starved += 1
            self._wait = min(float(self.cap_ms), self.GROWTH * self._wait)
        elif got_records:
            self.took_ms = took_s * 1000.0
            self._wait = max(float(self.floor_ms), self._wait * self.DECAY)
            slow = self.took_ms > self.floor_ms
            self.pause_s = took_s * (1.0 / self.duty - 1.0) if slow else 0.0


@dataclass(frozen=True)
class PartitionAnswer:
    """One partition of a fetch answer: its batches from the offset asked for on (control
    batches included), the high watermark, the last stable offset (the high watermark when
    the broker does not say) and the aborted transactions it listed, ``(producer id, first
    offset)``. ``data``: the partition's record bytes as fetched, for a reader that reads
    headers now and decodes later (:func:`batches_from`)."""

    batches: list
    high_watermark: int
    last_stable_offset: int
    aborted: tuple = ()
    data: bytes = b""

    def end(self, isolation_level: int) -> int:
        """Where a reader at ``isolation_level`` can read up to, as the broker reports it."""
        return self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark


class TopicFetcher(_LeaderClient):
    """Reads ``partitions`` of ``topic`` (one broker must lead them all) in one request
    per fetch: ``fetch({partition: offset})`` returns each partition's records from its
    offset on (at most ``max_bytes`` each; nothing when nothing came within
    ``max_wait_ms``).

    Records are kafka-python's ``DefaultRecord`` (``offset``, ``timestamp``, ``key``,
    ``value``, ``headers``); control records (transaction markers) are left out, so
    their offsets are holes. ``high_watermarks`` are the last fetch's.
    :meth:`fetch_answers` gives the whole answer: batches, markers, last stable offset.

    ``max_wait_ms`` is where the wait starts: it adapts to the broker (:class:`FetchWait`,
    in ``wait``), up to ``max_wait_cap_ms``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        partitions: Sequence[int],
        max_wait_ms: int = 5,
        max_bytes: int = FETCH_MAX_BYTES,
        client_id: str = "driftstream-fetch",
        timeout_s: float = 30.0,
        max_wait_cap_ms: int = 5000,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        super().__init__(bootstrap_servers, topic, partitions, client_id, timeout_s, security)
        self.wait = FetchWait(floor_ms=max_wait_ms, cap_ms=max(max_wait_ms, max_wait_cap_ms))
        self.max_bytes = max_bytes
        self.high_watermarks: dict = {}

    def fetch(self, offsets: Mapping[int, int]) -> dict:
        """``{partition: records}`` for the partitions that had any (read_uncommitted).
        O(bytes fetched) CPU, up to ``max_wait_ms`` waiting."""
        out: dict = {}
        for p, answer in self.fetch_answers(offsets).items():
            records = [r for b in answer.batches for r in b.records]
            if records:
                out[p] = records
        return out

    def fetch_answers(self, offsets: Mapping[int, int], isolation_level: int = READ_UNCOMMITTED, decode: bool = True) -> dict:
        """``{partition: PartitionAnswer}`` for every partition the broker answered for
        (none after a connection failure or a leader move: call again). ``decode=False``
        reads batch headers only (no record is decoded or decompressed)."""
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=self.wait.wait_ms,
            min_bytes=1,
            max_bytes=self.max_bytes * len(offsets),
            isolation_level=isolation_level,
            session_id=0,
            session_epoch=-1,
            topics=[
                _FetchTopic(
                    topic=self.topic,
                    partitions=[
                        _FetchPartition(
                            partition=p,
                            current_leader_epoch=-1,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=self.max_bytes,
                        )
                        for p, offset in offsets.items()
                    ],
                )
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
        began = time.monotonic()
        response = self._call(request, FetchResponse, self.leader.fetch_version)
        if response is None:
            return {}
        took = time.monotonic() - began
        out: dict = {}
        starved = got = False
        for topic in response.responses:
            for part in topic.partitions:
                p = part.partition_index
                if not self._check(part.error_code, f"fetching offset {offsets.get(p)} of partition {p} of"):
                    return {}
                answer = out[p] = partition_answer(part, offsets[p], decode, f"{self.topic}[{p}]")
                self.high_watermarks[p] = answer.high_watermark
                if answer.batches:
                    got = True
                elif answer.end(isolation_level) > offsets[p]:
                    starved = True
        self.wait.observe(took, got_records=got, starved=starved and not got)
        return out


def partition_answer(part: Any, offset: int, decode: bool = True, where: str = "") -> PartitionAnswer:
    """A decoded FetchResponse partition (kafka-python's ``PartitionData``) fetched at
    ``offset``, as a :class:`PartitionAnswer`."""
    lso = part.last_stable_offset
    data = bytes(part.records) if part.records else b""
    return PartitionAnswer(
        batches_from(data, offset, decode, where) if data else [],
        part.high_watermark,
        part.high_watermark if lso is None or lso < 0 else lso,
        tuple((a.producer_id, a.first_offset) for a in part.aborted_transactions or ()),
        data,
    )


class CorruptFetch(kafka_errors.CorruptRecordError):
    """A fetched partition's bytes do not parse as record batches (a corrupt log, a broker
    bug, or not a Kafka broker): the run fails with where and why, rather than skip them."""


def batches_from(data: bytes, offset: int, decode: bool = True, where: str = "") -> list:
    """The :class:`.Batch` es of a fetched partition's records at ``offset`` and after, in
    order: a data batch with its records from ``offset`` on (none with ``decode=False``), a
    control batch with its outcome. A batch comes whole: on Apache Kafka it may start
    before ``offset``. ``where`` names the partition in errors; bytes that do not parse raise
    :class:`CorruptFetch`.

    >>> batches_from(b"\\x00" * 70, 0, where="orders[0]")
    Traceback (most recent call last):
    ...
    driftstream.engine.connectors.kafka.wire.CorruptFetch: [Error 2] CorruptFetch: orders[0]: the fetched records at offset 0 do not parse (...)
    """
    try:
        return _batches_from(data, offset, decode, where)
    except kafka_errors.KafkaError as exc:
        if not isinstance(exc, kafka_errors.CorruptRecordError) or isinstance(exc, CorruptFetch):
            raise  # a codec that is not installed says so itself
        raise CorruptFetch(f"{where}: the fetched records at offset {offset} do not parse ({exc})") from exc
    except Exception as exc:  # kafka-python's parsers raise what they meet: struct.error, IndexError, ...
        raise CorruptFetch(f"{where}: the fetched records at offset {offset} do not parse ({type(exc).__name__}: {exc})") from exc


def _batches_from(data: bytes, offset: int, decode: bool, where: str) -> list:
    out: list = []
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        if batch.next_offset <= offset:
            continue
        first = max(offset, batch.base_offset)
        if batch.compression_type != 0 and batch.compression_type not in KNOWN_CODEC_IDS or batch.is_control_batch and batch.compression_type:
            raise CorruptFetch(f"{where}: the record batch at offset {batch.base_offset} says compression codec {batch.compression_type}"
                               f"{', but control batches are never compressed' if batch.is_control_batch else ', which Kafka does not have'}")
        if batch.is_control_batch:
            # One record, key (version, type): type 1 commits, 0 aborts. Never compressed.
            marker = next(iter(batch)).commit
            out.append(Batch(first, batch.next_offset, batch.producer_id, batch.is_transactional, marker))
            continue
        kept: Sequence = ()
        if decode:
            error = missing_codec(batch.compression_type, f"{where} at offset {batch.base_offset}")
            if error is not None:
                raise error
            kept = [r for r in batch if r.offset >= offset] if first > batch.base_offset else list(batch)
        out.append(Batch(first, batch.next_offset, batch.producer_id, batch.is_transactional, None, kept, batch.compression_type))
    return out


class PartitionWriter(_LeaderClient):
    """Appends to one partition: ``write(records)`` sends ``(value, headers)`` pairs as
    record batches, one produce request (acks=all) after the other, each awaited.

    Nothing is retried once sent: a request that fails may have landed, and only the
    caller knows how to find out (a sink reads its partition's last message back).
    """

    def __init__(self, bootstrap_servers: str, topic: str, partition: int, client_id: str = "driftstream-write", timeout_s: float = 30.0,
                 security: KafkaSecurity = PLAINTEXT, compression_type: int = 0) -> None:
        super().__init__(bootstrap_servers, topic, [partition], client_id, timeout_s, security)
        self.partition = partition
        self.compression_type = compression_type

    def write(self, records: Iterable[tuple]) -> int:
        """Append ``(value bytes, [(header, bytes)])`` pairs (or ``(value, headers, key bytes)``,
        a keyed record); returns how many. O(bytes) CPU,
        plus the codec's (``compression_type``, see :mod:`.codecs`)."""
        n = 0
        for builder in record_batches(records, self.compression_type):
            self._send(builder)
            n += builder.next_offset()
        return n

    def _send(self, builder: MemoryRecordsBuilder) -> None:
        builder.close()
        request = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout_ms=int(self.timeout_s * 1000),
            topic_data=[_ProduceTopic(name=self.topic, partition_data=[_ProduceTopic.PartitionProduceData(index=self.partition, records=builder.buffer())])],
        )
        what = f"writing {builder.next_offset()} records to"
        try:
            response = self._connection().request(request, ProduceResponse, self.leader.produce_version)
        except REFUSED:
            raise
        except (OSError, kafka_errors.CorrelationIdError) as exc:  # the connection is no longer usable
            self.close()
            raise kafka_errors.KafkaConnectionError(f"{what} {self.name}: {exc}") from exc
        for topic in response.responses:
            for part in topic.partition_responses:
                if part.error_code:
                    error = kafka_errors.for_code(part.error_code)
                    if part.error_code in RELOCATE_ERRORS:
                        self.close()
                        self.leader = self._locate()
                    raise error(f"{what} {self.name}: {part.error_message or error.__name__}")


def record_batches(records: Iterable[tuple], compression_type: int = 0) -> Iterator[Any]:
    """The record batches of ``(value bytes, [(header, bytes)])`` pairs (or ``(value, headers,
    key bytes)``), closed (built and compressed), each at most ``MAX_BATCH_BYTES`` before
    compression. O(bytes) CPU.

    >>> [b.next_offset() for b in record_batches([(b"{}", [])] * 3, compression_type=4)]
    [3]
    """
    if compression_type == 0:
        yield from encoded_batches(records, MAX_BATCH_BYTES)  # one pass, not kafka-python's builder (record_batch.py)
        return
    builder = _builder(compression_type)
    for record in records:  # (value, headers), or a keyed sink's (value, headers, key)
        value, headers, key = record if len(record) == 3 else (*record, None)
        if builder.append(timestamp=None, key=key, value=value, headers=headers) is None:  # batch full
            builder.close()
            yield builder
            builder = _builder(compression_type)
            builder.append(timestamp=None, key=key, value=value, headers=headers)
    if builder.next_offset():
        builder.close()
        yield builder


def _builder(compression_type: int = 0) -> MemoryRecordsBuilder:
    # MAX_BATCH_BYTES bounds the uncompressed batch: a compressed one is smaller still.
    return MemoryRecordsBuilder(magic=2, compression_type=compression_type, batch_size=MAX_BATCH_BYTES)
