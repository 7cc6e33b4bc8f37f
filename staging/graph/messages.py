"""Graph's message and folder routes.

The profile, listing and reading messages (the probe's view), moving a message, and the mail
folders."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from staging.core import Reply
from staging.graph.mailboxes import PROFILE_SCOPES, READ_SCOPES, WRITE_SCOPES, MailboxTarget
from staging.graph.odata import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    int_option,
    message_view,
    parse_expand,
    parse_filter,
    parse_select,
)
from staging.graph.payloads import ci
from staging.graph.store import HIDDEN, Folder, Mailbox, folder_view, newest_first


class MessageRoutes(MailboxTarget):
    """The handlers of ``/me`` and ``/users/{user}`` for reading and moving mail."""

    async def _h_me(self, request: web.Request) -> web.Response:
        box = self._caller(request, *PROFILE_SCOPES)
        fault = await self.before_write(request, "me.get")
        out = {"@odata.context": "https://graph.microsoft.com/v1.0/$metadata#users/$entity",
               **box.me()}
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_api_move(self, request: web.Request) -> web.Response:
        box = self._caller(request, *WRITE_SCOPES)
        body = await self._json_body(request)
        destination = ci(body).get("destinationid")
        if not isinstance(destination, str) or box.folder(destination) is None:
            raise Reply(self.error(400, "ErrorInvalidIdMalformed", "Id is malformed."))
        try:
            new_id = self.move(request.match_info["id"], destination, box.account)
        except KeyError:
            raise self._not_found() from None
        except ValueError:
            raise Reply(self.error(400, "ErrorMoveCopyFailed",
                                   "The item cannot be moved while it is being sent.")) from None
        with self._lock:
            hit = box.find(new_id)
            assert hit is not None
            out = message_view(hit[1], None, (False, None))
        return web.json_response(out, status=201)

    async def _h_folders(self, request: web.Request) -> web.Response:
        box = self._caller(request, *READ_SCOPES)
        with self._lock:
            value = [folder_view(f) for f in box.folders.values() if f.name not in HIDDEN]
        return web.json_response({"value": value})

    async def _h_folder(self, request: web.Request) -> web.Response:
        box = self._caller(request, *READ_SCOPES)
        with self._lock:
            f = box.folder(request.match_info["folder"])
            if f is None:
                raise Reply(self.error(404, "ErrorFolderNotFound",
                                       "The specified folder could not be found in the store."))
            return web.json_response(folder_view(f))

    async def _h_create_folder(self, request: web.Request) -> web.Response:
        box = self._caller(request, *WRITE_SCOPES)
        name = ci(await self._json_body(request)).get("displayname")
        if not isinstance(name, str) or not name.strip():
            raise Reply(self.error(400, "ErrorInvalidRequest", "displayName is required."))
        try:
            f = self.create_folder(name, box.account)
        except ValueError:
            raise Reply(self.error(409, "ErrorFolderExists",
                                   "A folder with the specified name already exists.")) from None
        return web.json_response(folder_view(f), status=201)

    async def _h_list(self, request: web.Request) -> web.Response:
        box = self._caller(request, *READ_SCOPES)
        wanted = request.match_info.get("folder")
        folder = self._folder_of(box, wanted) if wanted else None
        q = request.query
        keep = parse_filter(self, q.get("$filter"))
        expand = parse_expand(self, q.get("$expand"))
        select = parse_select(self, q.get("$select"))
        top = int_option(self, q, "$top", DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        skip = int_option(self, q, "$skip", 0, 1 << 31)
        fault = await self.before_write(request, "messages.list")
        self._settle(box)
        with self._lock:
            folders = [folder] if folder is not None else [
                f for f in box.folders.values() if f.name not in HIDDEN]
            found = [m for m in newest_first(m for f in folders for m in f.messages.values())
                     if keep(m)]
            page = found[skip:skip + top]
            value = [message_view(m, select, expand) for m in page]
        where = f"/mailFolders('{wanted}')" if wanted else ""
        out: dict[str, Any] = {
            "@odata.context": f"https://graph.microsoft.com/v1.0/$metadata#users('{box.address}')"
                              f"{where}/messages",
            "value": value}
        if skip + top < len(found):
            nxt = request.url.update_query({"$skip": str(skip + top)})
            out["@odata.nextLink"] = str(nxt)
        self.after_commit(request, fault)
        return web.json_response(out)

    async def _h_get(self, request: web.Request) -> web.Response:
        box = self._caller(request, *READ_SCOPES)
        wanted = request.match_info.get("folder")
        folder = self._folder_of(box, wanted) if wanted else None
        select = parse_select(self, request.query.get("$select"))
        expand = parse_expand(self, request.query.get("$expand"))
        fault = await self.before_write(request, "messages.get")
        self._settle(box)
        with self._lock:
            hit = box.find(request.match_info["id"])
            if hit is None or (folder is not None and hit[0] is not folder):
                raise self._not_found()
            out = message_view(hit[1], select, expand)
        self.after_commit(request, fault)
        return web.json_response(out)

    def _folder_of(self, box: Mailbox, name: str) -> Folder:
        f = box.folder(name)
        if f is None:
            raise Reply(self.error(400, "ErrorInvalidIdMalformed", "Id is malformed."))
        return f
