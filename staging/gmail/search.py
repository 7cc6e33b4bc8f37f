"""Gmail's search (``q``): the operators a probe relies on, each term ANDed.

Any other term is a 400 naming it, so a probe that uses an unsupported operator fails loudly."""

from __future__ import annotations

from dataclasses import dataclass, field

from staging.core import Reply, Target
from staging.gmail.store import StoredMessage


@dataclass
class Query:
    """A parsed ``q``: every term must hold (Gmail joins space-separated terms with AND)."""

    labels: list[str] = field(default_factory=list)
    msgids: list[str] = field(default_factory=list)
    after_s: list[int] = field(default_factory=list)
    before_s: list[int] = field(default_factory=list)
    anywhere: bool = False

    @classmethod
    def parse(cls, target: Target, q: str) -> Query:
        query = cls()
        for term in q.split():
            op, sep, value = term.partition(":")
            op = op.lower()
            if not sep or not value:
                raise Reply(target.error(400, "invalidArgument",
                                         f"staging Gmail supports only operator terms in q "
                                         f"(in:, label:, rfc822msgid:, after:, before:), "
                                         f"not {term!r}"))
            if op in ("in", "label"):
                if value.lower() == "anywhere":
                    query.anywhere = True
                else:
                    query.labels.append(value.upper())
            elif op == "rfc822msgid":
                query.msgids.append(value.strip("<>"))
            elif op in ("after", "before"):
                if not value.isdigit():
                    raise Reply(target.error(400, "invalidArgument",
                                             f"staging Gmail supports {op}: with epoch seconds "
                                             f"only, not {value!r}"))
                (query.after_s if op == "after" else query.before_s).append(int(value))
            else:
                raise Reply(target.error(400, "invalidArgument",
                                         f"staging Gmail does not support the operator {op}:"))
        return query

    def __call__(self, m: StoredMessage, include_spam_trash: bool) -> bool:
        labels = set(m.label_ids)
        explicit = {"TRASH", "SPAM"} & set(self.labels)
        if not (include_spam_trash or self.anywhere or explicit) and labels & {"TRASH", "SPAM"}:
            return False
        if any(label not in labels for label in self.labels):
            return False
        msgid = (m.header("Message-ID") or "").strip().strip("<>")
        if any(msgid != want for want in self.msgids):
            return False
        seconds = m.internal_ms / 1000
        return all(seconds >= a for a in self.after_s) and all(seconds < b for b in self.before_s)
