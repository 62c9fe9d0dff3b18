"""A drive emulator as a child process speaking JSON lines: one line when it is up, one
answer per command on its stdin, its report when its stdin closes."""

from __future__ import annotations

import json
import select
import subprocess
import tempfile

from pkrt.rt.core.errors import Fault, UserError

START_TIMEOUT = 60.0  # s for an emulator to load its plant and open its end of the bus


class EmulatorProcess:
    """``cmd`` as a child process; ``hello`` is the first JSON line it printed."""

    def __init__(self, cmd: list[str], what: str = "emulator"):
        self.what = what
        self.errors = tempfile.TemporaryFile(mode="w+")  # a pipe could fill up and block it
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors, text=True)
        line = self._readline(START_TIMEOUT)
        if not line:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.errors.seek(0)
            err = self.errors.read().strip()
            self.kill()
            raise Fault(f"{what} did not start: {err.splitlines()[-1] if err else 'no output'}")
        self.hello = json.loads(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def command(self, cmd: dict, timeout: float = 10.0) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self._readline(timeout)
        if not line:
            raise Fault(f"{self.what} did not answer {cmd['cmd']!r}")
        out = json.loads(line)
        if "error" in out:
            raise UserError(f"{self.what}: {out['error']}")
        return out

    def report(self) -> dict:
        return self.command({"cmd": "report"})

    def _readline(self, timeout: float) -> str:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if r else ""

    def stop(self, timeout: float = 10.0) -> dict:
        """Close its stdin (the stop signal) and return its report."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        line = self._readline(timeout)
        self.kill()
        try:
            return json.loads(line) if line else {}
        except json.JSONDecodeError:
            return {}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.errors.close()
