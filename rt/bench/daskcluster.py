"""A Dask scheduler and workers as separate processes on localhost, as a user starts them
(``dask scheduler``, ``dask worker ADDRESS --nthreads 1``): for the tests and the benchmark."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent  # the venv's scripts: pkrt, dask


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_mb(pid: int) -> float | None:
    """Peak resident set size of a live process (VmHWM, Linux), MB; None elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class ProcessCluster:
    """``with ProcessCluster(2, logs) as c:`` -> c.address (tcp://127.0.0.1:PORT), c.client
    (a distributed.Client), c.scheduler and c.workers (Popen). ``nanny``: each worker under a
    nanny that restarts it when it dies (the Popen is then the nanny's). Every process is
    stopped on exit, also when the start fails."""

    def __init__(self, n_workers: int, logs: Path, nanny: bool = True, timeout: float = 60.0):
        self.n_workers, self.logs, self.nanny, self.timeout = n_workers, Path(logs), nanny, timeout
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.client = None

    def _start(self, name: str, *argv: str) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "wb") as out:
            return subprocess.Popen([str(BIN / "dask"), *argv], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def __enter__(self) -> "ProcessCluster":
        import distributed

        try:
            port = self.address.rsplit(":", 1)[1]
            self.scheduler = self._start("scheduler", "scheduler", "--host", "127.0.0.1",
                                         "--port", port, "--no-dashboard")
            for i in range(self.n_workers):
                self.workers.append(self._start(
                    f"worker{i}", "worker", self.address, "--nthreads", "1", "--no-dashboard",
                    "--name", f"w{i}", "--local-directory", str(self.logs / f"w{i}"),
                    *([] if self.nanny else ["--no-nanny"])))
            deadline = time.monotonic() + self.timeout
            while self.client is None:
                try:
                    self.client = distributed.Client(self.address, timeout=2)
                except OSError:
                    if time.monotonic() > deadline or self.scheduler.poll() is not None:
                        raise
            self.client.wait_for_workers(self.n_workers, timeout=self.timeout)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        procs = [p for p in [*self.workers, self.scheduler] if p is not None]
        for p in procs:  # each in its own session: a nanny and its worker go together
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
