"""A mail's body never appears in Temporal's history read without the codec.

It appears through the codec server; the search attributes hold only ids and state words.

A real worker with the payload codec sends a mail on the staging Gmail; the history is read as
somebody without the key reads it (a client with Temporal's default converter, and `temporal
workflow show --output json`), then through `tidemark`'s codec server over HTTP. The client
encrypts under key-a and the worker under key-b: the history of a rotation under way."""

from __future__ import annotations

import ast
import base64
import contextlib
import json
import os
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.converter import DataConverter
from temporalio.testing import WorkflowEnvironment

from helpers.codec_keys import KEYS, key_file
from helpers.staging_fixtures import effects
from staging.core import StagingServer
from tidemark.codec import KEY_ID_META, FileKeys, UnknownKey
from tidemark.needs import Need
from tidemark.settings import load_settings
from tidemark.words import TaskState
from tools.operate.codec_server import CodecServer, payloads_json
from tools.operate.starter import connect, start_plan
from tools.stack.devstack import temporal_binary
from workflows.outcome import run_result

ROOT = Path(__file__).resolve().parent.parent
# The attributes workflows may set, and what they may hold.
SEARCH_ATTRIBUTE_KEYS = {"TASK_ID", "STATE", "NEEDS"}


def suite_profile(address: str) -> dict[str, str]:
    """The Temporal settings of the suite's dev server (conftest.py's empty profile file)."""
    return {"TEMPORAL_ADDRESS": address, "TEMPORAL_CONFIG_FILE": os.environ["TEMPORAL_CONFIG_FILE"]}


def workflow_show(address: str, workflow_id: str, *extra: str) -> str:
    done = subprocess.run([temporal_binary(), "workflow", "show", "--address", address,
                           "--workflow-id", workflow_id, "--output", "json", *extra],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_a_mails_body_is_in_no_history_read_without_the_codec_and_is_through_it(
        temporal_env: WorkflowEnvironment, workers, server: StagingServer,  # type: ignore[no-untyped-def]
        task_queue: str, tmp_path: Path) -> None:
    marker = f"marker-{uuid.uuid4().hex[:12]}"
    address = temporal_env.client.service_client.config.target_host
    keys = key_file(tmp_path / "codec-keys", "key-a", "key-b")
    workers.env.update({"TIDEMARK_STAGING_URL": server.url, "TIDEMARK_CODEC_KEYS_FILE": str(keys),
                        "TIDEMARK_CODEC_KEY_ID": "key-b"})
    workers.start()
    client = await connect(load_settings({**suite_profile(address),
                                          "TIDEMARK_CODEC_KEYS_FILE": str(keys),
                                          "TIDEMARK_CODEC_KEY_ID": "key-a"}))
    task_id = f"codec-{uuid.uuid4().hex[:8]}"  # ids are in clear: the marker is not in it
    mail = {"to": [f"{marker}@supplier.example"], "subject": f"Invoice {marker}",
            "body": f"Dear supplier, {marker} is the body."}
    handle = await start_plan(client, {"task_id": task_id, "steps": [
        {"action": "gmail.send", "args": mail}]}, task_id, task_queue)
    result = await run_result(handle)
    assert result.state == TaskState.COMPLETED, result
    sent = effects(server, "gmail", "drafts.send")
    assert len(sent) == 1 and marker in json.dumps(sent)  # the mail went out, body and all

    # Read without the key: Temporal's default converter, and the `temporal` CLI's raw JSON.
    plain = await temporal_env.client.get_workflow_handle(handle.id).fetch_history()
    for raw in (plain.to_json(), workflow_show(address, handle.id)):
        text = readable(raw)
        # Payloads in clear are seen: the TidemarkState search attribute's, "completed".
        assert '"completed"' in text and '"completed"' not in raw
        assert marker not in text and "supplier.example" not in text
    ids = {p.metadata[KEY_ID_META] for p in payloads_of(plain.events)
           if KEY_ID_META in p.metadata}
    assert ids == {b"key-a", b"key-b"}  # the plan under the client's key, the steps the worker's

    # Through the codec server, over HTTP, as the Web UI and the CLI read it.
    with CodecServer(FileKeys("key-b", KEYS), port=0) as codec:
        decoded = readable(workflow_show(address, handle.id, "--codec-endpoint", codec.url))
        assert marker in decoded and f"{marker}@supplier.example" in decoded
        request = payloads_json(list(payloads_of(plain.events)))
        with urllib.request.urlopen(urllib.request.Request(
                f"{codec.url}/decode", data=request, method="POST",
                headers={"Content-Type": "application/json"}), timeout=10) as r:
            clear = json_format.Parse(r.read(), Payloads()).payloads
        values = json.dumps(DataConverter.default.payload_converter.from_payloads(clear),
                            default=str)
        assert f"Dear supplier, {marker} is the body." in values

    # Search attributes are indexed in clear: only the task id and state words.
    assert search_attribute_values(plain.events) <= {task_id, *TaskState, *Need}

    # A client that holds key-a alone (it dropped key-b): one line naming key-b.
    only_a = key_file(tmp_path / "only-a", "key-a")
    lacking = await connect(load_settings({**suite_profile(address),
                                           "TIDEMARK_CODEC_KEYS_FILE": str(only_a)}))
    with pytest.raises(UnknownKey, match="under key id 'key-b' and this process holds key-a"):
        await run_result(lacking.get_workflow_handle(handle.id))


def readable(history_json: str) -> str:
    """A history's JSON with every payload's data (base64 there) decoded beside it.

    The JSON of a history holds each payload's bytes in base64: a body in clear would not show
    as text without this."""
    found = [history_json]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "data" and isinstance(v, str):
                    with contextlib.suppress(ValueError):
                        found.append(base64.b64decode(v, validate=True).decode(errors="replace"))
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(history_json))
    return "\n".join(found)


