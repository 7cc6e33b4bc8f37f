"""Payloads encrypted in Temporal's history: AES-GCM under keys named by id.

Every payload a client or worker sends to Temporal (a plan, an activity's input and result, a
signal, an update, a query's answer, a memo, a run's summary and details, a failure's message)
goes through ``EncryptionCodec``. It encrypts the payload whole under the current key and says
which key in its metadata (``encryption-key-id``; encoding ``binary/encrypted``), as Temporal's
encryption sample does (samples-python ``encryption/codec.py``: a 12-byte nonce, then the
ciphertext and its tag; no associated data), so its codec servers in other languages can read
ours. Search attributes are not payloads of the codec: Temporal indexes them in clear, and the
workflows set only ids and state words there (tests/test_codec_history.py holds them to it).

Keys rotate: every key of the source decrypts, only the current one encrypts. A payload that is
not ``binary/encrypted`` passes through, so histories written before the codec was on still
replay. A payload under a key id the source does not hold is ``UnknownKey``, naming the id.

The keys come from a ``KeySource``: ``FileKeys`` (TIDEMARK_CODEC_KEYS_FILE) today; a KMS can
stand in by implementing the two methods of the protocol. Key bytes are never in a repr, a log
line or an error message.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)

from tidemark.errors import ConfigError
from tidemark.secret_files import unreadable
from tidemark.settings import ENV_CODEC_KEY_ID, ENV_CODEC_KEYS_FILE

ENCODING = b"binary/encrypted"
KEY_ID_META = "encryption-key-id"
# AES-256: the key file holds 32 random bytes per id, base64.
KEY_BYTES = 32
# GCM's standard nonce; random per payload. 2^32 payloads under one key keep the chance of a
# repeated nonce below 2^-32 (NIST SP 800-38D, 8.3): rotate well before that.
NONCE_BYTES = 12
KEY_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
ENV_KEYS_FILE = ENV_CODEC_KEYS_FILE
ENV_KEY_ID = ENV_CODEC_KEY_ID


class UnknownKey(ConfigError):
    """A payload is encrypted under a key id this process does not hold."""


class KeySource(Protocol):
    """Where the codec's keys come from: a file today, a KMS later.

    ``current`` names the key new payloads are encrypted with and returns its bytes; ``key``
    returns the bytes of any key id that may have encrypted a payload still in a history (the
    current one and those rotated out), or None. Both are called for every payload: a source
    backed by a KMS unwraps its data keys once and keeps them in memory.
    """

    def current(self) -> tuple[str, bytes]: ...

    def key(self, key_id: str) -> bytes | None: ...


@dataclass(frozen=True)
class FileKeys:
    """The keys of a key file, one ``ID=BASE64`` line each, and the id that encrypts."""

    current_id: str
    keys: Mapping[str, bytes] = field(repr=False)
    path: str = ""

    def current(self) -> tuple[str, bytes]:
        return self.current_id, self.keys[self.current_id]

    def key(self, key_id: str) -> bytes | None:
        return self.keys.get(key_id)


def new_key() -> str:
    """A fresh key, base64, as a key file holds it."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def parse_keys(text: str, where: str) -> dict[str, bytes]:
    """The keys of a key file's text.

    Lines are ``ID=BASE64`` (32 bytes); blank lines and ``#`` comments are skipped. A bad line
    is a ConfigError naming its number, never its content."""
    keys: dict[str, bytes] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key_id, sep, encoded = (part.strip() for part in line.partition("="))
        if not sep or not KEY_ID_PATTERN.fullmatch(key_id):
            raise ConfigError(f"{where} line {number}: not ID=BASE64 (an id of letters, digits,"
                              " '.', '_' or '-', at most 64)")
        try:
            key = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            key = b""
        if len(key) != KEY_BYTES:
            raise ConfigError(f"{where} line {number}: the key of {key_id!r} is not "
                              f"{KEY_BYTES} bytes in base64 (make one with `tidemark "
                              "codec-key`)")
        if key_id in keys:
            raise ConfigError(f"{where} line {number}: key id {key_id!r} is given twice")
        keys[key_id] = key
    return keys


