"""Throttling as each provider documents it.

The answer a throttled request gets, and the switches that make the emulators give it.

What the providers document is the *shape* of the answer, and that any request may get it:

* Microsoft Graph ("Microsoft Graph throttling guidance", learn.microsoft.com/graph/throttling):
  past a threshold Graph "returns HTTP status code 429 Too Many Requests and the requests fail"
  and "returns a suggested wait time in the response header of the failed request"
  (Retry-After); writes and reads are throttled apart. Its service limits for Outlook
  resources ("Microsoft Graph service-specific throttling limits", Outlook service limits)
  allow four concurrent requests per app and mailbox; the fifth gets 429 with "Application is
  over its MailboxConcurrency limit".
* Gmail ("Resolve errors", developers.google.com/workspace/gmail/api/guides/handle-errors):
  403 with reason ``userRateLimitExceeded`` or ``rateLimitExceeded`` when a per-user or
  per-project limit is passed, and 429 "Too many requests" (reason ``rateLimitExceeded``);
  back off exponentially and try again.
* Drive ("Usage limits", developers.google.com/drive/api/guides/limits): "403: User rate limit
  exceeded" past a quota, and "429: Too many requests" from the backend's own checks; use an
  exponential backoff.
* Stripe ("Rate limits", docs.stripe.com/rate-limits): rate and concurrency limiters answer
  429; 25 reads and 25 writes a second in test mode.

How often a request is throttled is load, not behaviour. The emulators throttle none by default,
and their worst case is the same (like Stripe's 24 h key memory, a number the provider's
documents do not give a worst value of). A test or ``tidemark fleet --throttle`` sets the rate
(``throttle_rate``: the fraction of requests, reads and writes alike, that get the provider's
throttled answer). A ``throttle`` fault throttles the next requests of one operation. Where the
provider documents a choice of answers, its switch's worst case is the answer a client is
likeliest to misread (Google's 403, which reads like a refused credential).
"""

from __future__ import annotations

from aiohttp import web

from staging.core import Switch
from staging.drive.responses import google_error

RATE = "throttle_rate"
GOOGLE_STATUS = "throttle_status"
RETRY_AFTER = "throttle_retry_after_s"
MAILBOX_CONCURRENCY = "mailbox_concurrency"


def rate_switch(provider: str, documented: str) -> Switch:
    """The share of a target's requests that get its throttled answer (0 to 1)."""
    return Switch(RATE, default=0, worst=0,
                  doc=f"Fraction of {provider} requests (reads and writes) answered as "
                      f"throttled. {documented} How often is load, not behaviour: none by "
                      "default, none at the worst; a test or `tidemark fleet --throttle` sets "
                      "it, and a `throttle` fault throttles the next requests of one operation.")


GOOGLE_STATUS_DOC = ("The status of a throttled answer: 403 with reason userRateLimitExceeded "
                     "(a per-user quota) or 429 with reason rateLimitExceeded (the backend's "
                     "own checks); {page} documents both. The worst is 403, which a client can "
                     "misread as a refused credential.")


def google_status_switch(page: str) -> Switch:
    return Switch(GOOGLE_STATUS, default=429, worst=403, choices=(429, 403),
                  doc=GOOGLE_STATUS_DOC.format(page=page))


GRAPH_RETRY_AFTER = Switch(
    RETRY_AFTER, default=1, worst=30,
    doc="Seconds in the Retry-After header of Graph's 429. The throttling guidance says only "
        "that a suggested wait time is returned in the response header; no bound is given, "
        "answers of tens of seconds are reported (30 s here).")
GRAPH_MAILBOX_CONCURRENCY = Switch(
    MAILBOX_CONCURRENCY, default=0, worst=4,
    doc="Concurrent requests one mailbox serves before the next gets 429 "
        "ApplicationThrottled (\"Application is over its MailboxConcurrency limit\"). "
        "Microsoft Graph service-specific throttling limits, Outlook service limits: four "
        "concurrent requests per app and mailbox. 0: no limit.")


def google_throttled(status: int) -> web.Response:
    """Google's answer to a throttled request, as Gmail and Drive document it."""
    if status == 403:
        return google_error(403, "User rate limit exceeded.", reason="userRateLimitExceeded",
                            status="PERMISSION_DENIED", extra={"errors": [{
                                "domain": "usageLimits", "reason": "userRateLimitExceeded",
                                "message": "User rate limit exceeded."}]})
    return google_error(429, "Too many requests.", reason="rateLimitExceeded",
                        status="RESOURCE_EXHAUSTED", extra={"errors": [{
                            "domain": "usageLimits", "reason": "rateLimitExceeded",
                            "message": "Too many requests."}]})


def graph_throttled(retry_after_s: float, concurrency: bool = False) -> web.Response:
    """Graph's 429 with its Retry-After (seconds, as a whole number)."""
    code, message = (("ApplicationThrottled",
                      "Application is over its MailboxConcurrency limit.") if concurrency
                     else ("TooManyRequests", "Too many requests."))
    return web.json_response({"error": {"code": code, "message": message}}, status=429,
                             headers={"Retry-After": str(max(0, round(retry_after_s)))})
