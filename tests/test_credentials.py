"""Credentials that last: every form loads from its file and refreshes against staging.

The endpoints are staging's OAuth ones (staging/oauth). A plan outliving several token lifetimes
completes with every effect once; an expired token is renewed (a write too: a 401 was not processed)
and never taken for a revoked grant, while a revoked grant still stops the task.

Real libraries over HTTP (google-auth, azure-identity, msal; the Google, Graph and Stripe
clients), a staging server with a TLS listener for the Microsoft authority (msal accepts only
https), real Postgres.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from googleapiclient.errors import HttpError

from activities.drive import drive_client
from activities.granted import acting_for, granted_google
from activities.graph import GraphSendMail
from activities.wiring import credentials, worker_registry
from helpers.steps import step_context
from probes.graph import graph_client
from staging.core import DEFAULT_ACCOUNT, StagingServer
from staging.drive import DEFAULT_WRITE_TOKEN, DriveTarget
from staging.graph import SEND_TOKEN, GraphTarget
from staging.targets import build_staging
from tidemark.actions import StepContext
from tidemark.credentials import RefreshingSource
from tidemark.errors import ConfigError, Unauthorized
from tidemark.grants import GrantBroker, LocalMinter, revoke_task_grants
from tidemark.plan import load_plan
from tidemark.run_step import run_step
from tidemark.store import JournalStore

TENANT = "contoso-tenant"
SA_EMAIL = "tidemark@project.iam.gserviceaccount.com"
GOOGLE_CLIENT = ("123.apps.googleusercontent.com", "google-client-secret")
# Both Google credentials act for the staging default account, whose Drive and mailbox the
# targets seed (the subject of domain-wide delegation, or the user who consented).
SUBJECT = DEFAULT_ACCOUNT
DRIVE_READ = "https://www.googleapis.com/auth/drive.metadata.readonly"
GMAIL_SCOPES = ["https://www.googleapis.com/auth/gmail.compose",
                "https://www.googleapis.com/auth/gmail.readonly"]
GRAPH_ROLES_WRITE = ["Mail.ReadWrite", "Mail.Send", "User.Read.All"]
GRAPH_ROLES_READ = ["Mail.Read", "User.Read.All"]
# Quick tests, yet several lifetimes per plan: sources renew at three quarters of a lifetime.
LIFETIME_S = 1.0


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_server(ca: trustme.CA) -> Iterator[StagingServer]:
    """A staging server of its own with an https listener (the Microsoft authority)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    with StagingServer(build_staging(), tls=context) as s:
        yield s


@pytest.fixture
def oauth(tls_server: StagingServer) -> StagingServer:
    tls_server.staging.reset()
    return tls_server


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "staging-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def control(server: StagingServer, path: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(server.url + path, method="POST" if body is not None else "GET",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def service_account_file(server: StagingServer, path: Path, *, register: bool = True) -> str:
    """A Google service-account key file whose token_uri is staging's.

    Its public key is registered there unless ``register`` is false."""
    key = _key()
    if register:
        public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
        control(server, "/_staging/oauth/google/service_accounts",
                {"client_email": SA_EMAIL, "public_key": public.decode()})
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "tidemark-test", "private_key_id": "k1",
        "private_key": _pem(key), "client_email": SA_EMAIL, "client_id": "1",
        "token_uri": server.url + "/token"}))
    return str(path)


def authorized_user_file(server: StagingServer, path: Path, scopes: list[str],
                         refresh_token: str = "1//staging-refresh") -> str:
    control(server, "/_staging/oauth/google/refresh_tokens", {
        "refresh_token": refresh_token, "client_id": GOOGLE_CLIENT[0],
        "client_secret": GOOGLE_CLIENT[1], "account": SUBJECT, "scopes": scopes})
    path.write_text(json.dumps({
        "type": "authorized_user", "client_id": GOOGLE_CLIENT[0],
        "client_secret": GOOGLE_CLIENT[1], "refresh_token": refresh_token,
        "token_uri": server.url + "/token"}))
    return str(path)


