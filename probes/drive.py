"""Read-only side of ``drive.rename``: preconditions, snapshot and probe.

The probe never matches on a filename alone: a file counts as renamed by this step only when its
name is the target AND its ``appProperties`` carry this step's key, stamped in the same update
that changed the name. Everything here runs with a read-only client
(``drive.metadata.readonly`` is enough).
"""

from __future__ import annotations

import json
from typing import Any

from googleapiclient.errors import HttpError

from probes.google_http import CLIENT_ERRORS, files_of, google_error, read
from tidemark.actions import GateRefused, ProbeResult, StepContext
from tidemark.errors import ActionError, Refused, TargetUnavailable

STAMP = "tidemark_key"  # the appProperties key that carries a step's idempotency key
READ_FIELDS = "id,name,appProperties,trashed"

# Drive's 403 reasons that speak of one file, not of the credential: the user's role on the file
# does not allow the change (insufficientFilePermissions), a drive.file app was never granted
# the file (appNotAuthorizedToFile), or the file itself cannot be changed (cannotModifyFile).
# The same token still works on every other file, so the step is refused (it fails; the task
# ends failed there) instead of stopping the task as a revoked grant would. Every other 403
# (insufficientPermissions: a scope the token lacks; domainPolicy; …) is about the credential.
FILE_REFUSALS = frozenset({"insufficientFilePermissions", "appNotAuthorizedToFile",
                           "cannotModifyFile"})


def drive_error(e: BaseException, what: str) -> ActionError:
    """``google_error``, except that some 403s are ``Refused``.

    A 403 whose every reason is in ``FILE_REFUSALS`` is ``Refused``: Drive changed nothing, and
    another attempt with this credential cannot pass. A 401, and a 403 naming anything else (a
    missing scope, a revoked grant), stay ``Unauthorized``."""
    if isinstance(e, HttpError) and e.status_code == 403:
        reasons = error_reasons(e)
        if reasons and reasons <= FILE_REFUSALS:
            return Refused(f"{what}: HTTP 403 ({', '.join(sorted(reasons))}): Drive refuses "
                           "this change to this file for this user; share the file with the "
                           "user as an editor (or grant the app the file) and run a new task")
    return google_error(e, what)


def error_reasons(e: HttpError) -> set[str]:
    """The ``reason`` of each entry in a Google error body's ``error.errors`` list."""
    try:
        items = json.loads(e.content)["error"]["errors"]
        return {str(i.get("reason")) for i in items if isinstance(i, dict)}
    except (ValueError, KeyError, TypeError):
        return set()


class DriveRenameProbe:
    """Preconditions, snapshot and probe of ``drive.rename``, over a read-only Drive client.

    Args:
        reader: A Drive v3 service (``googleapiclient.discovery.build``) whose credential has a
            read scope only.
    """

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def read(self, file_id: str) -> dict[str, Any] | None:
        """The file's id, name, appProperties and trashed flag; None if Drive answers 404.

        Raises:
            Unauthorized, TargetUnavailable, Refused: the read itself failed.
        """
        try:
            return read(files_of(self.reader).get(fileId=file_id, fields=READ_FIELDS))
        except HttpError as e:
            if e.status_code == 404:
                return None
            raise drive_error(e, f"drive files.get {file_id}") from e
        except CLIENT_ERRORS as e:
            raise drive_error(e, f"drive files.get {file_id}") from e

    def preconditions(self, ctx: StepContext) -> None:
        file_id = ctx.args["file_id"]
        try:
            f = self.read(file_id)
        except Refused as e:  # a 403 about this file: refused before any intent
            raise GateRefused(str(e)) from e
        if f is None:
            raise GateRefused(f"Drive file {file_id} does not exist (or is not visible to us)")
        if f.get("trashed"):
            raise GateRefused(f"Drive file {file_id} ({f.get('name')!r}) is in the trash")

    def snapshot(self, ctx: StepContext) -> dict[str, Any]:
        file_id = ctx.args["file_id"]
        f = self.read(file_id)
        if f is None:
            raise Refused(f"drive file {file_id} vanished between the gate and the snapshot")
        return {"file_id": file_id, "name": f.get("name"),
                "app_properties": dict(f.get("appProperties") or {})}

    def probe(self, ctx: StepContext) -> ProbeResult:
        """Tells whether the rename is done, absent or unknown on Drive.

        ``done`` only for the target name with our stamp, outside the trash. ``absent`` only
        when both the name and the stamp are still those before_state recorded. ``unknown``
        (with what was seen) otherwise, a trashed file and one we can no longer read included.
        The old name under another writer's stamp may be a rename back made after ours landed,
        and acting again would overwrite it.

        Raises:
            Unauthorized: the read credential was rejected; a person must restore it.
        """
        file_id, target = ctx.args["file_id"], ctx.args["name"]
        try:
            f = self.read(file_id)
        except (TargetUnavailable, Refused) as e:
            return ProbeResult.unknown(f"could not read the file: {e}")
        if f is None:
            return ProbeResult.unknown(f"file {file_id} no longer exists (deleted, or no longer "
                                       "shared with us)")
        name = f.get("name")
        stamp = (f.get("appProperties") or {}).get(STAMP)
        observed = {"file_id": file_id, "name": name, "tidemark_key": stamp,
                    "trashed": bool(f.get("trashed"))}
        before = ctx.before_state or {}
        before_stamp = (before.get("app_properties") or {}).get(STAMP)
        ours = stamp == ctx.key
        if observed["trashed"]:
            # Our name and stamp may still be on it, but a file in the trash is not the end
            # state the plan wanted, and whoever trashed it has not said why: a person decides.
            return ProbeResult.unknown(f"file {file_id} ({name!r}) is in the trash", observed)
        if ours and name == target:
            return ProbeResult.done(observed, "named as intended and stamped with our key")
        if ours:
            return ProbeResult.unknown(
                f"our rename to {target!r} was applied, but the file is now named {name!r}: "
                "renamed by someone else since", observed)
        if "name" in before and name == before["name"] and stamp == before_stamp:
            return ProbeResult.absent(f"still named {name!r} and stamped {stamp!r} as before",
                                      observed)
        if "name" in before and name == before["name"]:
            # The old name under another stamp: someone renamed it back under their own key
            # (perhaps after our rename landed), or changed the stamp. Acting would overwrite
            # their change; whether ours ever landed cannot be told from here.
            return ProbeResult.unknown(
                f"named {name!r} as before, but stamped {stamp!r} where before_state has "
                f"{before_stamp!r}: another writer changed it since (perhaps renamed it back "
                "after our rename)", observed)
        if name == target:
            return ProbeResult.unknown(
                f"named {target!r} but not by us (stamp {stamp!r}, ours {ctx.key}): "
                "someone else renamed it", observed)
        return ProbeResult.unknown(
            f"renamed to {name!r} by someone else (was {before.get('name')!r}, we wanted "
            f"{target!r}; no stamp of ours)", observed)
