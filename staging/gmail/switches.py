"""The undocumented behaviours of Gmail's drafts.send, each a switch.

The emulator can show each at its worst. Each is a switch (staging.core.Switch) whose comment
cites what Google documents."""

from __future__ import annotations

from staging.core import Switch

# Google's reference for users.drafts.send says only "Sends the specified, existing draft to the
# recipients in the To, Cc, and Bcc headers" (developers.google.com/workspace/gmail/api/
# reference/rest/v1/users.drafts/send). That a sent draft is gone, that two sends of one draft
# send it once, and what the second one gets, are all undocumented: the switches below show the
# worst of each.
CONCURRENT_DRAFT_SEND = Switch(
    "concurrent_draft_send", default="once", worst="both", choices=("once", "both"),
    doc="What two drafts.send of one draft that overlap in time do. Undocumented: the "
        "reference (users.drafts/send) says only that it sends the specified, existing draft. "
        "'once': the draft is looked up and consumed in one step when the send does its work, "
        "so the later one finds nothing. 'both': each send takes the draft as it was when the "
        "request arrived, and every one that arrived while the draft existed goes out.")
GONE_DRAFT_STATUS = Switch(
    "gone_draft_send_status", default=404, worst=400, choices=(404, 400, 500),
    doc="The status drafts.send answers for a draft that a send already consumed. "
        "Undocumented (users.drafts/send lists no errors); 404 NOT_FOUND is what Google's "
        "error model suggests for a missing resource (cloud.google.com/apis/design/errors), "
        "400 FAILED_PRECONDITION or INVALID_ARGUMENT, or a 500, are as plausible.")

# users.history.list, startHistoryId: "A historyId is typically valid for at least a week, but in
# some rare circumstances may be valid for only a few hours. If you receive an HTTP 404 error
# response, your application should perform a full sync." (developers.google.com/workspace/
# gmail/api/reference/rest/v1/users.history/list)
HISTORY_KEPT = Switch(
    "history_kept_s", default=7 * 24 * 3600, worst=2 * 3600,
    doc="Seconds Gmail keeps a mailbox's history records: history.list from a startHistoryId "
        "older than the oldest kept change answers 404. users.history.list: a historyId is "
        "typically valid for at least a week, in rare circumstances only a few hours (two "
        "here); on a 404 a client performs a full sync.")
