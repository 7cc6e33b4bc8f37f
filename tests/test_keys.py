"""The key formula is stamped into the outside world; these vectors pin it forever.

Each expected value was computed with sha256sum over the literal JSON text shown in the comment,
i.e. independently of tidemark.keys.
"""

import pytest

from tidemark.keys import key_for

VECTORS = [
    # ["supplier-sync-2026-11-30", 1, "fs.rename",
    #  {"name": "final.txt", "path": "/abs/dir/draft.txt"}]
    (("supplier-sync-2026-11-30", 1, "fs.rename",
      {"path": "/abs/dir/draft.txt", "name": "final.txt"}), "864554ccbaac4de900a66d1fe6848181"),
    (("t", 32, "drive.rename", {"name": "2026-Q3 report.pdf", "file_id": "1AbC"}),
     "12bde3330f769f3b55083a16ff4b22fb"),
    # non-ASCII goes through json's default \uXXXX escaping:
    # ["t", 39, "gmail.send",
    #  {"body": "hi", "subject": "Z\u00fcrich \u2713", "to": ["a@example.com"]}]
    (("t", 39, "gmail.send", {"to": ["a@example.com"], "subject": "Zürich ✓", "body": "hi"}),
     "55d31220a82c7045659090bc0a6653d4"),
    (("plan-0", 1, "stripe.payment_intent", {"amount": 4200, "currency": "eur"}),
     "e2aa80b4b964d92e0bc7a4557b80be28"),
]


@pytest.mark.parametrize(("inputs", "expected"), VECTORS)
def test_key_vectors(inputs: tuple, expected: str) -> None:
    assert key_for(*inputs) == expected


def test_key_depends_on_every_part() -> None:
    base = ("t", 1, "fs.rename", {"path": "/a", "name": "b"})
    variants = [("u", 1, "fs.rename", base[3]), ("t", 2, "fs.rename", base[3]),
                ("t", 1, "drive.rename", base[3]),
                ("t", 1, "fs.rename", {"path": "/a", "name": "c"})]
    keys = {key_for(*v) for v in [base, *variants]}
    assert len(keys) == 5


def test_key_ignores_dict_order() -> None:
    assert key_for("t", 1, "a.b", {"x": 1, "y": 2}) == key_for("t", 1, "a.b", {"y": 2, "x": 1})
