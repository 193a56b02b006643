"""Telling an out-of-memory error from other errors, and its one line.

Shared by the trials (a trial that runs out of memory did not fit) and the
OOM report (which turns such an error into a report).
"""

from __future__ import annotations

import re

import tensorflow as tf

_OOM_TEXT = (
    "out of memory",
    "oom when allocating",
    "resource_exhausted",
    "resource exhausted",
)


def is_oom(error: BaseException) -> bool:
    """Whether `error` is TensorFlow (or XLA) running out of device memory."""
    if isinstance(error, tf.errors.ResourceExhaustedError):
        return True
    if isinstance(error, (tf.errors.InternalError, tf.errors.UnknownError)):
        text = str(error).lower()
        return any(t in text for t in _OOM_TEXT)
    return False


def first_line(error: BaseException, limit: int = 300) -> str:
    """The line of `error` that says what ran out (Keras wraps the text)."""
    lines = [
        re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
        for line in str(error).splitlines()
    ]
    lines = [line for line in lines if line]
    for line in lines:
        if any(t in line.lower() for t in _OOM_TEXT):
            return line[:limit]
    return (lines[0] if lines else type(error).__name__)[:limit]
