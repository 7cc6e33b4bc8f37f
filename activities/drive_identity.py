"""Whether the read token sees the stamps the write token writes: a Drive check at worker start.

Drive's ``appProperties`` are private to the app that set them ("To add properties restricted
to your app, use the appProperties field", Drive API: Add custom file properties). The probe
tells our rename from anyone's by the key stamped there, so a read token issued to another
OAuth client than the write token sees no stamp at all: *done* is never reached, every undo is
refused, and a file whose old name is still shown reads *absent* and is renamed again over a
person's change. Both tokens naming the same Drive user (``check_identity``) does not prove it.

So at start the write token stamps a scratch file of its own, and the read token must read the
same value back. The file is made once (``files.create``, named IDENTITY_FILE) and then only
read: a worker that starts again finds its stamp there and writes nothing, so restarts add no
write to the Drive.
"""

from __future__ import annotations

import uuid
from typing import Any

from probes.drive import drive_error
from probes.google_http import CLIENT_ERRORS, files_of, read
from tidemark.errors import ConfigError

IDENTITY_FILE = ".tidemark identity check"  # the scratch file's name in the user's Drive
IDENTITY_PROPERTY = "tidemark_identity"  # the appProperties key the write token stamps
CREDENTIALS = "TIDEMARK_DRIVE_WRITE_TOKEN and TIDEMARK_DRIVE_READ_TOKEN"


def check_stamp_visible(writer: Any, reader: Any) -> str:
    """The scratch file's id, once the read token has read the write token's stamp on it.

    Raises:
        ConfigError: a call failed, or the read token does not see the stamp (one line).
    """
    try:
        file_id, stamp = _stamped(writer)
        # Listed, not got by id: what a worker's start reads stays apart from what a step
        # reads (`files.get`), in the target's logs and its faults.
        listed = read(files_of(reader).list(q=f"name = '{IDENTITY_FILE}' and trashed = false",
                                            fields="files(id,appProperties)", pageSize=10))
    except CLIENT_ERRORS as e:
        raise ConfigError(f"drive: cannot check that the read token sees our stamps: "
                          f"{drive_error(e, 'drive identity check')}") from None
    seen: dict[str, Any] = next(
        (f for f in listed.get("files") or [] if f.get("id") == file_id), {})
    if (seen.get("appProperties") or {}).get(IDENTITY_PROPERTY) != stamp:
        raise ConfigError(
            f"drive: the read token does not see the appProperties the write token stamps "
            f"(file {file_id!r}, {IDENTITY_FILE!r}): appProperties are private to the OAuth "
            f"client that wrote them, so the probe would never find our key. Issue both tokens "
            f"from the same OAuth client ({CREDENTIALS})")
    return file_id


def _stamped(writer: Any) -> tuple[str, str]:
    """The scratch file and the stamp the write token sees on it, made if missing."""
    files = files_of(writer)
    found = read(files.list(q=f"name = '{IDENTITY_FILE}' and trashed = false",
                            fields="files(id,appProperties)", pageSize=1))
    listed = (found.get("files") or [None])[0]
    stamp = ((listed or {}).get("appProperties") or {}).get(IDENTITY_PROPERTY)
    if listed is not None and stamp:
        return str(listed["id"]), str(stamp)
    stamp = uuid.uuid4().hex
    props = {"appProperties": {IDENTITY_PROPERTY: stamp}}
    if listed is None:
        made = files.create(body={"name": IDENTITY_FILE, "mimeType": "text/plain", **props},
                            fields="id").execute(num_retries=0)
        return str(made["id"]), stamp
    files.update(fileId=listed["id"], body=props, fields="id").execute(num_retries=0)
    return str(listed["id"]), stamp
