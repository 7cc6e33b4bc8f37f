"""``drive.rename`` {file_id, name}: give a Drive file a name, stamped with the step's key.

Reversible and an end state. The one ``files.update`` both renames the file and writes
``appProperties.tidemark_key = <key>``, so the probe can tell our rename from anyone else's.
Compensation puts the before_state name (and stamp) back, but only while the file is still as we
left it.

Clients come from ``drive_client``: the real google-api-python-client over a transport that
sends every request exactly once and gives up after a timeout (see ``probes.google_http``), so a
lost answer surfaces as ``TargetUnavailable`` and the journal, not the library, decides what
happens next. ``execute_async`` sends the very same request on the event loop
(``probes.google_async``), so a rename waiting on Drive holds no thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from googleapiclient.discovery import Resource
from googleapiclient.http import HttpRequest

from activities.drive_identity import check_stamp_visible
from probes.drive import STAMP, DriveRenameProbe, drive_error
from probes.google_async import execute_async
from probes.google_http import (
    CLIENT_ERRORS,
    DEFAULT_TIMEOUT_S,
    files_of,
    google_service,
    read,
)
from tidemark.actions import Action, Arg, ProbeResult, StepContext, nonempty_str
from tidemark.errors import ActionError, ConfigError, Refused
from tidemark.wire import effect

CREDENTIALS = "TIDEMARK_DRIVE_WRITE_TOKEN and TIDEMARK_DRIVE_READ_TOKEN"


# Drive has no idempotency key, and nothing in its documentation bounds how long a request that
# our client gave up on may still be applied. A rename that lands late is the same end state,
# but a probe that says *absent* before it lands lets the step rename again: two writes, and a
# rename back by a third party in between would be overwritten. So after an ambiguous failure
# the step waits this long before it trusts *absent* (TIDEMARK_DRIVE_HORIZON_S): a minute,
# a judgment (Google publishes no bound), to be raised where a deployment sees slower commits.
DEFAULT_HORIZON_S = 60.0


def drive_client(base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> Resource:
    """A Drive v3 service for ``base_url``, authorised with the bearer ``token``.

    ``base_url`` is ``https://www.googleapis.com`` or a staging server's URL; see
    ``probes.google_http``."""
    return google_service("drive", "v3", base_url, token, endpoint="/drive/v3/",
                          timeout=timeout)


class DriveRename(Action):
    """Renames a Drive file by id and stamps the step's key into its appProperties.

    Args:
        writer: Drive service with a write scope (``auth/drive`` or ``auth/drive.file``).
        reader: Drive service with a read-only scope, for the probe, snapshot and gates.
    """

    name = "drive.rename"
    irreversible = False
    awaits = True
    # No idempotency key: a rename that leaves late lands over whatever happened since.
    marks_sends = True
    args: ClassVar[dict[str, Arg]] = {
        "file_id": Arg(str, check=nonempty_str),
        # Drive accepts any non-empty name, slashes included.
        "name": Arg(str, check=nonempty_str),
    }

    def __init__(self, writer: Any, reader: Any, *, timeout: float = DEFAULT_TIMEOUT_S,
                 horizon_s: float = DEFAULT_HORIZON_S) -> None:
        """Sets the clients' timeout and Drive's horizon.

        Args:
            timeout: the clients' timeout per request, in seconds; the step's deadline (the
                lease written before the call) is derived from it.
            horizon_s: how long after a request left us Drive may still apply it; after an
                ambiguous failure the probe's *absent* is not trusted before it has passed.
        """
        self.writer = writer
        self.reader = reader
        self.reads = DriveRenameProbe(reader)
        # Connecting and the answer can each take the full timeout; a margin for the rest.
        self.deadline_s = 2 * timeout + 5.0
        self.horizon_s = horizon_s

    def check_identity(self) -> dict[str, Any]:
        """Proves that both tokens act as the same Drive user.

        It reads ``about.get``: the user's ``permissionId``, and its ``emailAddress``. So the
        probe reads the Drive the action writes. It also proves that the read token sees the
        appProperties the write token stamps (activities/drive_identity.py: they are private to
        the OAuth client that wrote them).

        Returns:
            ``{"user": <email>, "permission_id": <id>}``.

        Raises:
            ConfigError: a token is rejected, the two name different users, or the read token
                does not see the write token's stamp.
        """
        write, read = self._whoami(self.writer, "write"), self._whoami(self.reader, "read")
        if (write.get("permissionId"), write.get("emailAddress")) != (
                read.get("permissionId"), read.get("emailAddress")):
            raise ConfigError(
                f"drive: the write token acts as {_who(write)} but the read token reads as "
                f"{_who(read)}; the probe would read another user's Drive and find nothing of "
                f"ours. Issue both tokens for the same Google account ({CREDENTIALS})")
        check_stamp_visible(self.writer, self.reader)
        return {"user": write.get("emailAddress"), "permission_id": write.get("permissionId")}

    @staticmethod
    def _whoami(client: Any, which: str) -> dict[str, Any]:
        try:
            about = read(client.about().get(fields="user(permissionId,emailAddress)"))
        except CLIENT_ERRORS as e:
            failure: ActionError = drive_error(e, "drive about.get")
            raise ConfigError(f"drive: cannot tell whose Drive the {which} token reaches: "
                              f"{failure}") from None
        user = about.get("user") or {}
        if not user.get("permissionId"):
            raise ConfigError(f"drive: about.get with the {which} token names no user")
        return user

    @classmethod
    def describe(cls, args: dict[str, Any]) -> str:
        return f"{args.get('file_id')} -> {args.get('name')}"

    @classmethod
    def target(cls, args: dict[str, Any]) -> str | None:
        return str(args["file_id"])

    def preconditions(self, ctx: StepContext) -> None:
        self.reads.preconditions(ctx)

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        return self.reads.snapshot(ctx)

    def probe(self, ctx: StepContext) -> ProbeResult:
        return self.reads.probe(ctx)

    def execute(self, ctx: StepContext) -> dict[str, Any]:
        file_id = ctx.args["file_id"]
        f = self._update(file_id, self._renamed(ctx))
        return _outcome(file_id, f)

    async def execute_async(self, ctx: StepContext) -> dict[str, Any]:
        file_id = ctx.args["file_id"]
        with _update_errors(file_id), effect():
            f = await execute_async(self._update_request(file_id, self._renamed(ctx)))
        return _outcome(file_id, f)

    @staticmethod
    def _renamed(ctx: StepContext) -> dict[str, Any]:
        """The update of a step: the target name, stamped with the step's key."""
        return {"name": ctx.args["name"], "appProperties": {STAMP: ctx.key}}

    def compensate(self, ctx: StepContext) -> dict[str, Any]:
        """Restores the before_state name and stamp, if the file is still as this step left it.

        Raises:
            Refused: the file changed since (renamed, re-stamped, trashed or deleted by
                someone else); restoring would overwrite their change.
        """
        file_id, target = ctx.args["file_id"], ctx.args["name"]
        before = ctx.before_state or {}
        if "name" not in before:
            raise Refused(f"drive file {file_id}: no before_state name to restore")
        old_stamp = (before.get("app_properties") or {}).get(STAMP)
        f = self.reads.read(file_id)
        if f is None:
            raise Refused(f"drive file {file_id} no longer exists; nothing to restore")
        name, stamp = f.get("name"), (f.get("appProperties") or {}).get(STAMP)
        if f.get("trashed"):
            raise Refused(f"drive file {file_id} ({name!r}) is in the trash; someone put it "
                          "there, so it is not renamed back")
        if name == before["name"] and stamp == old_stamp:
            # Already restored (an earlier attempt of this compensation got through).
            return {"file_id": file_id, "name": name, "tidemark_key": stamp}
        if name != target or stamp != ctx.key:
            raise Refused(f"drive file {file_id} is no longer as this step left it (named "
                          f"{name!r}, stamp {stamp!r}; we left {target!r}, {ctx.key}): "
                          "someone else changed it, so it is not put back")
        restored = self._update(file_id, {"name": before["name"],
                                          "appProperties": {STAMP: old_stamp}})
        return _outcome(file_id, restored)

    def _update(self, file_id: str, body: dict[str, Any]) -> dict[str, Any]:
        with _update_errors(file_id), effect():
            updated: dict[str, Any] = self._update_request(file_id, body).execute(num_retries=0)
            return updated

    def _update_request(self, file_id: str, body: dict[str, Any]) -> HttpRequest:
        """The ``files.update``, built and not sent (building it sends nothing)."""
        return files_of(self.writer).update(fileId=file_id, body=body,
                                            fields="id,name,appProperties")


@contextmanager
def _update_errors(file_id: str) -> Iterator[None]:
    """What a failed ``files.update`` raises: drive_error's mapping of the client's error."""
    try:
        yield
    except CLIENT_ERRORS as e:
        raise drive_error(e, f"drive files.update {file_id}") from e


def _outcome(file_id: str, f: dict[str, Any]) -> dict[str, Any]:
    """A step's outcome: the file as Drive answered the update."""
    return {"file_id": file_id, "name": f.get("name"),
            "tidemark_key": (f.get("appProperties") or {}).get(STAMP)}


def _who(user: dict[str, Any]) -> str:
    return f"{user.get('emailAddress') or '(no address)'} (permissionId {user.get('permissionId')})"
