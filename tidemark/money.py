"""Amounts in a currency's own units.

Stripe takes amounts in the currency's smallest unit: cents for USD, but whole yen for JPY
(a zero-decimal currency) and thousandths for the three-decimal ones. Its lists
(https://docs.stripe.com/currencies#zero-decimal, #three-decimal) are kept here so that a person
reading an amount sees 50,000 JPY, never 500.00.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

ZERO_DECIMAL = frozenset({"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf",
                          "ugx", "vnd", "vuv", "xaf", "xof", "xpf"})
THREE_DECIMAL = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})


def decimals(currency: str) -> int:
    """How many decimals the currency's minor unit has (0, 2 or 3)."""
    cur = currency.lower()
    return 0 if cur in ZERO_DECIMAL else 3 if cur in THREE_DECIMAL else 2


def major(amount: int, currency: str) -> str:
    """``amount`` minor units as the currency's own figure: ``50,000`` (JPY), ``42.00`` (EUR)."""
    places = decimals(currency)
    return f"{Decimal(amount).scaleb(-places):,.{places}f}"


def shown(amount: int, currency: str) -> str:
    """What a person reads: ``50,000 JPY``, ``42.00 EUR``."""
    return f"{major(amount, currency)} {currency.upper()}"


def to_minor(figure: str, currency: str) -> int:
    """A money figure such as ``"400.50"`` USD as minor units (40050).

    ``"400"`` works too. Raises ValueError for a figure that is not a non-negative number with at
    most the currency's decimals."""
    try:
        value = Decimal(figure)
    except InvalidOperation:
        raise ValueError(f"{figure!r} is not a number") from None
    places = decimals(currency)
    minor = value.scaleb(places)
    if not value.is_finite() or value < 0 or minor != minor.to_integral_value():
        raise ValueError(f"{figure!r} is not an amount of {currency.upper()} "
                         f"({places} decimals at most, not negative)")
    return int(minor)
