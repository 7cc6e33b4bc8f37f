"""Stripe PaymentIntents (API v1): create, retrieve, list and search, with Stripe's idempotency.

Routes (stripe-python reaches them with ``base_addresses={"api": <base>}``):

* ``POST /v1/payment_intents`` — form-encoded (``metadata[k]=v``): ``amount``, ``currency``,
  ``customer``, ``description``, ``metadata``, ``receipt_email``, ``payment_method_types``,
  ``automatic_payment_methods``, ``capture_method``, ``statement_descriptor_suffix``;
  anything else is ``parameter_unknown``. Objects start in ``requires_payment_method``.
* ``GET /v1/payment_intents/{id}``;
* ``POST /v1/payment_intents/{id}`` — an update (what an edit in the Dashboard does):
  ``amount``, ``currency``, ``description``, ``receipt_email``, ``metadata`` (merged; a key set
  to an empty string is removed), recorded as a ``payment_intents.update`` effect;
* ``GET /v1/payment_intents`` — ``created`` (a timestamp or ``created[gt|gte|lt|lte]``),
  ``customer``, ``limit`` (1 to 100, default 10), ``starting_after``, ``ending_before``; newest
  first. A consistent read: an object is listed as soon as it was created.
* ``GET /v1/payment_intents/search`` — ``query`` clauses joined by ``AND`` or ``OR``:
  ``metadata['k']:'v'``, ``status:'…'``, ``currency:'…'``, ``customer:'…'``,
  ``amount>100`` (``:``, ``<``, ``>``, ``<=``, ``>=``; also ``created``); ``limit``, ``page``.
  Eventually consistent, like Stripe's: an object becomes searchable only ``search_lag``
  seconds after its creation;
* ``GET /v1/account`` — the key's own account (``id``, ``object: "account"``, …); a restricted
  key needs ``rak_accounts_kyc_basic_read`` for it, the permission Stripe's 403 names.

Accounts and modes: a key belongs to the account of its token (``staging.core.Token.account``:
:data:`ACCOUNT` for the default one, else the token's account as given, e.g. ``acct_other``)
and to a mode by its prefix (``sk_live_``/``rk_live_`` live, anything else test). Each account
keeps its test and live data apart (PaymentIntents, customers, idempotency keys), as on
Stripe; objects carry ``livemode``. A key sees only its own account's data in its own mode.

Idempotency, as Stripe documents it for v1: a POST's ``Idempotency-Key`` is remembered with the
endpoint, the parameters and the response once execution begins (24 hours). The same key with the
same parameters replays that response — errors included — with ``Idempotent-Replayed: true``;
with other parameters or another endpoint it is a 400 ``idempotency_error``; while the first
request is still executing a twin gets 409 ``idempotency_key_in_use``. Requests that fail
validation (unknown or malformed parameters) or never reach execution (an armed
``fail_before_commit``, like an outage in front of the API) are not remembered, so a retry runs.
An error during execution is remembered and replayed like any other answer: arm one with
``POST /_staging/stripe/execution_errors`` ``{"status": 500, "commit"?: false, "times"?: 1}``
(``commit``: the PaymentIntent was created before the error).

Auth, as Stripe: ``Authorization: Bearer <key>``. Default keys (``/_staging/reset`` keeps them):
``sk_test_tidemark_staging`` (a secret key: everything) and ``rk_test_tidemark_staging_read``
(a restricted key with read permission on PaymentIntents and on the account, which gets
Stripe's 403 on create).
Keys added over ``/_staging/tokens`` take the permissions ``rak_payment_intent_read``,
``rak_payment_intent_write`` and ``rak_accounts_kyc_basic_read`` as scopes.

Switches (``/_staging/switches``, see staging.core): ``clock_offset_s`` (Stripe's clock against
this host's: ``created`` and the ``Date`` header every answer carries), ``restricted_key_metadata``
(``hidden``: objects read with an ``rk_`` key come with ``metadata: {}``) and
``idempotency_ttl_s`` (how long a key is remembered).

Control endpoints:

* ``GET|POST /_staging/stripe/search_lag`` ``{"seconds": 60}`` — how far search trails;
* ``POST /_staging/stripe/customers`` ``{"id"?, "email"?, "name"?}`` — a customer that
  ``customer=`` may name; an unknown customer is ``resource_missing``, as on Stripe.

Every created PaymentIntent is recorded as an effect with the Idempotency-Key its request carried.
Faults can be armed on ``payment_intents.create``, ``.retrieve``, ``.list`` and ``.search``.

The package, by concern: ``objects`` (PaymentIntents, account data), ``accounts`` (keys,
accounts, modes, auth errors), ``clocks`` (Stripe's ``Date``), ``idempotency`` (replay),
``intents`` (the PaymentIntents routes), ``params``, ``search``, ``responses``, ``control``
(``/_staging/stripe``), ``switches`` and ``target`` (StripeTarget).
"""

from staging.stripe.accounts import (
    ACCOUNT,
    DEFAULT_SEARCH_LAG,
    PERM_ACCOUNT_READ,
    PERM_READ,
    PERM_WRITE,
    account_id,
    livemode,
)
from staging.stripe.idempotency import MAX_IDEMPOTENCY_KEY
from staging.stripe.intents import MAX_AMOUNT, METADATA_LIMITS, MIN_AMOUNT
from staging.stripe.objects import ExecutionError, payment_intent_object
from staging.stripe.params import (
    CREATE_PARAMS,
    DEFAULT_LIMIT,
    LIST_PARAMS,
    MAX_LIMIT,
    SEARCH_PARAMS,
    decode_params,
)
from staging.stripe.responses import mask_key, stripe_error
from staging.stripe.search import parse_search
from staging.stripe.switches import (
    CLOCK_OFFSET,
    IDEMPOTENCY_TTL,
    IDEMPOTENCY_TTL_SWITCH,
    RESTRICTED_METADATA,
)
from staging.stripe.target import DEFAULT_READ_KEY, DEFAULT_SECRET_KEY, StripeTarget

__all__ = [
    "ACCOUNT", "CLOCK_OFFSET", "CREATE_PARAMS", "DEFAULT_LIMIT", "DEFAULT_READ_KEY",
    "DEFAULT_SEARCH_LAG", "DEFAULT_SECRET_KEY", "IDEMPOTENCY_TTL", "IDEMPOTENCY_TTL_SWITCH",
    "LIST_PARAMS", "MAX_AMOUNT", "MAX_IDEMPOTENCY_KEY", "MAX_LIMIT", "METADATA_LIMITS",
    "MIN_AMOUNT", "PERM_ACCOUNT_READ", "PERM_READ", "PERM_WRITE", "RESTRICTED_METADATA",
    "SEARCH_PARAMS", "ExecutionError", "StripeTarget", "account_id", "decode_params",
    "livemode", "mask_key", "parse_search", "payment_intent_object", "stripe_error",
]
