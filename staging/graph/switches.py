"""The documented worst cases of Graph's send, each a switch.

The emulator can show each. Each is a switch (staging.core.Switch) whose comment cites what
Microsoft documents, or that it documents nothing."""

from __future__ import annotations

from staging.core import Switch

SWITCHES = (
    # "Send mail by using the Microsoft Graph API" (learn.microsoft.com/graph/
    # outlook-things-to-know-about-send-mail): the 202 comes once the message is saved in
    # Drafts (step 1); transport picks it up later (steps 2-3), and only then does the store
    # move it "from the Drafts folder to the Sent Items folder" (step 4). No bound is given
    # for that wait. While it lasts the message is in Drafts under its draft id, isDraft still
    # true, with mfSubmitted set in PR_MESSAGE_FLAGS. 0: the message leaves Drafts during the
    # request (for the Outbox, as before). The worst case is longer than Tidemark's confirm
    # wait (TIDEMARK_GRAPH_CONFIRM_S, 10 s by default).
    Switch("submitted_stays_in_drafts_s", default=0, worst=120,
           doc="Graph 'Send mail by using the Microsoft Graph API', steps 1-4: after the 202 "
               "a sent message stays in Drafts until transport moves it to Sent Items; "
               "no bound is documented. Seconds it stays (0: it leaves during the request)."),
    # The same article puts "notify transport" after the 202, and Microsoft documents no
    # PR_MESSAGE_FLAGS submit bit readable through Graph at any moment of that window: the
    # bit is an assumption. N > 0: a sent draft waiting in Drafts shows no mfSubmitted until
    # N seconds after the 202 (an unflagged window), a plain draft to any reader, while
    # Exchange already holds it as submitted (a second send of it is a second send, as
    # ``second_send`` says). No bound is documented (nor that the bit shows at all); the worst
    # position is 5 s: longer than a resumed attempt takes to probe after a lost 202, shorter
    # than the sender's own confirm wait (TIDEMARK_GRAPH_CONFIRM_S, 10 s), so that the window
    # meets the resume, where it is dangerous, while an answered send still confirms. Tests
    # set longer ones.
    Switch("submitted_flag_after_s", default=0, worst=5,
           doc="Graph documents no PR_MESSAGE_FLAGS submit bit readable during the window "
               "after a send's 202 ('notify transport' comes after the 202): seconds after "
               "the 202 before a sent draft still in Drafts shows mfSubmitted (0: at once)."),
    # What POST /messages/{id}/send does with a draft that was already submitted and still
    # waits in Drafts is not documented: microsoftgraph/microsoft-graph-docs-contrib issue
    # #921 ("Please add info about possible idempotency", message-send) asks and is open.
    # "refused": an error (400 ErrorInvalidRequest here, the code being unknown); "ignored":
    # 202 and nothing more goes out; "sent_again": 202 and a second copy goes out.
    Switch("second_send", default="refused", worst="sent_again",
           choices=("refused", "ignored", "sent_again"),
           doc="Graph message-send on a draft already submitted (still in Drafts) is "
               "undocumented (microsoft-graph-docs-contrib issue #921, open): refused with "
               "an error, ignored (202), or sent again (202 and a second mail)."),
)