def payloads_of(events):  # type: ignore[no-untyped-def]
    """Every payload in the events (inputs, results, summaries), found by walking the protos."""
    from google.protobuf.message import Message
    from temporalio.api.common.v1 import Payload

    def walk(m: Message):  # type: ignore[no-untyped-def]
        if isinstance(m, Payload):
            yield m
            return
        for field, value in m.ListFields():
            if field.message_type is None:
                continue
            if isinstance(value, Message):
                yield from walk(value)
                continue
            items = value.values() if field.message_type.GetOptions().map_entry else value
            for v in items:
                if isinstance(v, Message):
                    yield from walk(v)

    for e in events:
        yield from walk(e)


def search_attribute_values(events) -> set[str]:  # type: ignore[no-untyped-def]
    converter = DataConverter.default.payload_converter
    found: set[str] = set()
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            fields = e.workflow_execution_started_event_attributes.search_attributes.indexed_fields
        elif e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes \
                .indexed_fields
        else:
            continue
        for p in fields.values():
            value = converter.from_payload(p)
            found |= set(value) if isinstance(value, list) else {str(value)}
    return found


def test_workflows_set_only_the_id_and_state_attributes() -> None:
    """Every attribute a workflow upserts or starts a child with is TASK_ID, STATE or NEEDS.

    Temporal indexes search attributes in clear, outside the codec: none may carry a
    recipient, a subject, a body or an amount. The values are held by the run above."""
    set_keys: set[str] = set()
    for path in (ROOT / "workflows").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "value_set":
                set_keys.add(ast.unparse(f.value))
            elif isinstance(f, ast.Name | ast.Attribute) and ast.unparse(f).endswith(
                    "SearchAttributePair") and node.args:
                set_keys.add(ast.unparse(node.args[0]))
    assert set_keys and set_keys <= SEARCH_ATTRIBUTE_KEYS, set_keys
    from workflows.shared import NEEDS, SEARCH_ATTRIBUTES, STATE, TASK_ID
    assert [k.name for k in SEARCH_ATTRIBUTES] == [TASK_ID.name, STATE.name, NEEDS.name]

