"""The payload codec: AES-GCM under key ids, rotation, old histories, the codec server.

Unit tier: no server. The runs through Temporal are in tests/test_codec_history.py."""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import DataConverter

from helpers.codec_keys import KEYS, key_file, key_line
from tidemark.codec import (
    ENCODING,
    KEY_ID_META,
    FileKeys,
    UnknownKey,
    data_converter,
    file_keys,
    parse_keys,
)
from tidemark.errors import ConfigError
from tidemark.settings import load_settings
from tools.cli.main import main
from tools.operate.codec_server import CodecServer, payloads_json

MARKER = "body-marker-7f3a"
A = FileKeys("key-a", {"key-a": KEYS["key-a"]})
ROTATED = FileKeys("key-b", KEYS)  # both keys, B encrypts
ONLY_B = FileKeys("key-b", {"key-b": KEYS["key-b"]})
ROOT = Path(__file__).resolve().parent.parent


async def test_a_payload_is_encrypted_whole_and_names_its_key() -> None:
    payloads = await data_converter(A).encode([{"body": MARKER, "to": ["bob@example.com"]}])
    assert len(payloads) == 1
    p = payloads[0]
    assert p.metadata["encoding"] == ENCODING and p.metadata[KEY_ID_META] == b"key-a"
    assert MARKER.encode() not in p.SerializeToString()
    assert b"bob@example.com" not in p.SerializeToString()
    assert await data_converter(A).decode(payloads) == [
        {"body": MARKER, "to": ["bob@example.com"]}]
    # A fresh nonce each time: the same value never gives the same bytes.
    again = await data_converter(A).encode([{"body": MARKER, "to": ["bob@example.com"]}])
    assert again[0].data != p.data


async def test_keys_rotate_what_a_encrypted_and_what_b_encrypts_both_decode() -> None:
    old = await data_converter(A).encode([MARKER])
    new = await data_converter(ROTATED).encode([MARKER + "-new"])
    assert new[0].metadata[KEY_ID_META] == b"key-b"
    rotated = data_converter(ROTATED)
    assert await rotated.decode(old) == [MARKER]
    assert await rotated.decode(new) == [MARKER + "-new"]
    # A process that dropped key A too soon says which key it lacks, in one line.
    with pytest.raises(UnknownKey) as e:
        await data_converter(ONLY_B).decode(old)
    assert "'key-a'" in str(e.value) and "\n" not in str(e.value)


async def test_a_clear_payload_passes_through_so_old_histories_still_read() -> None:
    clear = await DataConverter.default.encode([{"body": MARKER}])
    assert await data_converter(A).decode(clear) == [{"body": MARKER}]
    assert await data_converter(None).decode(clear) == [{"body": MARKER}]


async def test_a_wrong_or_absent_key_refuses_in_one_line_naming_the_id() -> None:
    sealed = await data_converter(A).encode([MARKER])
    for source, said in ((None, "has no keys (TIDEMARK_CODEC_KEYS_FILE is unset)"),
                         (ONLY_B, "this process holds key-b"),
                         (FileKeys("key-a", {"key-a": KEYS["key-b"]}), "another key under "
                                                                       "the same id")):
        with pytest.raises(UnknownKey) as e:
            await data_converter(source).decode(sealed)
        message = str(e.value)
        assert "'key-a'" in message and said in message and "\n" not in message
        assert KEYS["key-a"].hex() not in message


