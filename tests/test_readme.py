"""The README is a front page a newcomer finishes, and every command on it works as printed.

- The front page is at most 200 lines; the rest is in docs/ (operate, reference, develop).
- Every command in its ``sh``/``bash`` blocks is run by a test: here (the venv's activation and
  the on-call commands, against a real journal, Temporal dev server and worker), or it is the
  very command a named test runs (the test command is the one .ci/run runs, the install is
  .ci/run's, the demo is tests/test_demo.py's). A command added to the front page that no test
  runs fails here, naming it.
- Every relative link of README.md and docs/*.md reaches a file, and a heading where it names
  one.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment
from test_control_matrix import SPECS, Task
from test_run_plan import README_START

from tidemark.plan import load_plan
from tidemark.store import JournalStore
from tools.cli.main import build_parser
from workflows.outcome import run_result, unwind_result

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
DEMO_TEST = ROOT / "tests" / "test_demo.py"
MAX_LINES = 200

# The on-call commands as the front page prints them (T: the task id), in the order this test
# runs them on one task: a stopped task shows in the inbox and in its report, is resumed to
# completion, unwound, and killed.
ON_CALL = [["tidemark", "inbox"], ["tidemark", "status", "T"], ["tidemark", "resume", "T"],
           ["tidemark", "unwind", "T", "--yes"], ["tidemark", "kill", "T"]]
ACTIVATE = [".", ".venv/bin/activate"]
# The first plan of the front page, on the plan of its JSON block.
FIRST_PLAN = [["tidemark", "start", "PLAN.json", "--follow"]]
# The two commands: the demo on the embedded default (after the install), and the tests.
DEMO = [".venv/bin/tidemark", "demo"]
TESTS_COMMAND = [".venv/bin/python", "-m", "pytest", "-q", "-n", "3", "-m", "not slow"]
# The slow tier, the heavier checks' own command (docs/develop.md, Testing), which CI runs next.
SLOW_COMMAND = [".venv/bin/python", "-m", "pytest", "-q", "-n", "3", "-m", "slow"]


def shell_commands(markdown: str) -> list[list[str]]:
    """Every command of the fenced ``sh``/``bash`` blocks, as the shell splits it.

    Comments dropped, continued lines joined, ``a && b`` as two commands."""
    commands: list[list[str]] = []
    for block in re.findall(r"^```(?:sh|bash)\n(.*?)^```", markdown, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                commands.append(words[:cut])
                words = words[cut + 1:]
    return commands


def ci_commands() -> list[list[str]]:
    """The commands .ci/run runs, one per line."""
    return [words for line in CI_RUN.read_text().splitlines()
            if (words := shlex.split(line, comments=True))]


def as_ci_writes_it(command: list[str]) -> list[str]:
    """A pip command as .ci/run writes it: pip through the venv's python, quietly."""
    if command[:1] == [".venv/bin/pip"]:
        command = [".venv/bin/python", "-m", "pip", *command[1:]]
    return [w for w in command if w != "--quiet"]


def demo_test_argvs() -> list[list[str]]:
    """The `tidemark demo` command lines tests/test_demo.py runs.

    Each ``main([...])`` (or the helper that calls it) whose list starts with "demo", its literal
    words, ``--json`` (the output's format) left out."""
    argvs = []
    for node in ast.walk(ast.parse(DEMO_TEST.read_text())):
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value == "demo":
            words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            argvs.append([w for w in words if w != "--json"])
    return argvs


def who_runs(command: list[str]) -> str | None:
    """Which test runs ``command``, or None."""
    if command in ON_CALL:
        return "test_readme.py::test_the_on_call_commands_run_as_printed"
    if command in FIRST_PLAN:
        return "test_readme.py::test_the_first_plan_runs_as_printed"
    if command == ACTIVATE:
        return "test_readme.py::test_activating_the_venv_puts_its_tidemark_first"
    if command[:1] == [".venv/bin/tidemark"] and command[1:] in demo_test_argvs():
        return "test_demo.py"
    if as_ci_writes_it(command) in [as_ci_writes_it(c) for c in ci_commands()]:
        return ".ci/run (and test_readme.py::test_the_test_command_is_the_one_ci_runs)"
    return None


