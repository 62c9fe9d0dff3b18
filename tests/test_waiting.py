"""tests/waiting.py: a wait returns as soon as the condition holds, and fails naming it."""

from __future__ import annotations

import threading
import time

import pytest

from .waiting import wait_for


def test_returns_the_first_true_value_set_by_another_thread():
    box: list[int] = []
    t = threading.Timer(0.01, lambda: box.append(7))
    t.start()
    try:
        assert wait_for(lambda: box and box[0], 10.0, "the timer's value") == 7
    finally:
        t.cancel()


def test_fails_with_what_it_waited_for():
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"waited 0.05 s for the impossible: not seen"):
        wait_for(lambda: False, 0.05, "the impossible")
    assert time.monotonic() - t0 >= 0.05
