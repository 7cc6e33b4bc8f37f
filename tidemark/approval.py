"""Approval is the operator's policy, not the plan's.

Which irreversible steps need a person, and who that person may be, is configured by whoever
runs the worker (``TIDEMARK_APPROVAL``, ``TIDEMARK_APPROVERS``) or declares a series
(``tidemark schedule create S … --approval P --approvers A,B``, ``tidemark series declare``).
A plan can ask for more (``"approval": {"required": true}`` makes every irreversible step wait)
and never for less; it cannot name approvers.

A policy is a comma-separated list of rules, each selecting irreversible steps:

* ``all`` — every irreversible step (the default when nothing is configured);
* ``payments`` — every step that moves money (its args carry ``amount`` and ``currency``);
* ``amount>CUR:FIGURE`` — payments in ``CUR`` over ``FIGURE`` in the currency's own units
  (``amount>usd:100`` is more than 100.00 USD, ``amount>jpy:50000`` more than 50,000 JPY); a
  payment in a currency no ``amount>`` rule names needs a person;
* ``none`` — no step (alone: it is the explicit choice that irreversible steps run unattended).

Approvers are operating-system user names: the decision's identity is the user running
``tidemark approve`` (``os.geteuid()``), which a person cannot simply type, unlike ``--by``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemark.errors import ConfigError
from tidemark.money import to_minor

ENV_APPROVAL = "TIDEMARK_APPROVAL"
ENV_APPROVERS = "TIDEMARK_APPROVERS"
DEFAULT_POLICY = "all"
_AMOUNT = re.compile(r"amount>([a-z]{3}):(\S+)")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")  # a POSIX user name, portably


@dataclass(frozen=True)
class ApprovalPolicy:
    """A parsed policy: ``text`` as written, normalised; ``limits`` in minor units."""

    text: str = DEFAULT_POLICY
    all_steps: bool = True
    nobody: bool = False  # "none": irreversible steps run unattended, by the operator's choice
    payments: bool = False
    limits: Mapping[str, int] = field(default_factory=dict)
    approvers: tuple[str, ...] = ()

    def needs_person(self, args: Mapping[str, Any]) -> bool:
        """Whether an irreversible step with ``args`` waits for a person."""
        if self.all_steps:
            return True
        if self.nobody or "amount" not in args or "currency" not in args:
            return False
        if self.payments:
            return True
        limit = self.limits.get(str(args["currency"]).lower())
        return limit is None or int(args["amount"]) > limit

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.text, "approvers": list(self.approvers)}


def parse_policy(text: str, approvers: Iterable[str] = (), *,
                 where: str = ENV_APPROVAL) -> ApprovalPolicy:
    """Parses a policy; ConfigError naming ``where`` for anything it cannot read."""
    rules = [r.strip().lower() for r in text.split(",")]
    if not text.strip() or "" in rules:
        raise ConfigError(f"{where} must be all, none, payments or amount>CUR:FIGURE "
                          f"(comma-separated), got {text!r}")
    if "none" in rules and len(rules) > 1:
        raise ConfigError(f"{where}: none cannot be combined with other rules, got {text!r}")
    limits: dict[str, int] = {}
    for rule in rules:
        m = _AMOUNT.fullmatch(rule)
        if m:
            cur, figure = m.groups()
            if cur in limits:
                raise ConfigError(f"{where}: two limits for {cur.upper()}")
            try:
                limits[cur] = to_minor(figure, cur)
            except ValueError as e:
                raise ConfigError(f"{where}: {rule}: {e}") from None
        elif rule not in ("all", "none", "payments"):
            raise ConfigError(f"{where}: unknown rule {rule!r} (all, none, payments, "
                              "amount>CUR:FIGURE such as amount>usd:100)")
    names = tuple(sorted({a.strip() for a in approvers if a.strip()}))
    for name in names:
        if not _NAME.fullmatch(name):
            raise ConfigError(f"approvers: {name!r} is not a user name")
    return ApprovalPolicy(text=",".join(rules), all_steps="all" in rules,
                          nobody=rules == ["none"], payments="payments" in rules,
                          limits=limits, approvers=names)


def split_names(raw: str | None) -> list[str]:
    return [n for n in (raw or "").split(",") if n.strip()]


def policy_from_env(env: Mapping[str, str]) -> ApprovalPolicy:
    """The worker's policy: ``TIDEMARK_APPROVAL`` (default ``all``: every irreversible step
    waits for a person) and ``TIDEMARK_APPROVERS`` (user names; none: nobody may approve)."""
    approvers = split_names(env.get(ENV_APPROVERS))
    try:
        return parse_policy(env.get(ENV_APPROVAL, DEFAULT_POLICY), approvers)
    except ConfigError as e:
        if str(e).startswith("approvers:"):
            raise ConfigError(f"{ENV_APPROVERS}{str(e)[len('approvers'):]}") from None
        raise


def effective(worker: ApprovalPolicy, declared: Mapping[str, Any] | None,
              plan_asks: bool) -> tuple[ApprovalPolicy, bool]:
    """The policy that holds for a task: its series' declared policy and approvers where the
    declaration gives them, else the worker's; and whether the plan asked for every
    irreversible step to wait (more, never less)."""
    policy = worker
    if declared is not None:
        text = declared.get("approval") or worker.text
        names = declared.get("approvers")
        policy = parse_policy(text, worker.approvers if names is None else names,
                              where=f"series {declared.get('series')} --approval")
    return policy, plan_asks


def steps_needing_person(policy: ApprovalPolicy, plan_asks: bool,
                         steps: Iterable[tuple[int, Mapping[str, Any]]]) -> list[int]:
    """The irreversible steps (number, args) that wait for a person."""
    return [n for n, args in steps if plan_asks or policy.needs_person(args)]
