"""The documented worst cases of Stripe that the emulator can show.

Each is a switch (staging.core.Switch) whose doc cites what Stripe documents."""

from __future__ import annotations

from staging.core import Switch

IDEMPOTENCY_TTL = 24 * 3600  # seconds; Stripe prunes keys once they are at least 24 hours old

CLOCK_OFFSET = Switch(
    "clock_offset_s", default=0, worst=-600,
    doc="Seconds Stripe's clock is ahead of this host's (negative: behind). A PaymentIntent's "
        "`created` is a Unix timestamp set by Stripe (API reference, The PaymentIntent object, "
        "and List all PaymentIntents: `created` filters on that field), and Stripe's HTTP "
        "`Date` header comes from the same clock (RFC 9110 section 6.6.1); nothing ties either "
        "to the caller's clock, nor to Postgres's. -600: Postgres ten minutes ahead of Stripe.")
RESTRICTED_METADATA = Switch(
    "restricted_key_metadata", default="shown", worst="hidden", choices=("shown", "hidden"),
    doc="Whether objects read with a restricted key (rk_) carry their metadata. Stripe's "
        "metadata page (docs.stripe.com/metadata) says metadata is not shown to publishable "
        "keys and is returned to requests made with the secret key; it says nothing of "
        "restricted keys, so the worst case is that they see `metadata: {}`.")
IDEMPOTENCY_TTL_SWITCH = Switch(
    "idempotency_ttl_s", default=IDEMPOTENCY_TTL, worst=IDEMPOTENCY_TTL,
    doc="Seconds Stripe remembers an Idempotency-Key. Stripe (docs.stripe.com/api/"
        "idempotent_requests) may remove keys once they are at least 24 hours old and then "
        "runs a reused key as a new request; 24 h is thus both the usual and the worst case. "
        "A test sets it lower to make a key forgotten without waiting a day.")
