"""Approval is the operator's policy, not the plan's.

The journal holds it and enforces it: the statement that writes an irreversible step's intent
refuses it unless no approval is needed or a valid one holds (tidemark/migrations/
0016_authority.sql). Which steps need a person is the strictest of these, taken together:

* the operator's policy in the journal (``tidemark policy set``; none set: ``all``);
* the series' declared policy (``tidemark series declare S --approval P``): it can add, never
  remove;
* the plan's own ask (``"approval": {"required": true}``); a plan cannot name approvers;
* the worker's ``TIDEMARK_APPROVAL``, which makes its runs ask for more.

A policy is a comma-separated list of rules, each selecting a task's irreversible steps:

* ``all`` — every irreversible step (the default);
* ``payments`` — any step that moves money (its args carry ``amount`` and ``currency``);
* ``amount>CUR:FIGURE`` — the task's payments in ``CUR`` add up to more than ``FIGURE`` in the
  currency's own units (``amount>usd:400``: five payments of 400.00 USD are 2,000.00 USD, over
  it); a payment in a currency no ``amount>`` rule names needs a person;
* ``daily>CUR:FIGURE`` — a series' payments in ``CUR`` begun today (UTC), this run's included,
  add up to more than ``FIGURE`` (the journal counts the other runs);
* ``none`` — no step (alone: the explicit choice that irreversible steps run unattended).

Who decides is a database role: the login role of the connection that records the decision,
a member of ``tidemark_approver`` that every approver list naming the task's approvers names
(the policy's, the series', the worker's ``TIDEMARK_APPROVERS``). A name typed with ``--by`` and
the operating-system user are labels beside it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemark.errors import ConfigError
from tidemark.money import shown, to_minor

if TYPE_CHECKING:  # annotations only: the policy is read without the store's driver
    from tidemark.store import JournalStore

ENV_APPROVAL = "TIDEMARK_APPROVAL"
ENV_APPROVERS = "TIDEMARK_APPROVERS"
DEFAULT_POLICY = "all"
_LIMIT = re.compile(r"(amount|daily)>([a-z]{3}):(\S+)")
# A login role's name, as the journal's approver lists hold it: PostgreSQL's unquoted
# identifiers (NAMEDATALEN 64, so 63 bytes), lower case, so that it means the role it names.
_NAME = re.compile(r"[a-z_][a-z0-9_$]{0,62}")


@dataclass(frozen=True)
class ApprovalPolicy:
    """A parsed approval policy.

    ``text`` as written, normalised; ``limits`` (per task) and ``daily`` (per series and day) in
    minor units; ``approvers`` login roles (empty: no narrowing)."""

    text: str = DEFAULT_POLICY
    all_steps: bool = True
    nobody: bool = False  # "none": irreversible steps run unattended, by the operator's choice
    payments: bool = False
    limits: Mapping[str, int] = field(default_factory=dict)
    daily: Mapping[str, int] = field(default_factory=dict)
    approvers: tuple[str, ...] = ()

    def asks(self, irreversible: Iterable[Mapping[str, Any]]) -> str | None:
        """Why this policy asks a person before a task's irreversible steps, or None.

        The steps are given by their args. Amounts are summed per currency over the task, so
        splitting one payment into many does not pass under a limit. A daily limit needs the
        series' other runs: the journal judges it (tidemark.policy_asks)."""
        steps = list(irreversible)
        if self.nobody or not steps:
            return None
        if self.all_steps:
            return f"every irreversible step waits for a person (policy {self.text})"
        totals: dict[str, int] = {}
        for args in steps:
            if "amount" in args and "currency" in args:
                cur = str(args["currency"]).lower()
                totals[cur] = totals.get(cur, 0) + int(args["amount"])
        if self.payments and totals:
            return f"payments wait for a person (policy {self.text})"
        if not self.limits:
            return None
        for cur, total in sorted(totals.items()):
            limit = self.limits.get(cur)
            if limit is None:
                return (f"a payment in {cur.upper()}, which no amount> rule of policy "
                        f"{self.text} names, waits for a person")
            if total > limit:
                return (f"payments in {cur.upper()} add up to {shown(total, cur)}, over "
                        f"amount>{cur}:{shown(limit, cur).split()[0].replace(',', '')} of "
                        f"policy {self.text}")
        return None

    def rules(self) -> dict[str, Any]:
        """The parsed form the journal evaluates (tidemark.rules_valid)."""
        return {"all": self.all_steps, "payments": self.payments, "nobody": self.nobody,
                "limits": dict(self.limits), "daily": dict(self.daily)}

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.text, "approvers": list(self.approvers)}


