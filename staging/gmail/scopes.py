"""The OAuth scopes of the Gmail API, and which ones each method group accepts.

For each group of methods, the scopes are those Google's discovery document accepts for it."""

from __future__ import annotations

SCOPE_PREFIX = "https://www.googleapis.com/auth/"
FULL_SCOPE = "https://mail.google.com/"
SEND_SCOPE = SCOPE_PREFIX + "gmail.send"
COMPOSE_SCOPE = SCOPE_PREFIX + "gmail.compose"
MODIFY_SCOPE = SCOPE_PREFIX + "gmail.modify"
READONLY_SCOPE = SCOPE_PREFIX + "gmail.readonly"
METADATA_SCOPE = SCOPE_PREFIX + "gmail.metadata"
INSERT_SCOPE = SCOPE_PREFIX + "gmail.insert"

# The scopes Google's discovery document lists for each method.
SEND_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE, SEND_SCOPE)
DRAFT_WRITE_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE)  # drafts.create/send/delete
DRAFT_READ_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE, READONLY_SCOPE)  # drafts.get/list
PROFILE_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, COMPOSE_SCOPE, READONLY_SCOPE, METADATA_SCOPE)
READ_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, READONLY_SCOPE, METADATA_SCOPE)  # list, get, history
TRASH_SCOPES = (FULL_SCOPE, MODIFY_SCOPE)
INSERT_SCOPES = (FULL_SCOPE, MODIFY_SCOPE, INSERT_SCOPE)
DELETE_SCOPES = (FULL_SCOPE,)
