"""A local schema registry for tests and the demos, behind the part of Confluent's REST
API that serializers use (no registry server installs here; any Confluent-compatible
registry works with :mod:`.schema_registry`): register a schema under a subject
(``POST /subjects/{subject}/versions``), look one up (``POST /subjects/{subject}``), fetch
by id (``GET /schemas/ids/{id}``) and a subject's latest (``GET
/subjects/{subject}/versions/latest``). In memory, one thread; ``basic_auth`` makes it
require those credentials (401 otherwise)."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import unquote, urlparse


class LocalRegistry:
    """``url``; ``subjects``: subject -> [schema ids, by version]; ``requests``: paths seen.

    >>> registry = LocalRegistry()
    >>> registry.url.startswith("http://127.0.0.1:")
    True
    >>> registry.close()
    """

    def __init__(self, basic_auth: Optional[tuple] = None) -> None:
        self.schemas: list = []  # id - 1 -> {"schema": ..., "schemaType": ...}
        self.subjects: dict = {}
        self.requests: list = []
        self.lock = threading.Lock()
        self.auth = None if basic_auth is None else "Basic " + base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _register(self, subject: str, body: dict) -> dict:
        entry = {"schema": body["schema"], "schemaType": body.get("schemaType", "AVRO"), "references": body.get("references", [])}
        with self.lock:
            if entry not in self.schemas:
                self.schemas.append(entry)
            schema_id = self.schemas.index(entry) + 1
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
        return {"id": schema_id, "subject": subject, "version": versions.index(schema_id) + 1}

    def _handler(self):
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                registry.requests.append(f"{method} {self.path}")
                if registry.auth is not None and self.headers.get("Authorization") != registry.auth:
                    return self._answer(401, {"error_code": 40101, "message": "Unauthorized"})
                parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}") if method == "POST" else {}
                if method == "POST" and len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
                    return self._answer(200, registry._register(parts[1], body))
                if method == "POST" and len(parts) == 2 and parts[0] == "subjects":
                    entry = {"schema": body["schema"], "schemaType": body.get("schemaType", "AVRO"), "references": body.get("references", [])}
                    ids = registry.subjects.get(parts[1], [])
                    for version, schema_id in enumerate(ids, 1):
                        if registry.schemas[schema_id - 1] == entry:
                            return self._answer(200, {"subject": parts[1], "id": schema_id, "version": version, **entry})
                    return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                if method == "GET" and parts[:2] == ["schemas", "ids"] and len(parts) == 3:
                    schema_id = int(parts[2])
                    if 1 <= schema_id <= len(registry.schemas):
                        return self._answer(200, registry.schemas[schema_id - 1])
                    return self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                if method == "GET" and len(parts) == 4 and parts[0] == "subjects" and parts[2] == "versions":
                    ids = registry.subjects.get(parts[1])
                    if not ids:
                        return self._answer(404, {"error_code": 40401, "message": "Subject not found"})
                    version = len(ids) if parts[3] == "latest" else int(parts[3])
                    return self._answer(200, {"subject": parts[1], "id": ids[version - 1], "version": version, **registry.schemas[ids[version - 1] - 1]})
                return self._answer(404, {"error_code": 404, "message": f"not served here: {method} {self.path}"})

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

        return Handler
