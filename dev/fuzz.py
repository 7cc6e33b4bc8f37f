"""Hostile inputs for Tidemark's entries, made by a seeded generator.

The inputs are plans (as the bytes of a file or of a workflow's input), the arguments of the
`tidemark` commands (task ids, series names, reasons, notes, ``--by`` labels) and the payloads
of the ``halt`` signal.

The same seed gives the same cases. A set of them is kept as a corpus under tests/fuzz_corpus/
(``python -m dev.fuzz --write-corpus tests/fuzz_corpus``), which tests/test_fuzz.py runs through
the CLI and through `temporal workflow start` in the suite; a larger run is the same test with
``TIDEMARK_FUZZ_CASES`` fresh cases of ``TIDEMARK_FUZZ_SEED`` added (docs/develop.md).

What each case must show is the test's; this module only makes the cases.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The well-formed plan every plan case starts from: a rename, a mail and a payment, so that each
# kind of argument is there to be spoilt. Nothing of it can act: its path is under a directory
# that does not exist.
BASE_PLAN: dict[str, Any] = {
    "task_id": "fuzz-base",
    "steps": [
        {"action": "fs.rename", "args": {"path": "/nonexistent/tidemark-fuzz/a.txt",
                                         "name": "b.txt"}},
        {"action": "gmail.send", "args": {"to": "ops@example.com", "subject": "Q3",
                                          "body": "statement attached"}},
        {"action": "stripe.payment_intent", "args": {"amount": 5000, "currency": "eur"}}]}
# Characters no input may hold, and some it may hold that code often mishandles.
NASTY = ["\x00", "\x01", "\x1b[31m", "\n", "\r", "\t", "\x7f", "\x85", "\u2028", "\u2029",
         "\udcff", "\ud800", "\ufeff", "\u202e", "%s%n", "'; DROP TABLE tidemark.plans; --",
         "$(touch /tmp/pwned)", "`id`", "../../etc/passwd", "*", "series:", "\"", "\\"]
# Sizes just past the journal's limits and far past them.
LONG = [101, 129, 201, 2001, 5000, 100_000]


@dataclass(frozen=True)
class Case:
    """One hostile input of a ``kind``: ``plan``, ``args`` or ``signal``.

    For ``plan``, ``data`` is a file's bytes; for ``args``, ``argv`` is that of a `tidemark`
    command; for ``signal``, ``data`` is a halt's payload, of ``encoding``."""

    name: str
    kind: str
    data: bytes = b""
    argv: list[str] = field(default_factory=list)
    encoding: str = "json/plain"

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == "args":
            doc["argv"] = self.argv
            return doc
        try:  # readable where it is text; bytes that are not UTF-8 in base64
            doc["text"] = self.data.decode("utf-8")
        except UnicodeDecodeError:
            doc["data"] = base64.b64encode(self.data).decode()
        doc["encoding"] = self.encoding
        return doc

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Case:
        data = doc["text"].encode("utf-8") if "text" in doc else \
            base64.b64decode(doc.get("data", ""))
        return Case(doc["name"], doc["kind"], data, list(doc.get("argv", [])),
                    doc.get("encoding", "json/plain"))


def _dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _spoilt_plan(r: random.Random) -> tuple[str, Any]:
    """The base plan with one field made hostile: a name for it and the document."""
    doc = json.loads(json.dumps(BASE_PLAN))
    step = r.randrange(len(doc["steps"]))
    spoil = r.choice(["task_id", "series", "action", "arg", "key", "type", "top", "approval"])
    bad: Any = r.choice(NASTY) if r.random() < 0.6 else "x" * r.choice(LONG)
    if r.random() < 0.15:
        bad = r.choice([None, 7, -1, 1.5, True, [], {}, [bad], {"k": bad}])
    if spoil == "task_id":
        doc["task_id"] = f"t{bad}" if isinstance(bad, str) else bad
    elif spoil == "series":
        doc["series"] = f"s{bad}" if isinstance(bad, str) else bad
    elif spoil == "action":
        doc["steps"][step]["action"] = f"fs.{bad}" if isinstance(bad, str) else bad
    elif spoil == "arg":
        args = doc["steps"][step]["args"]
        args[r.choice(sorted(args))] = bad
    elif spoil == "key":
        doc["steps"][step]["args"][bad if isinstance(bad, str) else "x"] = "v"
    elif spoil == "type":
        doc["steps"][step] = bad
    elif spoil == "approval":
        doc["approval"] = {"required": bad} if r.random() < 0.5 else {"approvers": [bad]}
    else:
        doc = r.choice([bad, [doc], "plan", 42, None, {"steps": bad}, {"steps": []}])
    return f"{spoil}-{type(bad).__name__}", doc


def _deep(r: random.Random) -> bytes:
    depth = r.choice([33, 100, 999, 1_001, 5_000, 50_000])
    opener, closer = r.choice([(b"[", b"]"), (b'{"a":', b"}")])
    return b'{"task_id": "fuzz-deep", "steps": ' + opener * depth + b"1" + closer * depth + b"}"


def _number(r: random.Random) -> bytes:
    number = r.choice([b"9" * r.choice([31, 4_301, 20_000]), b"-" + b"9" * 5_000, b"1e999",
                       b"-1e999", b"NaN", b"Infinity", b"-Infinity", b"1" + b"0" * 400 + b".5"])
    return (b'{"task_id": "fuzz-num", "steps": [{"action": "stripe.payment_intent", "args": '
            b'{"amount": ' + number + b', "currency": "eur"}}]}')


