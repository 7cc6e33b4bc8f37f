"""The codec server: Temporal's remote codec protocol over the payload codec.

``POST /decode`` and ``POST /encode`` take ``{"payloads": [...]}`` (Temporal's ``Payloads`` in
protobuf JSON) and answer the same shape, as Temporal's samples-python ``encryption/
codec_server.py`` does. The Web UI (``--ui-codec-endpoint``, or its settings page) and
``temporal workflow show --codec-endpoint URL`` call it to show payloads in clear. It answers
the Web UI's CORS preflight for the origins it is given, and, with a token, only requests
carrying ``Authorization: Bearer <token>`` see a payload. It binds 127.0.0.1 unless told
otherwise: whoever reaches it reads every history.

The standard library's threading HTTP server: no web framework in the product's dependencies.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from tidemark.codec import KeySource, UnknownKey, decrypt, encrypt
from tidemark.errors import ConfigError
from tidemark.secret_files import unreadable

log = logging.getLogger("tidemark.codec_server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8081  # the port of Temporal's sample codec server
# The Web UI of a dev server on its default port, as a browser may name it.
DEFAULT_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")
# The largest request read: a page of history the Web UI decodes at once stays far below it
# (Temporal caps one payload at 2 MiB by default), and an endless body cannot fill memory.
MAX_BODY = 64 * 1024 * 1024
ENV_TOKEN_FILE = "TIDEMARK_CODEC_TOKEN_FILE"


@dataclass
class CodecServer:
    """Serves /encode and /decode for ``source`` until stopped; use as a context manager."""

    source: KeySource
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: any free port
    origins: Sequence[str] = DEFAULT_ORIGINS
    token: str | None = field(default=None, repr=False)
    _httpd: ThreadingHTTPServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def bind(self) -> CodecServer:
        self._httpd = ThreadingHTTPServer((self.host, self.port), _handler(self))
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        return self

    def start(self) -> CodecServer:
        """Binds and serves in a thread of its own."""
        httpd = self.bind()._httpd
        assert httpd is not None
        self._thread = threading.Thread(target=httpd.serve_forever, name="codec-server",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        if self._httpd is None:
            self.bind()
        assert self._httpd is not None
        self._httpd.serve_forever()

    def stop(self) -> None:
        if self._httpd is not None:
            if self._thread is not None:
                self._httpd.shutdown()
                self._thread.join()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> CodecServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(server: CodecServer) -> type[BaseHTTPRequestHandler]:
    codecs: dict[str, Callable[[list[Payload]], list[Payload]]] = {
        "/encode": lambda p: encrypt(server.source, p),
        "/decode": lambda p: decrypt(server.source, p),
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_OPTIONS(self) -> None:  # the Web UI's preflight carries no credentials
            self._answer(200, b"")

        def do_POST(self) -> None:
            codec = codecs.get(self.path.rstrip("/").rsplit("?", 1)[0])
            if codec is None:
                return self._answer(404, b"POST /encode or /decode\n", "text/plain")
            if server.token is not None and not hmac.compare_digest(
                    self.headers.get("Authorization", "").encode(),
                    f"Bearer {server.token}".encode()):
                return self._answer(401, b"a bearer token is required\n", "text/plain")
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                return self._answer(413 if length else 400, b"a body of Payloads JSON\n",
                                    "text/plain")
            try:
                payloads = json_format.Parse(self.rfile.read(length), Payloads()).payloads
                answer = Payloads(payloads=codec(list(payloads)))
            except (json_format.ParseError, UnknownKey) as e:
                return self._answer(400, f"{e}\n".encode(), "text/plain")
            self._answer(200, json_format.MessageToJson(answer).encode(), "application/json")

        def _answer(self, status: int, body: bytes, kind: str | None = None) -> None:
            self.send_response(status)
            origin = self.headers.get("Origin")
            if origin and origin in server.origins:
                self.send_header("Access-Control-Allow-Origin", origin)
                self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
                # What the preflight asks for (the Web UI's versions add headers over time),
                # else the ones it sends today.
                self.send_header("Access-Control-Allow-Headers", self.headers.get(
                    "Access-Control-Request-Headers", "content-type, x-namespace, authorization"))
                self.send_header("Access-Control-Allow-Credentials", "true")
                self.send_header("Vary", "Origin")
            if kind:
                self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # The request line and status only: never a header (the token) or a body.
            log.info("%s %s", self.address_string(), format % args)

    return Handler


def read_token(path: str) -> str:
    """The bearer token in the file at ``path``: one line."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(unreadable(ENV_TOKEN_FILE, path, e)) from None
    if not token or "\n" in token:
        raise ConfigError(f"{ENV_TOKEN_FILE} {path}: the token is one line, not empty")
    return token


def payloads_json(payloads: Sequence[Payload]) -> bytes:
    """``{"payloads": [...]}`` as the codec endpoints take it (for clients and tests)."""
    return json_format.MessageToJson(Payloads(payloads=payloads)).encode()
