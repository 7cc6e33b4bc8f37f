"""A deliberately wrong Stripe action, for showing that `tidemark chaos` catches a wrong probe."""

from __future__ import annotations

from collections.abc import Mapping

from activities.stripe import StripePaymentIntent
from activities.wiring import worker_registry
from tidemark.actions import ProbeResult, StepContext


class AlwaysAbsent(StripePaymentIntent):
    """stripe.payment_intent bound as a worker binds it, with a probe that always says *absent*.

    The real stripe.payment_intent, bound exactly as a worker binds it. After a crash past the
    payment it pays again, and only Stripe's Idempotency-Key keeps the second request from
    becoming a second payment."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AlwaysAbsent:
        bound = worker_registry(env).bound(cls.name)
        bound.__class__ = cls  # the same clients, keys and limits; only the probe differs
        assert isinstance(bound, AlwaysAbsent)
        return bound

    def probe(self, ctx: StepContext) -> ProbeResult:
        return ProbeResult.absent("this probe is blind on purpose")
