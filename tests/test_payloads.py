"""The payloads every step carries between a workflow and the worker (tidemark/payloads.py)."""

from __future__ import annotations

import dataclasses
import inspect

from temporalio.converter import DataConverter

from tidemark import payloads


def test_payload_field_types_are_evaluated_not_strings() -> None:
    """Payload field types are evaluated, not strings.

    The SDK's converter reads a dataclass's field types on every payload it decodes. String
    annotations (``from __future__ import annotations`` in payloads.py) are compiled anew each time,
    which made a step's input and output 2-3x as slow to decode (bench/payload_decode.py).
    """
    classes = [c for _, c in inspect.getmembers(payloads, inspect.isclass)
               if dataclasses.is_dataclass(c) and c.__module__ == payloads.__name__]
    assert len(classes) >= 10
    stringly = {f"{c.__name__}.{f.name}" for c in classes for f in dataclasses.fields(c)
                if isinstance(f.type, str)}
    assert not stringly, f"annotations kept as strings: {sorted(stringly)}"


def test_a_step_output_round_trips_through_the_sdk_converter() -> None:
    conv = DataConverter.default.payload_converter
    out = payloads.StepOutput(step=3, status="done", resolved_by="probe", skipped=True)
    [back] = conv.from_payloads(conv.to_payloads([out]), [payloads.StepOutput])
    assert back == out and isinstance(back, payloads.StepOutput)
