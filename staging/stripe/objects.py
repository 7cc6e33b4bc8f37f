"""The objects the emulated Stripe keeps, with Stripe-looking random ids.

PaymentIntents as the API returns them, one account's data in one mode, and the execution errors
a test arms."""

from __future__ import annotations

import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from staging.stripe.idempotency import Remembered


@dataclass
class Intent:
    obj: dict[str, Any]
    at: float  # creation time with sub-second precision, for the search lag
    seq: int  # creation order, to order objects created within the same second


@dataclass
class AccountData:
    """One account's data in one mode (test and live data are apart, as on Stripe)."""

    intents: dict[str, Intent] = field(default_factory=dict)
    customers: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, Remembered] = field(default_factory=dict)
    seq: int = 0


@dataclass
class ExecutionError:
    """An error the create endpoint meets after execution began.

    So Stripe saves it under the Idempotency-Key and replays it. ``commit``: the PaymentIntent
    was created before it."""

    status: int = 500
    commit: bool = False
    times: int = 1


def payment_intent_object(pi_id: str, p: Mapping[str, Any], *, created: int,
                          livemode: bool = False) -> dict[str, Any]:
    """A PaymentIntent as the API returns it, fresh from create."""
    types = as_list(p.get("payment_method_types")) or ["card"]
    return {
        "id": pi_id, "object": "payment_intent", "amount": p["amount"],
        "amount_capturable": 0, "amount_received": 0, "application": None,
        "application_fee_amount": None,
        "automatic_payment_methods": p.get("automatic_payment_methods"),
        "canceled_at": None, "cancellation_reason": None,
        "capture_method": p.get("capture_method", "automatic_async"),
        "client_secret": f"{pi_id}_secret_{random_id(24)}", "confirmation_method": "automatic",
        "created": created, "currency": p["currency"], "customer": p.get("customer"),
        "description": p.get("description"), "last_payment_error": None,
        "latest_charge": None, "livemode": livemode, "metadata": dict(p.get("metadata") or {}),
        "next_action": None, "on_behalf_of": None, "payment_method": None,
        "payment_method_options": {}, "payment_method_types": types, "processing": None,
        "receipt_email": p.get("receipt_email"), "review": None, "setup_future_usage": None,
        "shipping": None, "statement_descriptor": None,
        "statement_descriptor_suffix": p.get("statement_descriptor_suffix"),
        "status": "requires_payment_method", "transfer_data": None, "transfer_group": None,
    }


def as_list(value: Any) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return [value[k] for k in sorted(value, key=lambda k: int(k) if k.isdigit() else 0)]
    return [value]


def random_id(n: int) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))
