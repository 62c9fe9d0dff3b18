"""Waiting on another thread's or process' state: poll a condition until a deadline, never
sleep a fixed time and then assert."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, poll_s: float = 0.0005) -> T:
    """The first true value of ``predicate()``, polled every ``poll_s`` s; fails the test with
    ``what`` (the condition waited for) when ``timeout`` s pass without it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}: not seen")
        time.sleep(poll_s)
