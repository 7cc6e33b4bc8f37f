"""docker-compose.yml and the Dockerfile, checked the way a reviewer would: Docker cannot run
here, so the files are parsed and held against each other, the project and the code."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from activities.wiring import TARGETS
from tidemark.devstack import SEARCH_ATTRIBUTES
from worker import GRACEFUL_SHUTDOWN

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
# A compose variable: $$ (a literal $ for the container's shell) or ${NAME[:-default|:?error]}.
VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_]\w*)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}"
                      r"|(?P<bare>[A-Za-z_]\w*))")
SECRET_KEY = re.compile(r"password|passwd|pwd|secret|token|key", re.IGNORECASE)
# Where a secret may come from instead of a literal: a ${...} reference or a file.
SECRET_SOURCE = re.compile(r"^(\$\{[^}]+\}|/\S+|\./\S+)$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of every instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def strings(node: Any) -> Iterator[str]:
    """Every string in the parsed file, keys included (comments are gone: compose does not
    interpolate them either)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)
    elif isinstance(node, str):
        yield node


def keyed_scalars(node: Any) -> Iterator[tuple[str, str]]:
    """(key, value) of every scalar under a key, ``KEY=value`` list items included."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str | int | float | bool):
                yield str(key), str(value)
            else:
                yield from keyed_scalars(value)
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, str) and re.match(r"^[A-Za-z_]\w*=", item):
                key, _, value = item.partition("=")
                yield key, value
            else:
                yield from keyed_scalars(item)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def command_text(service: dict[str, Any]) -> str:
    parts = [service.get(key) for key in ("entrypoint", "command")]
    return " ".join(p if isinstance(p, str) else " ".join(p) for p in parts if p)


def documented_variables() -> set[str]:
    """The variables listed in the comment block that opens docker-compose.yml."""
    header = []
    for line in COMPOSE_FILE.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    return {m.group(1) for line in header if (m := re.match(r"#\s+([A-Z][A-Z0-9_]+)\s{2,}",
                                                             line))}


def init_databases() -> set[str]:
    """Databases the Postgres init scripts create."""
    names: set[str] = set()
    for script in (ROOT / "docker" / "postgres-init").iterdir():
        names |= set(re.findall(r"CREATE DATABASE (\w+)", script.read_text()))
    return names


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative to the context) out of the build. Docker's
    rules, for patterns without ``!`` (asserted below): a pattern excludes the paths it matches
    and everything under them; ``**`` matches any number of directories."""
    patterns = [line.strip().lstrip("/") for line in (ROOT / ".dockerignore").read_text()
                .splitlines() if line.strip() and not line.startswith("#")]
    parts = Path(path).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(prefix, pattern) or (
        pattern.startswith("**/") and fnmatch.fnmatchcase(prefix.split("/")[-1], pattern[3:]))
        for pattern in patterns for prefix in prefixes)


def test_depends_on_names_services_that_exist_and_can_satisfy_the_condition(
        services: dict[str, dict[str, Any]]) -> None:
    seen = 0
    for name, service in services.items():
        depends = service.get("depends_on", {})
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        for dep, spec in depends.items():
            seen += 1
            assert dep in services, f"{name} depends on {dep}, which is not a service"
            condition = spec["condition"]
            assert condition in ("service_started", "service_healthy",
                                 "service_completed_successfully"), (name, dep, condition)
            if condition == "service_healthy":
                assert services[dep].get("healthcheck", {}).get("test"), (
                    f"{name} waits for {dep} to be healthy, but {dep} has no health check")
            if condition == "service_completed_successfully":
                # A one-shot job: restarted, it would never count as completed.
                assert services[dep].get("restart", "no") == "no", (name, dep)
    assert seen >= 5


def test_the_stack_has_the_parts_of_the_design(services: dict[str, dict[str, Any]]) -> None:
    images = {name: s.get("image", "").split(":")[0] for name, s in services.items()}
    assert images["postgres"] == "postgres"
    assert images["temporal"] == "temporalio/server"
    assert images["temporal-ui"] == "temporalio/ui"
    assert environment(services["temporal-ui"])["TEMPORAL_ADDRESS"] == "temporal:7233"
    worker = services["worker"]
    assert {dep for dep, spec in worker["depends_on"].items()
            if spec["condition"] == "service_healthy"} >= {"postgres", "temporal"}


def test_the_worker_builds_from_here_with_the_dockerfile(
        services: dict[str, dict[str, Any]]) -> None:
    build = services["worker"]["build"]
    assert build["context"] == "."
    assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()


def test_every_variable_is_documented_and_none_is_silently_empty(
        compose: dict[str, Any]) -> None:
    documented = documented_variables()
    used: set[str] = set()
    for text in strings(compose):
        for m in VARIABLE.finditer(text):
            if m.group(0) == "$$":
                continue
            name = m.group("name") or m.group("bare")
            assert m.group("bare") is None, f"write ${{{name}}}, not ${name}: {text!r}"
            assert "$" not in m.group("arg"), f"nested variable in {text!r}"
            assert m.group("op") in (":-", ":?"), (
                f"${{{name}}} needs a default (:-) or an error (:?) if unset or empty: {text!r}")
            used.add(name)
    assert used, "no variables found: the pattern is wrong"
    assert used == documented, ("referenced but not in the header comment: "
                                f"{used - documented}; listed but unused: {documented - used}")


