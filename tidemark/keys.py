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
