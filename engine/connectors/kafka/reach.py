"""Whether a Kafka connector's bootstrap servers can be reached, asked before its clients open.

kafka-python's clients retry an unreachable bootstrap server in silence for 30 s
(``bootstrap_timeout_ms``), then raise ``KafkaTimeoutError("Unable to bootstrap from ...")``,
which names neither the connector nor what to check. :func:`reach` opens a plain TCP
connection to each bootstrap server, again every :data:`RETRY_PAUSE_S`, until one opens or
``timeout_s`` has passed: it warns once when the first round fails (the wait is not silent;
a broker starting next to the flow may still come up), then raises :class:`BrokerUnreachable`
naming the connector, each address with why it failed, and what to check.
:func:`bootstrap_errors` gives kafka-python's own bootstrap failure (a server that takes the
TCP connection but does not answer as a Kafka broker) the same form.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import Iterator

import kafka.errors as kafka_errors

from driftstream.engine.connectors.kafka.wire import split_host_port

log = logging.getLogger(__name__)

#: Seconds between two rounds of connection attempts.
RETRY_PAUSE_S = 0.5
#: Seconds one TCP connection attempt may take (a host that drops packets answers nothing).
CONNECT_TIMEOUT_S = 3.0

WHAT_TO_CHECK = ("check that the broker is running, that bootstrap_servers names its host and port (a listener it "
                 "advertises to clients), that no firewall is in the way, and that security_protocol and the TLS/SASL "
                 "settings match that listener")


class BrokerUnreachable(kafka_errors.KafkaConnectionError):
    """No bootstrap server of a Kafka connector could be reached within the connector's timeout."""


def reach(bootstrap_servers: str, who: str, timeout_s: float) -> None:
    """Return once a TCP connection to one of ``bootstrap_servers`` opens; raise
    :class:`BrokerUnreachable` (naming ``who``, e.g. ``KafkaSource 'events'``) if none opens
    within ``timeout_s``. One warning when the first round fails, none per attempt."""
    servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    deadline = time.monotonic() + timeout_s
    warned = False
    while True:
        failures = {}
        for server in servers:
            host, port = split_host_port(server)
            try:
                socket.create_connection((host, port), timeout=max(0.1, min(CONNECT_TIMEOUT_S, deadline - time.monotonic()))).close()
                if warned:
                    log.info("%s: Kafka broker %s reachable", who, server)
                return
            except OSError as exc:
                failures[server] = _reason(exc)
        left = deadline - time.monotonic()
        if left <= 0:
            raise BrokerUnreachable(unreachable_text(who, bootstrap_servers, timeout_s, failures))
        if not warned:
            log.warning("%s cannot reach a Kafka broker at %s (%s); trying again for up to %g s",
                        who, bootstrap_servers, "; ".join(f"{s}: {r}" for s, r in failures.items()), timeout_s)
            warned = True
        time.sleep(min(RETRY_PAUSE_S, left))


def unreachable_text(who: str, bootstrap_servers: str, timeout_s: float, failures: dict) -> str:
    """The message of a :class:`BrokerUnreachable`: who, where, why (per server), what to check."""
    why = "; ".join(f"{server}: {reason}" for server, reason in failures.items())
    return f"{who} could not reach a Kafka broker at {bootstrap_servers} within {timeout_s:g} s ({why}): {WHAT_TO_CHECK}"


@contextlib.contextmanager
def bootstrap_errors(bootstrap_servers: str, who: str, timeout_s: float) -> Iterator[None]:
    """Within: kafka-python's "Unable to bootstrap" (its clients' only bootstrap error) raised as
    :class:`BrokerUnreachable` naming ``who`` and what to check."""
    try:
        yield
    except kafka_errors.KafkaTimeoutError as exc:
        if "bootstrap" not in str(exc):
            raise
        failures = {bootstrap_servers: "the connection opened, but no Kafka broker answered on it"}
        raise BrokerUnreachable(unreachable_text(who, bootstrap_servers, timeout_s, failures)) from None


def _reason(exc: OSError) -> str:
    """Why a connection attempt failed, in words (``socket.gaierror``: a host name that does not resolve)."""
    if isinstance(exc, socket.gaierror):
        return f"host name does not resolve ({exc.strerror or exc})"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no answer (timed out)"
    return exc.strerror or str(exc) or type(exc).__name__