def test_the_key_file_is_checked_in_one_line_that_never_quotes_a_key(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    secret = key_line("key-a").partition("=")[2]
    cases = {
        "": "holds no key",
        f"key-a {secret}\n": "line 1: not ID=BASE64",
        f"# comment\n\nkey-a={secret[:-8]}\n": "line 3: the key of 'key-a' is not 32 bytes",
        f"key-a={secret}\nkey-a={secret}\n": "line 2: key id 'key-a' is given twice",
        f"{key_line('key-a')}\n{key_line('key-b')}\n": "holds 2 keys: set "
                                                      "TIDEMARK_CODEC_KEY_ID",
    }
    for text, said in cases.items():
        f.write_text(text)
        with pytest.raises(ConfigError) as e:
            file_keys(str(f), None)
        assert said in str(e.value) and secret not in str(e.value), (text, str(e.value))
    key_file(f, "key-a", "key-b")
    assert file_keys(str(f), "key-b").current() == ("key-b", KEYS["key-b"])
    with pytest.raises(ConfigError, match="TIDEMARK_CODEC_KEY_ID is 'key-c', which"):
        file_keys(str(f), "key-c")
    with pytest.raises(ConfigError, match="no such file"):
        file_keys(str(tmp_path / "absent"), None)
    assert secret not in repr(file_keys(str(f), "key-a"))
    assert parse_keys(f"# rotated in 2026-12\n {key_line('key-b')} \n", "x") == {
        "key-b": KEYS["key-b"]}


def test_every_client_and_worker_connects_with_the_codec(tmp_path: Path) -> None:
    """``temporal_connect()`` is what the worker, the commands, TidemarkClient and the demo use."""
    keys = key_file(tmp_path / "keys", "key-a", "key-b")
    env = {"TIDEMARK_CODEC_KEYS_FILE": str(keys), "TIDEMARK_CODEC_KEY_ID": "key-b"}
    converter = load_settings(env).temporal_connect()["data_converter"]
    codec = converter.payload_codec
    assert codec is not None and codec.source.current() == ("key-b", KEYS["key-b"])
    assert converter.failure_converter._encode_common_attributes is True  # messages too
    # Without keys: nothing encrypted, and an encrypted payload refused in one line.
    plain = load_settings({}).temporal_connect()["data_converter"]
    assert plain.payload_codec.source is None
    assert plain.failure_converter._encode_common_attributes is False  # as before the codec
    with pytest.raises(ConfigError, match="TIDEMARK_CODEC_KEY_ID is set but"):
        load_settings({"TIDEMARK_CODEC_KEY_ID": "key-a"}).temporal_connect()
    with pytest.raises(ConfigError, match="TIDEMARK_CODEC_KEYS_FILE: cannot read"):
        load_settings({"TIDEMARK_CODEC_KEYS_FILE": str(tmp_path / "gone")}).temporal_connect()


def test_the_connect_paths_all_go_through_the_settings() -> None:
    """No client of the product connects but through ``Settings.temporal_connect()``."""
    direct = []
    for path in [ROOT / "worker.py", *(ROOT / "tools").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "connect" and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "Client":
                starred = [k for k in node.keywords if k.arg is None]
                if not starred:
                    direct.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert direct == []


# -- the codec server --------------------------------------------------------------------------

@pytest.fixture
def codec_server() -> Iterator[CodecServer]:
    with CodecServer(ROTATED, port=0, origins=["http://127.0.0.1:8233"]) as server:
        yield server


def parsed(body: bytes) -> list[Payload]:
    return list(json_format.Parse(body, Payloads()).payloads)


def post(url: str, body: bytes, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


async def test_the_codec_server_decodes_and_encodes_as_temporals_protocol(
        codec_server: CodecServer) -> None:
    assert codec_server.host == "127.0.0.1"
    old = await data_converter(A).encode([MARKER])
    clear = await DataConverter.default.encode(["in clear"])
    status, headers, body = post(f"{codec_server.url}/decode", payloads_json([*old, *clear]),
                                 Origin="http://127.0.0.1:8233")
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8233"
    assert await DataConverter.default.decode(parsed(body)) == [MARKER, "in clear"]
    status, _, body = post(f"{codec_server.url}/encode", payloads_json(clear))
    assert status == 200 and parsed(body)[0].metadata[KEY_ID_META] == b"key-b"
    assert await data_converter(ROTATED).decode(parsed(body)) == ["in clear"]
    # Another origin gets no CORS grant; a key the server lacks is one line naming it.
    _, headers, _ = post(f"{codec_server.url}/decode", payloads_json(clear),
                         Origin="http://evil.example")
    assert "Access-Control-Allow-Origin" not in headers
    unknown = await data_converter(FileKeys("key-z", {"key-z": bytes(32)})).encode(["x"])
    status, _, body = post(f"{codec_server.url}/decode", payloads_json(unknown))
    assert status == 400 and b"'key-z'" in body and body.count(b"\n") == 1
    assert post(f"{codec_server.url}/nothing", payloads_json(clear))[0] == 404


def test_the_web_uis_preflight_is_answered_for_its_origin(codec_server: CodecServer) -> None:
    request = urllib.request.Request(f"{codec_server.url}/decode", method="OPTIONS", headers={
        "Origin": "http://127.0.0.1:8233", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-namespace"})
    with urllib.request.urlopen(request, timeout=5) as r:
        assert r.status == 200
        assert "x-namespace" in r.headers["Access-Control-Allow-Headers"]
        assert "POST" in r.headers["Access-Control-Allow-Methods"]


async def test_with_a_token_only_its_bearer_reads_a_payload() -> None:
    sealed = await data_converter(A).encode([MARKER])
    with CodecServer(A, port=0, token="t0ken") as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "t0ken"}):
            status, _, body = post(f"{server.url}/decode", payloads_json(sealed), **headers)
            assert status == 401 and MARKER.encode() not in body
        status, _, body = post(f"{server.url}/decode", payloads_json(sealed),
                               Authorization="Bearer t0ken")
        assert status == 200


def test_codec_server_and_codec_key_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TIDEMARK_CODEC_KEYS_FILE", raising=False)
    assert main(["codec-server", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TIDEMARK_CODEC_KEYS_FILE is unset" in err
    monkeypatch.setenv("TIDEMARK_CODEC_KEYS_FILE", str(tmp_path / "nope"))
    assert main(["codec-server", "--port", "0"]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["codec-key", "key-2027"]) == 0
    line = capsys.readouterr().out.strip()
    assert list(parse_keys(line, "x")) == ["key-2027"]


def test_a_worker_with_a_bad_key_file_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    """Before anything connects: a key that does not read is a line, never a key in a log."""
    secret = key_line("key-a").partition("=")[2]
    keys = tmp_path / "keys"
    keys.write_text(f"key-a={secret}\n")
    keys.chmod(0o600)
    env = {"PATH": os.environ["PATH"], "TIDEMARK_CODEC_KEYS_FILE": str(keys),
           "TIDEMARK_CODEC_KEY_ID": "key-b", "TIDEMARK_LOG_LEVEL": "INFO",
           "TEMPORAL_CONFIG_FILE": os.environ["TEMPORAL_CONFIG_FILE"],
           "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(ROOT / "worker.py")], env=env,
                          capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "cannot start: TIDEMARK_CODEC_KEY_ID is 'key-b', which TIDEMARK_CODEC_KEYS_FILE" \
        in lines[0] and secret not in done.stderr + done.stdout


async def test_a_failures_message_is_encrypted_with_its_details() -> None:
    """A provider's refusal can quote a recipient: with keys, no part of it stays in clear."""
    from temporalio.api.failure.v1 import Failure
    from temporalio.exceptions import ApplicationError

    failure = Failure()
    error = ApplicationError(f"550 no mailbox {MARKER}@example.com", {"to": MARKER},
                             type="Refused")
    await data_converter(A).encode_failure(error, failure)
    assert MARKER.encode() not in failure.SerializeToString()
    back = await data_converter(A).decode_failure(failure)
    assert isinstance(back, ApplicationError) and MARKER in back.message
    assert back.type == "Refused"  # the type stays readable: the workflow decides by it


def test_tidemark_codec_server_serves_until_ctrl_c(tmp_path: Path) -> None:
    keys = key_file(tmp_path / "keys", "key-a")
    (tmp_path / "token").write_text("t0ken\n")
    env = {**os.environ, "TIDEMARK_CODEC_KEYS_FILE": str(keys),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli.main", "codec-server", "--port",
                             "0", "--token-file", str(tmp_path / "token")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "bearer token required" in line and "keys key-a" in line, line
        url = line.split()[3]
        assert url.startswith("http://127.0.0.1:")
        sealed = asyncio.run(data_converter(A).encode([MARKER]))
        assert post(f"{url}/decode", payloads_json(sealed))[0] == 401
        status, _, body = post(f"{url}/decode", payloads_json(sealed),
                               Authorization="Bearer t0ken")
        assert status == 200 and MARKER.encode() in b"".join(p.data for p in parsed(body))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