def file_keys(path: str, current_id: str | None) -> FileKeys:
    """The keys of the file at ``path``, encrypting with ``current_id``.

    Without ``current_id``, a file of one key encrypts with it. A file that cannot be read, is
    empty, or lacks the current id is a ConfigError saying what to fix."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(unreadable(ENV_KEYS_FILE, path, e)) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{ENV_KEYS_FILE} {path} is not text: lines ID=BASE64") from None
    keys = parse_keys(text, f"{ENV_KEYS_FILE} {path}")
    if not keys:
        raise ConfigError(f"{ENV_KEYS_FILE} {path} holds no key: add a line ID=BASE64")
    if current_id is None:
        if len(keys) > 1:
            raise ConfigError(f"{ENV_KEYS_FILE} {path} holds {len(keys)} keys: set "
                              f"{ENV_KEY_ID} to the one that encrypts ({', '.join(keys)})")
        current_id = next(iter(keys))
    if current_id not in keys:
        raise ConfigError(f"{ENV_KEY_ID} is {current_id!r}, which {ENV_KEYS_FILE} {path} does "
                          f"not hold (it holds {', '.join(keys)})")
    return FileKeys(current_id, keys, path)


class EncryptionCodec(PayloadCodec):
    """Encrypts each payload under the source's current key; decrypts under any of its keys.

    Without a source (no key configured) it encrypts nothing and passes clear payloads through,
    and refuses an encrypted one with UnknownKey, so that a process lacking the keys says so in
    one line instead of failing on an unknown encoding."""

    def __init__(self, source: KeySource | None) -> None:
        super().__init__()
        self.source = source

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return encrypt(self.source, payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return decrypt(self.source, payloads)


def encrypt(source: KeySource | None, payloads: Sequence[Payload]) -> list[Payload]:
    """The payloads encrypted under ``source``'s current key (as they are without a source)."""
    if source is None:
        return list(payloads)
    key_id, key = source.current()
    cipher = AESGCM(key)
    sealed = []
    for p in payloads:
        nonce = os.urandom(NONCE_BYTES)
        sealed.append(Payload(
            metadata={"encoding": ENCODING, KEY_ID_META: key_id.encode()},
            data=nonce + cipher.encrypt(nonce, p.SerializeToString(), None)))
    return sealed


def decrypt(source: KeySource | None, payloads: Sequence[Payload]) -> list[Payload]:
    """The payloads decrypted; those not encrypted as they are.

    One under a key id ``source`` does not hold, or that its key does not open, is UnknownKey
    naming the id."""
    opened = []
    for p in payloads:
        if p.metadata.get("encoding") != ENCODING:
            opened.append(p)
            continue
        key_id = p.metadata.get(KEY_ID_META, b"").decode(errors="replace")
        key = source.key(key_id) if source is not None else None
        if key is None:
            held = (f"this process holds {', '.join(source_ids(source))}" if source is not None
                    else f"this process has no keys ({ENV_KEYS_FILE} is unset)")
            raise UnknownKey(f"a payload is encrypted under key id {key_id!r} and {held}: add "
                             f"that key to {ENV_KEYS_FILE} (keys rotated out stay in it)")
        try:
            clear = AESGCM(key).decrypt(p.data[:NONCE_BYTES], p.data[NONCE_BYTES:], None)
        except InvalidTag:
            raise UnknownKey(f"a payload under key id {key_id!r} does not decrypt with the key "
                             f"of that id in {ENV_KEYS_FILE}: the file holds another key under "
                             "the same id") from None
        opened.append(Payload.FromString(clear))
    return opened


def source_ids(source: KeySource) -> list[str]:
    """The key ids a source holds, where it can list them (for messages)."""
    keys = getattr(source, "keys", None)
    return list(keys) if isinstance(keys, Mapping) else [source.current()[0]]


def data_converter(source: KeySource | None) -> DataConverter:
    """Temporal's default converter with the codec, and failures' messages encoded too.

    With keys, a failure's message and stack trace are encrypted with its details (in clear
    they could quote a recipient: a provider's refusal does). Without keys they stay where
    Temporal puts them, as before the codec."""
    if source is None:
        return DataConverter(payload_codec=EncryptionCodec(None))
    return DataConverter(payload_codec=EncryptionCodec(source),
                         failure_converter_class=DefaultFailureConverterWithEncodedAttributes)