def parse_policy(text: str, approvers: Iterable[str] = (), *,
                 where: str = ENV_APPROVAL) -> ApprovalPolicy:
    """Parses a policy; ConfigError naming ``where`` for anything it cannot read."""
    rules = [r.strip().lower() for r in text.split(",")]
    if not text.strip() or "" in rules:
        raise ConfigError(f"{where} must be all, none, payments, amount>CUR:FIGURE or "
                          f"daily>CUR:FIGURE (comma-separated), got {text!r}")
    if "none" in rules and len(rules) > 1:
        raise ConfigError(f"{where}: none cannot be combined with other rules, got {text!r}")
    limits: dict[str, dict[str, int]] = {"amount": {}, "daily": {}}
    for rule in rules:
        m = _LIMIT.fullmatch(rule)
        if m:
            kind, cur, figure = m.groups()
            if cur in limits[kind]:
                raise ConfigError(f"{where}: two {kind} limits for {cur.upper()}")
            try:
                limits[kind][cur] = to_minor(figure, cur)
            except ValueError as e:
                raise ConfigError(f"{where}: {rule}: {e}") from None
        elif rule not in ("all", "none", "payments"):
            raise ConfigError(f"{where}: unknown rule {rule!r} (all, none, payments, "
                              "amount>CUR:FIGURE such as amount>usd:100, daily>CUR:FIGURE)")
    return ApprovalPolicy(text=",".join(rules), all_steps="all" in rules,
                          nobody=rules == ["none"], payments="payments" in rules,
                          limits=limits["amount"], daily=limits["daily"],
                          approvers=parse_approvers(approvers))


def parse_approvers(names: Iterable[str], where: str = "approvers") -> tuple[str, ...]:
    """Login role names, sorted and checked (ConfigError naming ``where`` for one that is not)."""
    found = tuple(sorted({a.strip() for a in names if a.strip()}))
    for name in found:
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{where}: {name!r} is not a database role name (lower-case "
                              "letters, digits and _, at most 63)")
    return found


def split_names(raw: str | None) -> list[str]:
    return [n for n in (raw or "").split(",") if n.strip()]


def policy_from_env(env: Mapping[str, str]) -> ApprovalPolicy:
    """The worker's approval policy, from the environment.

    ``TIDEMARK_APPROVAL`` (default ``all``: every irreversible step waits for a person) and
    ``TIDEMARK_APPROVERS`` (login roles that narrow who may decide). It adds to the journal's
    policy; it never removes."""
    approvers = split_names(env.get(ENV_APPROVERS))
    parse_approvers(approvers, ENV_APPROVERS)
    return parse_policy(env.get(ENV_APPROVAL, DEFAULT_POLICY), approvers)


def series_policy(declared: Mapping[str, Any] | None) -> ApprovalPolicy | None:
    """The policy a series' declaration gives, or None when it gives none.

    A declaration that no longer parses asks a person for every irreversible step: the strictest
    reading."""
    if declared is None or not declared.get("approval"):
        return None
    try:
        return parse_policy(str(declared["approval"]), declared.get("approvers") or (),
                            where=f"series {declared.get('series')} --approval")
    except ConfigError:
        return ApprovalPolicy(text=f"{declared['approval']} (unreadable: all)")


def why_asked(policies: Iterable[ApprovalPolicy | None], plan_asks: bool,
              irreversible: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a person must approve a task's irreversible steps, or None.

    Why a person must approve a task's irreversible steps (their args) under every policy
    that applies, the strictest winning, or None."""
    if plan_asks and irreversible:
        return "the plan asks a person to approve its irreversible steps"
    for policy in policies:
        why = policy.asks(irreversible) if policy is not None else None
        if why is not None:
            return why
    return None


def narrowed(lists: Iterable[Iterable[str] | None]) -> list[str] | None:
    """The login roles every given approver list names (None: no list narrows anything)."""
    kept: set[str] | None = None
    for names in lists:
        if names:
            kept = set(names) if kept is None else kept & set(names)
    return None if kept is None else sorted(kept)


def unattended(store: JournalStore, by: str) -> None:
    """Sets the journal's policy to ``none``: no person approves irreversible steps.

    For a harness on a scratch journal (the tests, chaos, fleets, benchmarks, recordings); an
    operator says it with `tidemark policy set none`."""
    policy = parse_policy("none")
    store.set_policy(policy.text, policy.rules(), None, by)