def test_no_literal_password_token_or_key(compose: dict[str, Any]) -> None:
    checked = 0
    for key, value in keyed_scalars(compose):
        if SECRET_KEY.search(key):
            checked += 1
            assert SECRET_SOURCE.match(value), f"{key}: {value!r} is not a reference or a file"
    assert checked >= 8
    for text in strings(compose):
        for m in re.finditer(r"\w+://[^/\s:@]+:([^@\s]+)@", text):
            assert m.group(1).startswith("${"), f"a password in a URL: {text!r}"


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if "build" in service:
            continue
        image = service["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag and tag, f"{name}: {image} has no tag"
        assert tag != "latest" and "$" not in tag, f"{name}: {image} is not pinned"
        assert re.match(r"\d", tag), f"{name}: {image} names no version"


def test_postgres_and_temporal_have_health_checks(
        services: dict[str, dict[str, Any]]) -> None:
    for name in ("postgres", "temporal"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, (name, test)
        assert not services[name]["healthcheck"].get("disable", False)
    # Over TCP: the image answers on its socket during init, before the init scripts are done.
    assert "--host=127.0.0.1" in services["postgres"]["healthcheck"]["test"]


def test_the_databases_exist_before_their_users_start(
        services: dict[str, dict[str, Any]]) -> None:
    created = init_databases()
    journal = psycopg.conninfo.conninfo_to_dict(
        environment(services["worker"])["DATABASE_URL"])
    assert journal["host"] == "postgres" and journal["dbname"] in created
    temporal = environment(services["temporal"])
    assert {temporal["DBNAME"], temporal["VISIBILITY_DBNAME"]} <= created
    schema_dbs = set(re.findall(r"--db (\w+)", command_text(services["temporal-schema"])))
    assert schema_dbs == {temporal["DBNAME"], temporal["VISIBILITY_DBNAME"]}
    mounts = [v.split(":")[0] for v in services["postgres"]["volumes"]]
    assert "./docker/postgres-init" in mounts
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"bind mount {source} does not exist"


def test_the_search_attributes_are_those_of_the_dev_stack(
        services: dict[str, dict[str, Any]]) -> None:
    jobs = [name for name, s in services.items()
            if "search-attribute create" in command_text(s)]
    assert len(jobs) == 1, jobs
    job = services[jobs[0]]
    registered = dict(re.findall(r"--name (\w+) --type (\w+)", command_text(job)))
    assert registered == SEARCH_ATTRIBUTES
    assert job["depends_on"]["temporal"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"][jobs[0]]["condition"] == (
        "service_completed_successfully")


def test_the_worker_gets_what_it_reads(compose: dict[str, Any],
                                      services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    env = environment(worker)
    assert {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "DATABASE_URL"} <= env.keys()
    host, port = env["TEMPORAL_ADDRESS"].split(":")
    assert host in services and services[host]["image"].startswith("temporalio/server:")
    assert port == "7233"
    # Both credentials of every target, each from a secret file the worker is given.
    expected = {f"TIDEMARK_{t.prefix}_{kind}_TOKEN_FILE"
                for t in TARGETS.values() for kind in ("WRITE", "READ")}
    assert {k for k in env if k.endswith("_TOKEN_FILE")} == expected
    for variable in expected:
        secret = env[variable].removeprefix("/run/secrets/")
        assert secret in worker["secrets"], variable
    assert set(worker["secrets"]) <= compose["secrets"].keys()


def test_the_worker_has_time_to_finish_its_steps(services: dict[str, dict[str, Any]]) -> None:
    grace = services["worker"]["stop_grace_period"]
    m = re.fullmatch(r"(\d+)s", grace)
    assert m and int(m.group(1)) > GRACEFUL_SHUTDOWN.total_seconds(), grace


def test_the_dockerfile_builds_the_worker_as_a_user(dockerfile: list[tuple[str, str]]) -> None:
    assert dockerfile[0] == ("FROM", "python:3.11-slim")
    cmd = [args for op, args in dockerfile if op == "CMD"][-1]
    assert json.loads(cmd) == ["python", "worker.py"]  # exec form: the worker gets SIGTERM
    assert any(op == "RUN" and "pip install ." in args for op, args in dockerfile)
    users = [args for op, args in dockerfile if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert [op for op, _ in dockerfile].index("USER") < [op for op, _ in dockerfile].index(
        "CMD")


def test_the_dockerfile_copies_files_that_exist_and_are_sent(
        dockerfile: list[tuple[str, str]]) -> None:
    assert not any(line.strip().startswith("!") for line in
                   (ROOT / ".dockerignore").read_text().splitlines())
    copied = []
    for op, args in dockerfile:
        if op == "COPY":
            *sources, _dest = shlex.split(args)
            assert not any(s.startswith("--from") for s in sources)
            copied += [s for s in sources if not s.startswith("--")]
    assert "worker.py" in copied and "pyproject.toml" in copied
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: no such file"
        assert not dockerignored(source.rstrip("/")), f"COPY {source}: excluded by .dockerignore"
    # The packages pip installs (pyproject's include list) are all copied.
    pyproject = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"include = \[([^\]]*)\]", pyproject)
    assert include is not None
    packages = {p.strip('" *') for p in include.group(1).split(",")}
    assert packages <= {s.rstrip("/") for s in copied}


def test_dockerignore_keeps_secrets_and_state_out() -> None:
    for path in (".env", "secrets/stripe_write_token", ".venv/bin/python", ".git/config",
                 "tidemark/__pycache__/cli.cpython-311.pyc"):
        assert dockerignored(path), path
    assert not dockerignored("tidemark/cli.py")