def graph_secret_file(server: StagingServer, path: Path, client_id: str, roles: list[str],
                      ca_file: str) -> str:
    control(server, "/_staging/oauth/microsoft/apps", {
        "tenant": TENANT, "client_id": client_id, "client_secret": "s3cret-" + client_id,
        "roles": roles})
    path.write_text(json.dumps({"tenant_id": TENANT, "client_id": client_id,
                                "client_secret": "s3cret-" + client_id,
                                "authority": server.tls_url, "ca_bundle": ca_file}))
    return str(path)


def graph_certificate_file(server: StagingServer, path: Path, client_id: str,
                           roles: list[str], ca_file: str) -> str:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, client_id)])
    now = time.time()
    import datetime as dt
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(dt.datetime.fromtimestamp(now - 60, dt.UTC))
            .not_valid_after(dt.datetime.fromtimestamp(now + 86400, dt.UTC))
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    control(server, "/_staging/oauth/microsoft/apps", {
        "tenant": TENANT, "client_id": client_id, "certificate": cert_pem, "roles": roles})
    pem = path.with_suffix(".pem")
    pem.write_text(_pem(key) + cert_pem)
    path.write_text(json.dumps({"tenant_id": TENANT, "client_id": client_id,
                                "certificate_path": str(pem), "authority": server.tls_url,
                                "ca_bundle": ca_file}))
    return str(path)


def graph_refresh_file(server: StagingServer, path: Path, client_id: str, scopes: list[str],
                       ca_file: str) -> str:
    rt = "0.staging-consent-" + client_id
    control(server, "/_staging/oauth/microsoft/refresh_tokens", {
        "tenant": TENANT, "client_id": client_id, "refresh_token": rt, "account": SUBJECT,
        "scopes": scopes})
    path.write_text(json.dumps({"tenant_id": TENANT, "client_id": client_id,
                                "refresh_token": rt, "authority": server.tls_url,
                                "ca_bundle": ca_file}))
    return str(path)


def google_env(server: StagingServer, tmp_path: Path) -> dict[str, str]:
    """Drive by service-account key (delegated to SUBJECT), Gmail by authorized-user files."""
    sa = service_account_file(server, tmp_path / "sa.json")
    return {
        "TIDEMARK_DRIVE_URL": server.url, "TIDEMARK_DRIVE_WRITE_CREDENTIALS_FILE": sa,
        "TIDEMARK_DRIVE_READ_CREDENTIALS_FILE": sa, "TIDEMARK_DRIVE_SUBJECT": SUBJECT,
        "TIDEMARK_GMAIL_URL": server.url,
        "TIDEMARK_GMAIL_WRITE_CREDENTIALS_FILE": authorized_user_file(
            server, tmp_path / "gmail-user.json", GMAIL_SCOPES),
        "TIDEMARK_GMAIL_READ_CREDENTIALS_FILE": authorized_user_file(
            server, tmp_path / "gmail-user.json", GMAIL_SCOPES),
    }


def graph_app_env(server: StagingServer, tmp_path: Path, ca_file: str) -> dict[str, str]:
    """Graph app-only: the write app by client secret, the read app by certificate."""
    user = server.staging.targets["graph"]
    assert isinstance(user, GraphTarget)
    return {
        "TIDEMARK_GRAPH_URL": server.url, "TIDEMARK_GRAPH_USER": user.box().address,
        "TIDEMARK_GRAPH_WRITE_CREDENTIALS_FILE": graph_secret_file(
            server, tmp_path / "graph-write.json", "app-write", GRAPH_ROLES_WRITE, ca_file),
        "TIDEMARK_GRAPH_READ_CREDENTIALS_FILE": graph_certificate_file(
            server, tmp_path / "graph-read.json", "app-read", GRAPH_ROLES_READ, ca_file),
        "TIDEMARK_GRAPH_CONFIRM_S": "2",
    }


def issued(server: StagingServer) -> list[dict[str, Any]]:
    return control(server, "/_staging/oauth/issued")


def source_of(env: dict[str, str], target: str, scope: str) -> RefreshingSource:
    c = credentials(env, target)
    assert c is not None
    source = c.write if scope == "write" else c.read
    assert isinstance(source, RefreshingSource)
    return source


