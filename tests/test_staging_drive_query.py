"""The staging Drive's ``q`` language: each supported term form, and what it matches.

Everything else is refused with a reason (the route turns the refusal into Drive's 400)."""

from __future__ import annotations

import pytest

from staging.drive import DriveFile, parse_query


def files() -> list[DriveFile]:
    report = DriveFile("f1", "Quarterly Report.pdf", mime_type="application/pdf")
    report.app_properties_by_client = {"tidemark": {"tidemark_key": "k1"},
                                       "other-app": {"tidemark_key": "k2"}}
    notes = DriveFile("f2", "notes", mime_type="text/plain", trashed=True)
    quoted = DriveFile("f3", "it's", mime_type="text/plain")
    return [report, notes, quoted]


def matching(q: str, client: str = "tidemark") -> list[str]:
    keep = parse_query(q, client)
    return [f.id for f in files() if keep(f)]


@pytest.mark.parametrize(("q", "ids"), [
    ("", ["f1", "f2", "f3"]),
    ("name = 'notes'", ["f2"]),
    ("name != 'notes'", ["f1", "f3"]),
    ("name = 'it\\'s'", ["f3"]),
    ("name contains 'REPORT'", ["f1"]),
    ("mimeType = 'text/plain'", ["f2", "f3"]),
    ("mimeType != 'text/plain'", ["f1"]),
    ("trashed = true", ["f2"]),
    ("trashed = false", ["f1", "f3"]),
    ("trashed != true", ["f1", "f3"]),
    ("trashed != false", ["f2"]),
    ("appProperties has { key='tidemark_key' and value='k1' }", ["f1"]),
    ("appProperties HAS { KEY='tidemark_key' AND VALUE='k1' }", ["f1"]),
    ("mimeType = 'text/plain' and trashed = false", ["f3"]),
    ("name contains 'o' AND trashed = false and mimeType != 'text/plain'", ["f1"]),
])
def test_each_supported_term_matches_what_drive_would(q: str, ids: list[str]) -> None:
    assert matching(q) == ids


def test_app_properties_has_sees_only_the_callers_own_client() -> None:
    q = "appProperties has { key='tidemark_key' and value='k2' }"
    assert matching(q) == []
    assert matching(q, client="other-app") == ["f1"]


@pytest.mark.parametrize(("q", "reason"), [
    ("modifiedTime > '2026-01-01'", "cannot read the query"),
    ("starred = true", "field starred is not supported"),
    ("APPPROPERTIES has { key='k' and value='v' }", "field APPPROPERTIES is not supported"),
    ("name = 'a' or name = 'b'", "expected and at token 3"),
    ("mimeType contains 'pdf'", "operator contains is not supported on mimeType"),
    ("name has 'a'", "expected contains at token 1"),
    ("trashed = maybe", "trashed takes = or != and true or false"),
    ("trashed contains true", "expected op at token 1"),
    ("appProperties has { key='k' }", "expected and at token 6"),
    ("appProperties has { key='k' and value='v'", "expected } at token 10"),
    ("appProperties { key='k' and value='v' }", "expected has at token 1"),
    ("name = notes", "expected str at token 2"),
    ("'notes' = name", "expected word at token 0"),
    # A query that ends where an operator should come is refused like any other (Drive answers
    # 400 invalid query), not a crash of the server (a 500 the client would retry).
    ("name", "expected op at token 1"),
    ("mimeType", "expected op at token 1"),
    ("name = 'a' and mimeType", "expected op at token 5"),
])
def test_anything_else_is_refused_with_a_reason(q: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_query(q)
