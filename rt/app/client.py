"""A small client of a served machine (``pkrt serve``): one JSON line out, one back.

    with MachineClient("/run/user/1000/pkrt.sock") as m:
        m.enable(); m.home(); m.move([0.1, 0.2, 0.0]); m.wait_state("standstill")
"""

from __future__ import annotations

import json
import socket
import time

from pkrt.rt.core.errors import Fault, UserError


class CommandRefused(UserError):
    """The machine refused a command (the reason is the message)."""


class MachineClient:
    """Connects to ``path`` (a Unix socket), or to ``tcp=(host, port)`` with ``token``."""

    def __init__(self, path: str | None = None, *, tcp: tuple[str, int] | None = None, token: str | None = None,
                 timeout: float = 30.0):
        try:
            if tcp is not None:
                self.sock = socket.create_connection(tcp, timeout=timeout)
            else:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(str(path))
        except FileNotFoundError:
            raise UserError(f"{path}: no machine is served there (start one with pkrt serve)") from None
        except (ConnectionRefusedError, PermissionError, OSError) as e:
            raise UserError(f"{path or '%s:%d' % tcp}: cannot connect: {e.strerror or e}") from None
        self.f = self.sock.makefile("rb")
        if tcp is not None:
            r = self.request({"token": token or ""})
            if not r.get("ok"):
                raise UserError(f"{tcp[0]}:{tcp[1]}: {r.get('error')}")

    def request(self, obj: dict) -> dict:
        """Send one request, return the reply (refusals included)."""
        try:
            self.sock.sendall((json.dumps(obj) + "\n").encode())
            line = self.f.readline()
        except OSError as e:
            raise Fault(f"connection to the machine lost: {e}") from None
        if not line:
            raise Fault("the machine closed the connection")
        return json.loads(line)

    def call(self, cmd: str, **args) -> dict:
        """A command; raises ``CommandRefused`` with the machine's reason when refused."""
        r = self.request({"cmd": cmd, **args})
        if not r.get("ok"):
            raise CommandRefused(r.get("error", "refused"))
        return r

    def status(self) -> dict:
        return self.call("status")["status"]

    def wait_state(self, state: str, timeout: float = 30.0, poll: float = 0.01) -> dict:
        """Poll until the machine is in ``state`` (or error_stop, which raises)."""
        end = time.monotonic() + timeout
        while True:
            st = self.status()
            if st["state"] == state:
                return st
            if st["state"] == "error_stop" and state != "error_stop":
                raise Fault(f"machine in error stop: {st['fault']}")
            if time.monotonic() > end:
                raise Fault(f"machine still {st['state']} after {timeout:g} s (waiting for {state})")
            time.sleep(poll)

    def wait_planned(self, job: int, timeout: float = 3600.0, poll: float = 0.02) -> dict:
        """Poll until the planning of ``job`` (a ``run`` reply's) has ended; its outcome:
        ``{"ok": true, "duration_s": ...}`` (the program started) or ``{"ok": false, "error": ...}``."""
        end = time.monotonic() + timeout
        while True:
            st = self.status()
            res = st.get("plan_result") or {}
            if st.get("planning") is None:
                if res.get("job") == job:
                    return res
                return {"ok": False, "error": f"run: plan {job} is not known to the machine"}
            if time.monotonic() > end:
                raise Fault(f"run: still planning after {timeout:g} s")
            time.sleep(poll)

    def enable(self):
        return self.call("enable")

    def disable(self):
        return self.call("disable")

    def home(self):
        return self.call("home")

    def jog(self, **args):
        return self.call("jog", **args)

    def release(self):
        return self.call("release")

    def move(self, target, space: str = "joint", **args):
        return self.call("move", target=list(map(float, target)), space=space, **args)

    def run(self, file: str, **args):
        return self.call("run", file=file, **args)

    def stream(self, target, space: str = "joint"):
        return self.call("stream", target=list(map(float, target)), space=space)

    def hold(self):
        return self.call("hold")

    def resume(self):
        return self.call("resume")

    def override(self, value: float):
        return self.call("override", value=float(value))

    def stop(self):
        return self.call("stop")

    def estop(self):
        return self.call("estop")

    def reset(self):
        return self.call("reset")

    def alive(self):
        return self.call("alive")

    def close(self) -> None:
        try:
            self.f.close()
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "MachineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