def _token(server: StagingServer, value: str) -> Any:
    return server.staging.tokens[value]


# -- each form loads and refreshes ----------------------------------------------------------


@pytest.mark.parametrize("form", ["service_account", "authorized_user"])
def test_a_google_credential_file_loads_and_refreshes_at_its_token_uri(
        oauth: StagingServer, tmp_path: Path, form: str) -> None:
    control(oauth, "/_staging/oauth/settings", {"lifetime_s": LIFETIME_S})
    env = google_env(oauth, tmp_path)
    target = "drive" if form == "service_account" else "gmail"
    read = source_of(env, target, "read")
    first = read.token()
    tok = _token(oauth, first)
    assert (tok.target, tok.account) == (target, SUBJECT)
    # The read credential is asked for the read-only scope only.
    assert tok.scopes == ([DRIVE_READ] if target == "drive" else [GMAIL_SCOPES[1]])
    assert read.token() == first  # cached while fresh
    time.sleep(LIFETIME_S * 0.8)  # past three quarters of its life: renewed before use
    second = read.token()
    assert second != first and read.refreshes == 2
    grant = "urn:ietf:params:oauth:grant-type:jwt-bearer" if form == "service_account" \
        else "refresh_token"
    assert [i["grant_type"] for i in issued(oauth)] == [grant, grant]


def test_google_refuses_a_key_whose_signature_staging_cannot_verify(
        oauth: StagingServer, tmp_path: Path) -> None:
    service_account_file(oauth, tmp_path / "registered.json")  # registers one key ...
    other = service_account_file(oauth, tmp_path / "other.json", register=False)  # signs w/ another
    env = {"TIDEMARK_DRIVE_URL": oauth.url, "TIDEMARK_DRIVE_WRITE_CREDENTIALS_FILE": other,
           "TIDEMARK_DRIVE_READ_CREDENTIALS_FILE": other}
    with pytest.raises(Unauthorized, match="Invalid JWT Signature"):
        source_of(env, "drive", "read").token()
    assert issued(oauth) == []


@pytest.mark.parametrize("form", ["client_secret", "certificate", "refresh_token"])
def test_a_microsoft_credential_file_loads_and_refreshes_over_https(
        oauth: StagingServer, tmp_path: Path, ca_file: str, form: str) -> None:
    control(oauth, "/_staging/oauth/settings", {"lifetime_s": LIFETIME_S})
    path = tmp_path / "graph.json"
    if form == "client_secret":
        graph_secret_file(oauth, path, "app-1", GRAPH_ROLES_READ, ca_file)
    elif form == "certificate":
        graph_certificate_file(oauth, path, "app-1", GRAPH_ROLES_READ, ca_file)
    else:
        graph_refresh_file(oauth, path, "app-1", ["Mail.Read", "User.Read"], ca_file)
    env = {"TIDEMARK_GRAPH_URL": oauth.url,
           "TIDEMARK_GRAPH_WRITE_CREDENTIALS_FILE": str(path),
           "TIDEMARK_GRAPH_READ_CREDENTIALS_FILE": str(path)}
    if form != "refresh_token":  # delegated: /me is the consenting user's mailbox
        env["TIDEMARK_GRAPH_USER"] = "agent@staging.example"
    c = credentials(env, "graph")
    assert c is not None and c.graph_user == (None if form == "refresh_token"
                                              else "agent@staging.example")
    read = c.read
    assert isinstance(read, RefreshingSource)
    first = read.token()
    tok = _token(oauth, first)
    assert tok.target == "graph"
    assert tok.account == ("app-only" if form != "refresh_token" else SUBJECT)
    time.sleep(LIFETIME_S * 0.8)
    assert read.token() != first and read.refreshes == 2
    assert [i["token_kind"] for i in issued(oauth)] == ["microsoft", "microsoft"]


def test_app_only_graph_credentials_need_the_mailbox_to_act_on(
        oauth: StagingServer, tmp_path: Path, ca_file: str) -> None:
    path = graph_secret_file(oauth, tmp_path / "g.json", "app-1", GRAPH_ROLES_READ, ca_file)
    env = {"TIDEMARK_GRAPH_URL": oauth.url, "TIDEMARK_GRAPH_WRITE_CREDENTIALS_FILE": path,
           "TIDEMARK_GRAPH_READ_CREDENTIALS_FILE": path}
    with pytest.raises(ConfigError, match="TIDEMARK_GRAPH_USER"):
        credentials(env, "graph")


