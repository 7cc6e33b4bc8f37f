"""Deterministic idempotency keys.

The key is stamped into the outside world (mail headers, Stripe's Idempotency-Key, Drive
appProperties), so its formula can never change: a different formula would make every key
already written out there unrecognisable to our probes. tests/test_keys.py pins it.
"""

import hashlib
import json
from typing import Any

KEY_LENGTH = 32  # hex characters: 128 bits, ample against collisions within one journal


def key_for(task_id: str, step: int, action: str, args: dict[str, Any]) -> str:
    """Returns the idempotency key of one step of one task.

    Args:
        task_id: The task the step belongs to.
        step: The step's number, counted from 1.
        action: The registered action name, e.g. ``"drive.rename"``.
        args: The step's (normalised) arguments.

    Returns:
        The first 32 hex characters of sha256 over ``json.dumps([task_id, step, action, args],
        sort_keys=True)`` with json's default separators.
    """
    payload = json.dumps([task_id, step, action, args], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:KEY_LENGTH]


def lock_id(task_id: str, phase: str, step: int) -> int:
    """The signed 64-bit Postgres advisory-lock id of one step of one task.

    It is derived from the step's place, not from its key, so that the lock can be taken in
    the same round trip that reads the step (the key needs the step's args first). A step's
    place determines its key within a persisted plan, so the two are equivalent.
    """
    digest = hashlib.sha256(json.dumps([task_id, phase, step]).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
