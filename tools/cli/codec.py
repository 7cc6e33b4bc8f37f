"""`tidemark codec-server` and `tidemark codec-key`: payloads in clear for those allowed.

The keys are the worker's (TIDEMARK_CODEC_KEYS_FILE, TIDEMARK_CODEC_KEY_ID); see docs/operate.md,
"Payloads encrypted in Temporal's history"."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tidemark.errors import ConfigError
from tidemark.settings import ENV_CODEC_KEYS_FILE


def add_codec_commands(sub: Any) -> None:
    cs = sub.add_parser(
        "codec-server", help="serve POST /decode and /encode (Temporal's codec server protocol) "
                             "so the Web UI and `temporal workflow show --codec-endpoint` show "
                             "payloads in clear")
    cs.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1: whoever reaches it reads every "
                         "history)")
    cs.add_argument("--port", type=int, default=8081, help="port (default 8081)")
    cs.add_argument("--origin", action="append", default=[], metavar="URL",
                    help="a Web UI origin allowed by CORS (repeat it; default: "
                         "TIDEMARK_UI_URL, else http://localhost:8233 and http://127.0.0.1:8233)")
    cs.add_argument("--token-file", metavar="PATH",
                    help="answer only requests with `Authorization: Bearer <the file's token>` "
                         "(default: TIDEMARK_CODEC_TOKEN_FILE; unset: no check)")
    cs.set_defaults(func=_cmd_codec_server)

    ck = sub.add_parser("codec-key", help="print a new key line (ID=BASE64) to append to "
                                          "TIDEMARK_CODEC_KEYS_FILE")
    ck.add_argument("id", nargs="?", help="the key id (default: key-YYYYMMDD)")
    ck.set_defaults(func=_cmd_codec_key)


def _cmd_codec_server(a: argparse.Namespace) -> int:
    from tools.cli.stack import _interrupt_event
    from tools.operate.codec_server import DEFAULT_ORIGINS, ENV_TOKEN_FILE, CodecServer, read_token

    keys = a.settings.codec_keys()
    if keys is None:
        raise ConfigError(f"{ENV_CODEC_KEYS_FILE} is unset: point it at the workers' key file")
    token_file = a.token_file or a.settings.env.get(ENV_TOKEN_FILE)
    token = read_token(token_file) if token_file else None
    ui = a.settings.env.get("TIDEMARK_UI_URL", "").rstrip("/")
    origins = a.origin or ([ui] if ui else list(DEFAULT_ORIGINS))
    server = CodecServer(keys, host=a.host, port=a.port, origins=origins, token=token)
    try:
        server.start()
    except OSError as e:
        raise ConfigError(f"cannot listen on {a.host}:{a.port}: {e.strerror}; choose another "
                          "with --port") from None
    try:
        interrupted = _interrupt_event()
        print(f"codec server on {server.url} (POST /decode, /encode), keys "
              f"{', '.join(keys.keys)} (encrypting with {keys.current_id}); CORS for "
              f"{', '.join(origins)}; {'bearer token required' if token else 'no token'}. "
              "Ctrl-C stops.", flush=True)
        interrupted.wait()
    finally:
        server.stop()
    return 0


def _cmd_codec_key(a: argparse.Namespace) -> int:
    from tidemark.codec import KEY_ID_PATTERN, new_key

    key_id = a.id or time.strftime("key-%Y%m%d")
    if not KEY_ID_PATTERN.fullmatch(key_id):
        raise ConfigError(f"key id {key_id!r}: letters, digits, '.', '_' or '-', at most 64")
    print(f"{key_id}={new_key()}")
    return 0