def test_the_front_page_is_at_most_200_lines() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move text to docs/"


def test_every_command_on_the_front_page_is_run_by_a_test() -> None:
    commands = shell_commands(README.read_text())
    assert commands, "no shell block found"
    unrun = [shlex.join(c) for c in commands if who_runs(c) is None]
    assert not unrun, f"no test runs these front-page commands: {unrun}"
    # and every on-call command this file runs is on the front page: none ran for nothing
    assert [c for c in commands if c[:1] == ["tidemark"]] == FIRST_PLAN + ON_CALL


def test_the_extraction_sees_chains_comments_and_unknown_commands() -> None:
    """The parser of the blocks above cannot pass by seeing nothing."""
    text = "x\n```sh\na b && .venv/bin/tidemark demo   # the demo\ntidemark frobnicate T\n```\n"
    commands = shell_commands(text)
    assert commands == [["a", "b"], [".venv/bin/tidemark", "demo"], ["tidemark", "frobnicate",
                                                                      "T"]]
    assert [who_runs(c) for c in commands] == [None, "test_demo.py", None]


def test_the_test_command_is_the_one_ci_runs() -> None:
    readme = [c for c in shell_commands(README.read_text()) if "pytest" in c]
    ci = [c for c in ci_commands() if "pytest" in c]
    # The README's command, then the slow tier: between them every test, none twice.
    assert readme == [TESTS_COMMAND] and ci == [TESTS_COMMAND, SLOW_COMMAND], (readme, ci)
    assert shlex.join(SLOW_COMMAND) in (ROOT / "docs" / "develop.md").read_text()
    # one line: no separate install of the example plugin before it
    assert not [c for c in ci_commands() if "examples/ledger-plugin" in c]


def test_activating_the_venv_puts_its_tidemark_first() -> None:
    """`. .venv/bin/activate`, with the venv these tests run in as `.venv`."""
    assert ACTIVATE in shell_commands(README.read_text())
    prefix = Path(sys.prefix)
    script = f". {shlex.quote(str(prefix / 'bin' / 'activate'))} && command -v tidemark"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(prefix / "bin" / "tidemark")