def test_a_worker_binds_every_target_from_credential_files(
        oauth: StagingServer, tmp_path: Path, ca_file: str) -> None:
    env = {**google_env(oauth, tmp_path), **graph_app_env(oauth, tmp_path, ca_file)}
    registry = worker_registry(env)  # check_identity of each: both credentials, one account
    for name in ("drive.rename", "gmail.send", "graph.send_mail"):
        registry.bound(name)
    kinds = sorted({(i["target"], i["grant_type"]) for i in issued(oauth)})
    assert kinds == [("drive", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                     ("gmail", "refresh_token"), ("graph", "client_credentials")]


# -- a long plan across token expiry --------------------------------------------------------


def _plan(drive: DriveTarget, task: str, rounds: int) -> tuple[dict[str, Any], list[str]]:
    """Drive renames, then Gmail and Graph sends, ``rounds`` of each."""
    ids = [drive.seed(f"{task}-{i}.pdf").id for i in range(rounds)]
    steps: list[dict[str, Any]] = [
        {"action": "drive.rename", "args": {"file_id": f, "name": f"{task}-{i} done.pdf"}}
        for i, f in enumerate(ids)]
    mail = {"to": ["ap@supplier.example"], "body": "b"}
    for i in range(rounds):
        steps += [{"action": "gmail.send", "args": {**mail, "subject": f"{task} {i}"}},
                  {"action": "graph.send_mail", "args": {**mail, "subject": f"{task} {i}"}}]
    return {"task_id": task, "steps": steps}, ids


@pytest.mark.parametrize("grants", ["local", "staging"])
def test_a_plan_outliving_several_token_lifetimes_completes_with_every_effect_once(
        oauth: StagingServer, store: JournalStore, tmp_path: Path, ca_file: str,
        grants: str) -> None:
    control(oauth, "/_staging/oauth/settings", {"lifetime_s": LIFETIME_S})
    env = {**google_env(oauth, tmp_path), **graph_app_env(oauth, tmp_path, ca_file),
           "TIDEMARK_DRIVE_HORIZON_S": "0"}
    if grants == "staging":  # per-task tokens minted at staging, each no longer than its base
        env["TIDEMARK_STAGING_URL"] = oauth.url
    registry = worker_registry(env)
    drive = oauth.staging.targets["drive"]
    assert isinstance(drive, DriveTarget)
    task = f"long-{grants}"
    rounds = 4
    doc, ids = _plan(drive, task, rounds)
    plan = load_plan(doc, registry)
    store.persist_plan(plan)
    broker = GrantBroker(store)
    started = time.monotonic()
    results = []
    with acting_for(broker, task):
        for step in range(1, len(doc["steps"]) + 1):
            results.append(run_step(store, registry, task, step))
            time.sleep(LIFETIME_S / 4)  # a plan that takes its time between steps
    elapsed = time.monotonic() - started
    assert elapsed > 3 * LIFETIME_S  # it outlived several token lifetimes
    assert [r.status for r in results] == ["done"] * len(doc["steps"])  # 0 stops
    effects = oauth.staging.effects
    for target, op in (("drive", "files.update"), ("gmail", "drafts.send"),
                       ("graph", "message.send")):
        keys = [e.key for e in effects if e.target == target and e.op == op]
        assert len(keys) == rounds and len(set(keys)) == rounds, (target, keys)
    assert sorted(drive.files[f].name for f in ids) == [f"{task}-{i} done.pdf"
                                                       for i in range(rounds)]
    # Tokens were renewed along the way, and no request was refused for an expired one.
    assert len(issued(oauth)) > 2 * 6  # six sources, each renewed more than once
    refused = [r for r in oauth.staging.requests if r.status == 401]
    assert refused == []
    assert not [e for e in store.events(task) if e["kind"] in ("error", "grant")]


# -- expired is not revoked -----------------------------------------------------------------


def test_a_write_whose_token_expired_early_is_renewed_and_sent_once(
        oauth: StagingServer, store: JournalStore, tmp_path: Path, ca_file: str) -> None:
    env = {**google_env(oauth, tmp_path), **graph_app_env(oauth, tmp_path, ca_file),
           "TIDEMARK_DRIVE_HORIZON_S": "0"}
    registry = worker_registry(env)
    started = len(oauth.staging.requests)  # the start's writes (its Drive stamp check) before
    drive = oauth.staging.targets["drive"]
    assert isinstance(drive, DriveTarget)
    f = drive.seed("early.pdf")
    doc = {"task_id": "early", "steps": [
        {"action": "drive.rename", "args": {"file_id": f.id, "name": "early done.pdf"}},
        {"action": "graph.send_mail", "args": {"to": ["ap@supplier.example"], "subject": "s",
                                               "body": "b"}}]}
    store.persist_plan(load_plan(doc, registry))
    broker = GrantBroker(store)
    with acting_for(broker, "early"):
        for step in (1, 2):
            # Every token the sources hold is cut short at the provider: their next use is a
            # 401, though the sources still think them fresh.
            control(oauth, "/_staging/oauth/expire", {})
            assert run_step(store, registry, "early", step).status == "done"
    writes = [(r.target, r.route, r.status) for r in oauth.staging.requests[started:]
              if r.target in ("drive", "graph")]
    # Each write was refused once with the expired token and then applied once.
    assert writes[:2] == [("drive", "/drive/v3/files/{file_id}", 401),
                          ("drive", "/drive/v3/files/{file_id}", 200)]
    graph_creates = [w for w in writes if w[0] == "graph" and w[1].endswith("/messages")]
    assert [w[2] for w in graph_creates] == [401, 201]
    assert len([e for e in oauth.staging.effects if e.op in ("files.update",
                                                              "message.send")]) == 2
    assert drive.files[f.id].name == "early done.pdf"
    assert not [e for e in store.events("early") if e["kind"] in ("error", "grant")]


def test_a_revoked_grant_still_stops_the_task_when_tokens_refresh(
        oauth: StagingServer, store: JournalStore, tmp_path: Path) -> None:
    env = {**google_env(oauth, tmp_path), "TIDEMARK_DRIVE_HORIZON_S": "0"}
    registry = worker_registry(env)
    drive = oauth.staging.targets["drive"]
    assert isinstance(drive, DriveTarget)
    files = [drive.seed(f"k{i}.pdf") for i in range(2)]
    doc = {"task_id": "killed", "steps": [
        {"action": "drive.rename", "args": {"file_id": f.id, "name": f"k{i} done.pdf"}}
        for i, f in enumerate(files)]}
    store.persist_plan(load_plan(doc, registry))
    broker = GrantBroker(store)
    with acting_for(broker, "killed"):
        assert run_step(store, registry, "killed", 1).status == "done"
    store.set_killed("killed", "drill", "ops")  # what `tidemark kill` does first
    revoke_task_grants(store, "killed", "ops")
    control(oauth, "/_staging/oauth/expire", {})  # and the base tokens lapse meanwhile
    before = len(oauth.staging.requests)
    step = doc["steps"][1]
    with acting_for(broker, "killed"), pytest.raises(Unauthorized, match="revoked"):
        registry.bound("drive.rename").execute(StepContext(
            task_id="killed", step=2, action="drive.rename", args=step["args"],
            key="2" * 32))  # a wedged worker's call, after the kill
    assert len(oauth.staging.requests) == before  # the killed task wrote nothing more
    assert drive.files[files[1].id].name == "k1.pdf"


def test_graph_app_only_tokens_address_users_and_delegated_ones_only_their_own(
        oauth: StagingServer, tmp_path: Path, ca_file: str) -> None:
    import httpx

    from tidemark import staging_tokens
    path = graph_secret_file(oauth, tmp_path / "g.json", "app-1", GRAPH_ROLES_READ, ca_file)
    env = {"TIDEMARK_GRAPH_URL": oauth.url, "TIDEMARK_GRAPH_USER": "agent@staging.example",
           "TIDEMARK_GRAPH_WRITE_CREDENTIALS_FILE": path,
           "TIDEMARK_GRAPH_READ_CREDENTIALS_FILE": path}
    app = source_of(env, "graph", "read").token()
    graph = oauth.staging.targets["graph"]
    assert isinstance(graph, GraphTarget)
    graph.add_mailbox("bob", "bob@staging.example")

    def get(path: str, token: str) -> httpx.Response:
        return httpx.get(oauth.url + "/v1.0" + path, timeout=5,
                         headers={"Authorization": "Bearer " + token})

    assert get("/me", app).status_code == 400  # an app has no /me
    assert get("/users/agent@staging.example", app).json()["mail"] == "agent@staging.example"
    assert get("/users/bob@staging.example/messages", app).status_code == 200  # any mailbox
    assert get("/users/nobody@staging.example", app).status_code == 404
    delegated = staging_tokens.GRAPH_READ
    me = get("/me", delegated).json()
    assert get(f"/users/{me['id']}/messages", delegated).status_code == 200  # its own
    refused = get("/users/bob@staging.example/messages", delegated)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "ErrorAccessDenied"


def test_bad_credential_configuration_is_refused_with_a_clear_error(
        oauth: StagingServer, tmp_path: Path) -> None:
    sa = service_account_file(oauth, tmp_path / "sa.json")
    both = {"TIDEMARK_DRIVE_URL": oauth.url, "TIDEMARK_DRIVE_WRITE_CREDENTIALS_FILE": sa,
            "TIDEMARK_DRIVE_WRITE_TOKEN": "ya29.x", "TIDEMARK_DRIVE_READ_CREDENTIALS_FILE": sa}
    with pytest.raises(ConfigError, match="both TIDEMARK_DRIVE_WRITE_TOKEN and "
                                          "TIDEMARK_DRIVE_WRITE_CREDENTIALS_FILE"):
        credentials(both, "drive")
    with pytest.raises(ConfigError, match="stripe takes only a static key"):
        credentials({"TIDEMARK_STRIPE_WRITE_CREDENTIALS_FILE": sa,
                     "TIDEMARK_STRIPE_READ_TOKEN": "rk_test_x"}, "stripe")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match=r"TIDEMARK_GMAIL_READ_CREDENTIALS_FILE: .* not JSON"):
        credentials({"TIDEMARK_GMAIL_WRITE_CREDENTIALS_FILE": sa,
                     "TIDEMARK_GMAIL_READ_CREDENTIALS_FILE": str(broken)}, "gmail")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"type": "external_account"}))
    with pytest.raises(ConfigError, match="expected a Google 'service_account' key"):
        credentials({"TIDEMARK_GMAIL_WRITE_CREDENTIALS_FILE": str(other),
                     "TIDEMARK_GMAIL_READ_CREDENTIALS_FILE": sa}, "gmail")
    # A credential file pointed at the staging URL by TIDEMARK_STAGING_URL alone is refused.
    with pytest.raises(ConfigError, match="TIDEMARK_DRIVE_WRITE_CREDENTIALS_FILE and "
                                          "TIDEMARK_DRIVE_READ_CREDENTIALS_FILE are set but"):
        credentials({"TIDEMARK_STAGING_URL": oauth.url,
                     "TIDEMARK_DRIVE_WRITE_CREDENTIALS_FILE": sa,
                     "TIDEMARK_DRIVE_READ_CREDENTIALS_FILE": sa}, "drive")


