"""Throw-away TLS files for the data-plane tests: a CA and a node certificate it signs,
made with the ``openssl`` command line (EC P-256: fast to make)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from driftstream.engine.model.data_plane import DataPlaneTLS


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_tls(directory: Path, name: str = "node") -> DataPlaneTLS:
    """A CA (``<name>-ca.pem``) and a certificate it signs for every node (``<name>.pem``, ``<name>.key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", "-days", "2",
             "-subj", f"/CN=driftstream test CA {name}", cwd=directory)
    _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=driftstream {name}", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{name}-ca.pem", "-CAkey", f"{name}-ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", cwd=directory)
    return DataPlaneTLS(ca=str(directory / f"{name}-ca.pem"), cert=str(directory / f"{name}.pem"), key=str(directory / f"{name}.key"))