def _broken(r: random.Random) -> bytes:
    good = _dump(BASE_PLAN)
    return r.choice([
        b"", b"{", good[: r.randrange(1, len(good))], good + b"}", b"\xef\xbb\xbf" + good,
        good.replace(b'"b.txt"', b'"\xff\xfe"'), good.replace(b'"Q3"', b'"\\ud800"'),
        b"\x00" * 16, b"null", b"[]", b'"just a string"', good.replace(b"{", b"{ \x00 ", 1)])


def _many(r: random.Random) -> bytes:
    """A plan over one of the size limits: its bytes or its steps."""
    if r.random() < 0.5:
        return _dump({"task_id": "fuzz-big", "steps": [{"action": "fs.rename", "args": {
            "path": "/nonexistent/a", "name": "n" * 2_200_000}}]})
    return _dump({"task_id": "fuzz-many", "steps": [{"action": "fs.rename", "args": {
        "path": "/nonexistent/a", "name": "b"}}] * 100_001})


PLAN_MAKERS: list[tuple[str, Callable[[random.Random], bytes], float]] = [
    ("spoilt", lambda r: _dump(_spoilt_plan(r)[1]), 0.7),
    ("deep", _deep, 0.1), ("number", _number, 0.1), ("broken", _broken, 0.08),
    ("oversize", _many, 0.02)]


def _hostile_text(r: random.Random, prefix: str) -> str:
    if r.random() < 0.5:
        return prefix + r.choice(NASTY) + "x"
    return prefix + "y" * r.choice(LONG)


def _arguments(r: random.Random) -> list[str]:
    """A `tidemark` command with one hostile argument."""
    task = "fuzz-task"
    which = r.choice(["task", "reason", "by", "note", "series"])
    text = _hostile_text(r, "f")
    task_arg = text if which == "task" else task
    command = r.choice(["stop", "release", "kill", "status", "journal", "resolve", "unwind",
                        "resume", "series"])
    if which == "note":
        command = "resolve"
    if which == "series":
        return r.choice([["stop", "--series", text], ["status", "--series", text],
                         ["series", "declare", text]])
    extra = {"reason": ["--reason", text], "by": ["--by", text], "note": ["--note", text]}
    tail = extra.get(which, [])
    if command == "series":
        return ["series", "declare", "fuzz-s", *(tail if which == "by" else [])]
    if command == "resolve":
        return ["resolve", task_arg, "--step", "1", "--as", "done", "--yes",
                *(tail if which in ("note", "by") else [])]
    if command in ("status", "journal"):
        return [command, task_arg]
    if command == "kill":
        return ["kill", task_arg, "--grace", "0", *(tail if which != "note" else [])]
    return [command, task_arg, *(tail if which != "note" else [])]


def _signal(r: random.Random) -> tuple[bytes, str]:
    choice = r.randrange(6)
    if choice == 0:
        return _dump("h" * r.choice(LONG)), "json/plain"
    if choice == 1:
        return _dump("halt" + r.choice(NASTY) + "now"), "json/plain"
    if choice == 2:
        return _dump({"reason": "not a string", "n": [1, 2]}), "json/plain"
    if choice == 3:
        return b"[" * 40_000 + b"]" * 40_000, "json/plain"
    if choice == 4:
        return b"9" * 6_000, "json/plain"
    return bytes(r.randrange(256) for _ in range(32)), "binary/plain"


def generate(seed: int, count: int) -> Iterator[Case]:
    """``count`` cases of the seed, each kind in proportion.

    The proportion is six plans to three commands to one signal."""
    r = random.Random(seed)
    for n in range(count):
        kind = r.choices(["plan", "args", "signal"], weights=[6, 3, 1])[0]
        if kind == "plan":
            label, make, _ = r.choices(PLAN_MAKERS, weights=[w for *_, w in PLAN_MAKERS])[0]
            yield Case(f"{n:04}-plan-{label}", "plan", make(r))
        elif kind == "args":
            argv = _arguments(r)
            yield Case(f"{n:04}-args-{argv[0]}", "args", argv=argv)
        else:
            data, encoding = _signal(r)
            yield Case(f"{n:04}-signal", "signal", data, encoding=encoding)


CORPUS_FILE = "cases.jsonl"
# Cases bigger than this are not kept in the corpus (the generator makes them again at will):
# the repository holds the small ones.
CORPUS_CASE_BYTES = 12 * 1024


def write_corpus(directory: Path, seed: int, count: int) -> int:
    """Writes the seed's cases (the small ones) as the corpus; returns how many."""
    directory.mkdir(parents=True, exist_ok=True)
    kept = [c for c in generate(seed, count) if len(c.data) <= CORPUS_CASE_BYTES]
    with (directory / CORPUS_FILE).open("w", encoding="utf-8") as f:
        f.write(json.dumps({"seed": seed, "count": count}) + "\n")
        for case in kept:
            f.write(json.dumps(case.as_json(), ensure_ascii=True) + "\n")
    return len(kept)


def read_corpus(directory: Path) -> list[Case]:
    """The corpus's cases, as written."""
    lines = (directory / CORPUS_FILE).read_text(encoding="utf-8").splitlines()[1:]
    return [Case.from_json(json.loads(line)) for line in lines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-corpus", metavar="DIR", required=True)
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--cases", type=int, default=240)
    a = ap.parse_args()
    print(f"{write_corpus(Path(a.write_corpus), a.seed, a.cases)} cases written")


if __name__ == "__main__":
    main()