async def test_the_on_call_commands_run_as_printed(
        temporal_env: WorkflowEnvironment, store: JournalStore, workers: Any, task_queue: str,
        tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The on-call commands of the front page run as printed.

    The five commands of the front page run on a stopped task of two renames. Each exits 0 and
    does what its comment says."""
    monkeypatch.setenv("TIDEMARK_TASK_QUEUE", task_queue)
    workers.start()
    client = temporal_env.client
    task = Task(tmp_path)
    task.doc["steps"] = task.doc["steps"][:2]  # the two renames: reversible
    store.persist_plan(load_plan(task.doc, SPECS))
    store.set_control(task.id, "stopped", "incident", "ops")
    outputs = {}
    for command in ON_CALL:
        argv = [task.id if w == "T" else w for w in command[1:]]
        code, out, err = await cli(*argv)
        assert code == 0, (command, out, err)
        outputs[command[1]] = out
        if command[1] == "resume":
            handle = client.get_workflow_handle(f"tidemark-{task.id}")
            assert (await run_result(handle)).state == "completed"
            assert task.effects() == (2, 0, 0)
        if command[1] == "unwind":
            handle = client.get_workflow_handle(f"tidemark-unwind-{task.id}")
            assert (await unwind_result(handle)).state == "unwound"
            assert task.effects() == (0, 2, 0)
    assert f"{task.id}  stopped  since " in outputs["inbox"]
    first, report = outputs["status"].split("\n", 1)
    assert first.startswith(f"Task {task.id} is stopped") and "tidemark resume" in first
    assert report.startswith(f"task {task.id}  (stopped)")
    stop = store.stop_state(task.id)
    assert stop is not None and stop["state"] == "killed", stop


def test_the_front_page_has_the_two_commands_the_python_and_production() -> None:
    text = README.read_text()
    commands = shell_commands(text)
    assert commands.index(DEMO) < commands.index(TESTS_COMMAND) < commands.index(FIRST_PLAN[0])
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    version = re.fullmatch(r">=\s*(\d+\.\d+)", required)
    assert version, required
    assert f"It needs Python {version.group(1)} or newer." in text
    production = text[text.index("## Production"):]
    assert "(docker-compose.yml)" in production and "(docs/install.md)" in production


def test_the_index_by_reader_names_every_page_of_the_docs_once() -> None:
    text = README.read_text()
    index = text[text.index("## The docs, by reader"):]
    readers = re.findall(r"^- \*\*([^*]+)\*\*", index, re.M)
    assert readers == ["Operator", "Developer of actions", "Developer of Tidemark", "Evaluator"]
    linked = re.findall(r"\]\(docs/([\w-]+\.md)\)", index)
    assert sorted(linked) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))


async def test_the_first_plan_runs_as_printed(
        temporal_env: WorkflowEnvironment, workers: Any, task_queue: str, tmp_path: Path,
        cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tidemark start PLAN.json --follow` runs the front page's plan to its end.

    The plan is the JSON block of "Your first plan", its path made this test's own."""
    text = README.read_text()
    section = text[text.index("## Your first plan"):text.index("## Production")]
    [block] = re.findall(r"^```json\n(.*?)^```", section, re.M | re.S)
    plan = json.loads(block)
    draft = tmp_path / "draft.txt"
    draft.write_text("draft")
    plan["steps"][0]["args"]["path"] = str(draft)
    (tmp_path / "PLAN.json").write_text(json.dumps(plan))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TIDEMARK_TASK_QUEUE", task_queue)
    workers.start()
    [command] = FIRST_PLAN
    code, out, err = await cli(*command[1:])
    assert code == 0, (out, err)
    assert (tmp_path / "final.txt").read_text() == "draft" and not draft.exists()
    assert plan["task_id"] in out


def test_the_start_command_of_the_operators_guide_is_the_one_a_test_runs() -> None:
    """tests/test_run_plan.py starts a plan with README_START; docs/operate.md prints it."""
    guide = (ROOT / "docs" / "operate.md").read_text()
    assert README_START.format(task="supplier-sync-2026-11-30", file="plan.json") in guide


# -- links -----------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    for line in FENCE.sub("", markdown).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            name, n = anchor(m.group(1)), 1
            while name in found:  # a repeated heading gets -1, -2, ...
                name, n = f"{anchor(m.group(1))}-{n}", n + 1
            found.add(name)
    return found


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target} (no file {dest})")
        elif fragment and fragment not in anchors(dest.read_text()):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    return broken


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A title\n\n## Who needs me: `tidemark inbox`\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#who-needs-me-tidemark-inbox) [ok](a.md) [x](c.md) "
                    "[y](a.md#nowhere) [z](#b-title) [w](https://example.com/x)\n"
                    "```\n[in code](nothing.md)\n```\n# B title\n")
    assert [b.split(" ")[0] for b in broken_links(page)] == ["c.md", "a.md#nowhere"]


def test_the_cli_reference_names_every_command() -> None:
    """docs/reference.md's table of the `tidemark` command lists each of its commands."""
    reference = (ROOT / "docs" / "reference.md").read_text()
    table = reference[reference.index("## The `tidemark` command"):]
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sub.choices
    missing = [name for name in sub.choices if not re.search(
        rf"`tidemark {re.escape(name)}[ `]|, `{re.escape(name)}[ `]", table)]
    assert missing == []
