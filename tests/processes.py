"""Real child processes for the stop-signal tests: started, waited on until ready, signalled,
and killed on the way out whatever happens."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def child(argv: list[str]) -> Iterator[subprocess.Popen]:
    """``argv`` running with text stdout and stderr pipes; killed at the end if still alive."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 120.0,
               poll_s: float = 0.02) -> bool:
    """Poll ``ready()`` until true (True) or the process ended (False); fail after timeout s."""
    t0 = time.monotonic()
    while not ready():
        if proc.poll() is not None:
            return False
        assert time.monotonic() - t0 < timeout, f"{proc.args[3:5]}: not ready after {timeout} s"
        time.sleep(poll_s)
    return True


def stop(proc: subprocess.Popen, sig: int | None) -> tuple[str, str]:
    """Send ``sig`` (None: none) and collect stdout and stderr."""
    if sig is not None:
        proc.send_signal(sig)
    return proc.communicate(timeout=60)


def log_has_cycles(log, n: int) -> Callable[[], bool]:
    """A ``ready()`` for ``wait_until``: the log of a running process holds ``n`` cycles (its
    loop is running)."""
    from pkrt.rt.runtime.record.logfile import LogFileError, read_log

    def ready() -> bool:
        try:
            return read_log(log).n_cycles >= n
        except LogFileError:
            return False  # not created yet
    return ready
