"""Shared fixtures: one lean local Ray session per test run."""

from __future__ import annotations

import os

import pytest

from driftstream.engine.runtime.ray_session import LEAN_RAY_ENV

for _k, _v in LEAN_RAY_ENV.items():
    os.environ.setdefault(_k, _v)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that needs one; shut down at the end."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="driftstream", configure_logging=False)
    yield ray
    ray.shutdown()


def flow_actors(prefix: str) -> list:
    """Names of live driftstream actors whose name starts with ``prefix``."""
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]


@pytest.fixture(scope="session")
def kafka_broker():
    """One local Tansu broker for the whole test run (real Kafka protocol, in-memory storage)."""
    from driftstream.engine.connectors.local_kafka import start_local_kafka

    broker = start_local_kafka()
    yield broker
    broker.stop()