def test_threads_share_one_refresh_and_a_withdrawn_consent_stops_with_unauthorized(
        oauth: StagingServer, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor
    path = authorized_user_file(oauth, tmp_path / "u.json", GMAIL_SCOPES, "1//consent")
    env = {"TIDEMARK_GMAIL_URL": oauth.url, "TIDEMARK_GMAIL_WRITE_CREDENTIALS_FILE": path,
           "TIDEMARK_GMAIL_READ_CREDENTIALS_FILE": path}
    source = source_of(env, "gmail", "write")
    with ThreadPoolExecutor(8) as pool:
        tokens = set(pool.map(lambda _: source.token(), range(16)))
    assert len(tokens) == 1 and len(issued(oauth)) == 1  # one refresh for all of them
    control(oauth, "/_staging/oauth/revoke", {"refresh_token": "1//consent"})
    with pytest.raises(Unauthorized, match=r"refused to refresh.*invalid_grant"):
        source.renew(tokens.pop())


def drive_writes(server: StagingServer) -> list[int | None]:
    """The statuses of the Drive writes the staging server received, in order."""
    return [r.status for r in server.staging.requests if r.target == "drive"]


def test_a_refused_token_that_cannot_be_renewed_is_not_sent_again(
        oauth: StagingServer) -> None:
    """A refused token that cannot be renewed is not sent again.

    A static token (staging, a Stripe-style key) has nothing fresher to offer. After its 401 the
    request is not sent again, and the 401 stands."""
    drive = oauth.staging.targets["drive"]
    assert isinstance(drive, DriveTarget)
    f = drive.seed("static.pdf")
    control(oauth, "/_staging/tokens", {"token": "static-write", "like": DEFAULT_WRITE_TOKEN})
    control(oauth, "/_staging/tokens/static-write/revoke", {})
    service = granted_google(drive_client(oauth.url, "static-write"), "drive", "write",
                             LocalMinter())
    with pytest.raises(HttpError) as refused:
        service.files().update(fileId=f.id, body={"name": "renamed.pdf"}).execute()
    assert refused.value.resp.status == 401
    assert drive_writes(oauth) == [401]  # sent once, never again with the same token
    assert drive.files[f.id].name == "static.pdf"


def test_graphs_transport_never_sends_again_with_the_token_graph_refused(
        oauth: StagingServer) -> None:
    """Graph's transport never resends after a 401 with the token Graph refused.

    A static token renews to itself, so after its 401 the draft is
    not posted again with the very token Graph refused, and the 401 stands."""
    control(oauth, "/_staging/tokens", {"token": "static-graph", "like": SEND_TOKEN})
    control(oauth, "/_staging/tokens/static-graph/revoke", {})
    client = graph_client(oauth.url, "static-graph", timeout=5.0)
    args = {"to": ["bob@example.com"], "subject": "Invoice 42", "body": "Details below."}
    with pytest.raises(Unauthorized):
        GraphSendMail(writer=client, reader=client).stage(step_context("graph.send_mail", args))
    assert [r.status for r in oauth.staging.requests if r.target == "graph"] == [401]


class RefusedOnArrival(RefreshingSource):
    """A token endpoint whose every token the provider refuses, up to ``limit`` tokens.

    Its clock is ahead of ours: each token has expired by the time it is presented."""

    def __init__(self, server: StagingServer, limit: int = 6) -> None:
        super().__init__()
        self.server, self.limit = server, limit

    def describe(self) -> str:
        return "tokens expired on arrival"

    def _fetch(self, forced: bool) -> tuple[str, float]:
        if self.refreshes >= self.limit:
            raise Unauthorized("the token endpoint gave up")
        token = f"skewed-{self.refreshes}"
        control(self.server, "/_staging/tokens",
                {"token": token, "like": DEFAULT_WRITE_TOKEN, "expires_in": 0})
        return token, time.time() + 3600.0  # what our clock believes


def test_after_a_401_a_request_is_sent_again_at_most_once(oauth: StagingServer) -> None:
    """After a 401, a request is sent again at most once.

    Each renewal brings a new token, and the provider refuses that one too. The request goes out
    twice (the second time with the renewed token), then the 401 stands."""
    drive = oauth.staging.targets["drive"]
    assert isinstance(drive, DriveTarget)
    f = drive.seed("skewed.pdf")
    source = RefusedOnArrival(oauth)
    service = granted_google(drive_client(oauth.url, "unused"), "drive", "write",
                             LocalMinter(), source)
    with pytest.raises(HttpError) as refused:
        service.files().update(fileId=f.id, body={"name": "renamed.pdf"}).execute()
    assert refused.value.resp.status == 401
    assert drive_writes(oauth) == [401, 401]
    assert source.refreshes == 2  # the first token, and one renewal
    assert drive.files[f.id].name == "skewed.pdf"
