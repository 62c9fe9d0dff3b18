"""The served machine's control socket: JSON lines over a Unix socket (created owner-only,
mode 0600) and, optionally, over TCP bound to loopback with a token.

One request per line, a JSON object with ``cmd`` (status, enable, disable, home, jog,
release, move, run, stream, hold, resume, override, stop, estop, reset, alive; info, events,
ack: ``pkrt.rt.runtime.machine.journal``; and ``check``, which answers without moving) and its
arguments; one reply per line: ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``
(one line, never a traceback). A TCP client's first line must be ``{"token": "..."}``.

Dead-man: a continuous jog or a live-target stream belongs to the connection that started it;
when that connection closes, the jog is released (a stream stops through its staleness
timeout), and a jog without a keep-alive (``alive``, or the jog again) for ``deadman_s`` is
released by the loop.
"""

from __future__ import annotations

import hmac
import itertools
import json
import math
import os
import socket
import stat
import threading
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.machine.states import PLANNING_REFUSES
from pkrt.rt.core.inputs import excerpt, shorten_tokens
from pkrt.rt.runtime.machine.motion import plan_peaks
from pkrt.rt.runtime.machine.states import refusal

MAX_LINE = 1 << 16  # bytes: a longer request line is refused (a stream of garbage is not buffered)
SIMPLE = ("status", "enable", "disable", "hold", "resume", "stop", "estop", "reset", "alive", "release", "info")


def _vector(req: dict, key: str, n: int | None = None) -> np.ndarray:
    v = req.get(key)
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise UserError(f"'{key}' must be a list of numbers")
    a = np.asarray(v, float)
    if not np.all(np.isfinite(a)):
        raise UserError(f"'{key}' must be finite numbers")
    if n is not None and len(a) != n:
        raise UserError(f"'{key}' needs {n} values, got {len(a)}")
    return a


def _number(req: dict, key: str, default=None, lo: float = 0.0, hi: float = np.inf) -> float:
    v = req.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or not lo <= v <= hi:
        raise UserError(f"'{key}' must be a number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def request_id(req) -> str | int | float | None:
    """A request's ``id`` when it is one to echo (a string of at most 200 characters or a
    finite number, as JSON-RPC allows), else None."""
    rid = req.get("id") if isinstance(req, dict) else None
    if isinstance(rid, str) and len(rid) <= 200:
        return rid
    if isinstance(rid, bool):
        return None
    if (isinstance(rid, int) and abs(rid) < 2 ** 53) or (isinstance(rid, float) and math.isfinite(rid)):
        return rid
    return None


class Translator:
    """Turns a client's request into the loop's command: validates arguments, plans moves,
    jogs and programs (``Planner``) from the machine's current reference."""

    def __init__(self, machine, planner, worker=None, task_timeout: float = 60.0):
        self.m, self.p = machine, planner
        self.worker = worker  # a ``PlanWorker``: what needs the model is planned out of process
        self.task_timeout = task_timeout  # s: a task-space plan waited for this long at most

    def command(self, req: dict, owner: int) -> dict:
        m = self.m
        if not isinstance(req, dict):
            raise UserError("a request must be a JSON object")
        cmd = req.get("cmd")
        if not isinstance(cmd, str):
            raise UserError("a request needs \"cmd\" (a string)")
        if "id" in req and request_id(req) is None:
            raise UserError("'id' must be a string of at most 200 characters or a number (it is echoed in the reply)")
        if cmd in SIMPLE:
            return {"cmd": cmd, "owner": owner}
        if cmd in ("events", "ack"):  # the journal after / up to event number seq
            return {"cmd": cmd, "seq": int(_number(req, "seq", 0, lo=0, hi=2.0**53))}
        why = refusal(cmd, m.state)  # the state decides first (the loop checks it again when it executes)
        if why is not None and not why.startswith("unknown"):
            raise UserError(why)
        if cmd == "override":
            return {"cmd": cmd, "value": _number(req, "value", lo=0.0, hi=1.2)}
        if cmd == "home":
            return self._home(req)
        if cmd == "check":
            return {"cmd": "check", "reply": self._query(req, owner)}
        space = req.get("space", "joint")
        if space not in ("joint", "task"):
            raise UserError(f"'space' must be joint or task, got {space!r}")
        theta0 = m.ref_now.copy()
        axes = m.axes
        if cmd == "jog":
            return self._jog(req, space, theta0, owner)
        if cmd == "move":
            speed = _number(req, "speed", 0.25, lo=1e-3, hi=1.0)
            if space == "task":
                self._need_homed("move")
                plan, _ = self._task({"kind": "move", "target": _vector(req, "target"),
                                      "speed": _number(req, "task_speed", 0.1, lo=1e-4, hi=10),
                                      "accel": _number(req, "task_accel", 1.0, lo=1e-3, hi=1e3)}, theta0, "move")
            else:
                plan = self.p.joint_move(theta0, _vector(req, "target", m.s), speed, axes)
            return {"cmd": "move", "plan": plan, "space": space}
        if cmd == "run":
            return self._program(req, theta0)
        if cmd == "stream":
            target = _vector(req, "target")
            if space == "task":
                self._need_homed("stream")
                with self.p._lock:
                    kin = self.p.kin
                    cfg, th, res = kin.solve_pose(target, kin.assembler.solve(theta0), theta0)
                if not res < kin.tol:
                    raise UserError(f"stream: task target {target.tolist()} is outside the workspace")
                target = th
            self.p.check_target(target, "stream")  # the way there: the loop's guard (``Machine``)
            return {"cmd": "stream", "target": target.tolist(), "space": space, "owner": owner}
        raise UserError(f"unknown command '{cmd}' (status, enable, disable, home, jog, release, move, run, stream, "
                        f"hold, resume, override, stop, estop, reset, alive, info, events, ack, check)")

    def _home(self, req: dict) -> dict:
        """``home``: method, offset (actuator units; Dynamixel: offset only), speeds (units/s),
        timeout (s)."""
        out = {"cmd": "home", "method": int(_number(req, "method", 35, lo=-128, hi=127)),
               "timeout": _number(req, "timeout", 30.0, lo=0.01, hi=3600.0)}
        if "offset" in req:
            out["offset"] = (_vector(req, "offset", self.m.s).tolist() if isinstance(req["offset"], list)
                             else _number(req, "offset", lo=-np.inf))
        if "speeds" in req:
            out["speeds"] = _vector(req, "speeds", 2).tolist()
        return out

    def _query(self, req: dict, owner: int) -> dict:
        """``check``, nothing moves: ``what`` "move" (the arguments of ``move``): whether the move
        can be done now (``possible``) and why not (``reason``: the plan's refusal, then the
        machine's state), with its duration; ``what`` "travel" (``direction``: a task
        coordinate's name with an optional sign, or a vector; ``most``, m, default 1): the
        largest travel of the tool from where the machine is along the direction, and what
        stops it there (``limited_by``; None: ``most`` is reached)."""
        what = req.get("what")
        if what == "move":
            try:
                plan = self.command({**req, "cmd": "move"}, owner)["plan"]
            except UserError as e:
                return {"ok": True, "possible": False, "reason": str(e)}
            why = ("move refused: a program is being planned (stop cancels it)" if self.m.planning is not None
                   and "move" in PLANNING_REFUSES else refusal("move", self.m.state))
            out = {"ok": True, "possible": why is None, "duration_s": plan.duration, "space": req.get("space", "joint")}
            return {**out, "reason": why} if why else out
        if what == "travel":
            self._need_homed("check travel")
            direction = self._direction(req)
            most = _number(req, "most", 1.0, lo=1e-4, hi=100.0)
            theta0 = self.m.ref_now.copy()
            if self.worker is None:
                with self.p._lock:
                    dist, why = self.p.travel(theta0, direction, most)
            else:
                kind, value = self._worker_result(self.worker.submit_travel(theta0, direction, most), "check travel")
                dist, why = value
            coords = self.p.task_coordinates()
            unit = "m" if any(direction[i] for i, c in enumerate(coords) if c in "xyz") else "rad"
            return {"ok": True, "travel": dist, "unit": unit, "direction": direction.tolist(), "limited_by": why,
                    "most": most}
        raise UserError(f"check: 'what' must be move or travel, got {what!r}")

    def _direction(self, req: dict) -> np.ndarray:
        """``direction``: a task coordinate's name with an optional sign (``x``, ``-z``, ``roll``)
        or one value per task coordinate; a unit vector of the task coordinates."""
        d = req.get("direction")
        if isinstance(d, str):
            coords = self.p.task_coordinates()
            name = d.lstrip("+-")
            if name not in coords:
                raise UserError(f"'direction': {d!r} is not a task coordinate ({', '.join(coords)}) or a vector")
            v = np.zeros(len(coords))
            v[coords.index(name)] = -1.0 if d.startswith("-") else 1.0
            return v
        v = _vector(req, "direction")  # its length: checked where it is planned
        n = float(np.linalg.norm(v))
        if not n > 0:
            raise UserError("'direction' must not be zero")
        return v / n

    def _need_homed(self, what: str) -> None:
        if not self.m.homed:
            raise UserError(f"{what} refused: task-space motion needs the machine homed (pkrt ctl home)")

    def _task(self, spec: dict, theta0: np.ndarray, what: str):
        """A task-space motion planned (``Planner.task_motion``): in the planning worker when
        there is one (this thread waits, the loop's process does not plan), else here."""
        if self.worker is None:
            return self.p.task_motion(theta0, spec, self.m.axes)
        if self.m.planning is not None:
            raise UserError(f"{what} refused: a program is being planned (stop cancels it)")
        return self._worker_result(self.worker.submit_task(spec, theta0, self.m.axes), what)[1]

    def _worker_result(self, future, what: str):
        """("ok", value) of the planning worker's ``future``, waited for ``task_timeout`` at most;
        its refusal (the same line as planned here) or its end raised as one line."""
        from concurrent.futures import TimeoutError as FutureTimeout

        try:
            kind, value = future.result(self.task_timeout)
        except FutureTimeout:
            raise UserError(f"{what}: not planned within {self.task_timeout:g} s (the planning process is busy)") from None
        except Exception as e:  # noqa: BLE001 - the worker died or was shut down
            raise UserError(f"{what}: the planning process ended ({type(e).__name__})") from None
        if kind != "ok":
            raise UserError(value)
        return kind, value

    def _jog(self, req: dict, space: str, theta0: np.ndarray, owner: int) -> dict:
        m, s = self.m, self.m.s
        st = m.settings
        if space == "joint":
            if "step" in req:
                axis = int(_number(req, "axis", lo=0, hi=s - 1))
                step = _number(req, "step", lo=-np.inf)
                target = theta0.copy()
                target[axis] = min(max(target[axis] + step, self.p.lo[axis]), self.p.hi[axis])
                frac = st.jog_speed if m.homed else st.unhomed_speed
                return {"cmd": "jog", "plan": self.p.joint_move(theta0, target, frac, m.axes), "owner": owner}
            if "velocity" in req and isinstance(req["velocity"], list):
                v = _vector(req, "velocity", s)
            else:
                axis = int(_number(req, "axis", lo=0, hi=s - 1))
                v = np.zeros(s)
                v[axis] = _number(req, "velocity", lo=-np.inf)
            return {"cmd": "jog", "velocity": v.tolist(), "owner": owner}
        self._need_homed("task jog")
        spec = {"speed": _number(req, "speed", 0.02, lo=1e-4, hi=1.0), "accel": _number(req, "accel", 0.2, lo=1e-3, hi=100.0)}
        if "step" in req:
            spec.update(kind="step", step=_vector(req, "step"))
        else:
            spec.update(kind="jog", direction=self._direction(req))
        plan, continuous = self._task(spec, theta0, "jog")
        out = {"cmd": "jog", "plan": plan, "space": "task", "owner": owner}
        return {**out, "continuous": True} if continuous else out

    def _program(self, req: dict, theta0: np.ndarray) -> dict:
        """A program: planned out of process (``plan``: the server hands it to the planning
        worker) when it needs the model, else here (an actuator CSV: read and checked)."""
        from pkrt.rt.app.planworker import needs_model, plan_program

        f = req.get("file")
        if not isinstance(f, str) or not f:
            raise UserError("run needs \"file\": a G-code program, a trajectory CSV path or \"demo\"")
        if f != "demo" and not Path(f).is_file():
            raise UserError(f"{f}: no such file")
        speed = _number(req, "speed", 0.25, lo=1e-3, hi=1.0)
        if self.worker is not None and needs_model(f, self.m.axes):
            return {"cmd": "plan", "file": f, "speed": speed}
        return {"cmd": "run", "plan": plan_program(self.p, f, theta0, self.m.axes, speed), "space": "task", "file": f}


class Server:
    """Accepts connections on a Unix socket (and optionally TCP on loopback) and serves each
    in its own thread. ``close`` stops accepting and closes every connection."""

    def __init__(self, machine, planner, socket_path: str, tcp_port: int | None = None, token: str | None = None,
                 reply_timeout: float = 10.0, worker=None):
        self.m, self.tr = machine, Translator(machine, planner, worker)
        self.worker = worker  # a ``PlanWorker``: what needs the model is planned there
        self.path = str(socket_path)
        self.reply_timeout = reply_timeout
        self._ids = itertools.count(1)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        p = Path(self.path)
        if p.exists() or p.is_symlink():
            if not stat.S_ISSOCK(p.lstat().st_mode):
                raise UserError(f"{self.path}: exists and is not a socket (refusing to replace it)")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
                raise UserError(f"{self.path}: another machine is served there")
            except (ConnectionRefusedError, FileNotFoundError):
                p.unlink()  # a socket left by a process that died
            finally:
                probe.close()
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # created 0600: only the owner may connect
        try:
            self.unix.bind(self.path)
        except OSError as e:
            raise UserError(f"{self.path}: cannot create the control socket: {e.strerror}") from None
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.unix.listen(8)
        self.tcp = None
        self.token = token
        if tcp_port is not None:
            if not token:
                raise UserError("a TCP listener needs a token")
            self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                self.tcp.bind(("127.0.0.1", tcp_port))
            except OSError as e:
                raise UserError(f"TCP 127.0.0.1:{tcp_port}: {e.strerror}") from None
            self.tcp.listen(8)
            self.tcp_port = self.tcp.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, args=(sock, sock is self.tcp), daemon=True,
                                          name=f"pkrt-serve-accept-{'tcp' if sock is self.tcp else 'unix'}")
                         for sock in (self.unix, self.tcp) if sock is not None]
        for t in self._threads:
            t.start()

    def _accept(self, sock: socket.socket, tcp: bool) -> None:
        while not self._closed:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn, tcp), daemon=True, name="pkrt-serve-conn").start()

    def _serve(self, conn: socket.socket, tcp: bool) -> None:
        owner = next(self._ids)
        f = conn.makefile("rb")
        authed = not tcp
        try:
            while True:
                line = f.readline(MAX_LINE + 1)
                if not line:
                    break
                if len(line) > MAX_LINE:
                    self._send(conn, self._refused(line, f"request longer than {MAX_LINE} bytes"))
                    break
                if not line.strip():
                    continue
                try:
                    req = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as e:
                    self._send(conn, self._refused(line, f"not a JSON object: {e.msg if hasattr(e, 'msg') else e}"))
                    continue
                if not authed:
                    tok = req.get("token") if isinstance(req, dict) else None
                    if isinstance(tok, str) and hmac.compare_digest(tok.encode(), self.token.encode()):
                        authed = True
                        self._send(conn, {"ok": True})
                        continue
                    self._send(conn, {"ok": False, "error": "the first line must be {\"token\": ...} with the right token"})
                    break
                self._send(conn, self.handle(req, owner))
        except OSError:
            pass
        finally:
            # dead-man: a jog this connection started never outlives it
            if not self.m.finished.is_set():
                self.m.submit({"cmd": "release", "owner": owner, "why": "dead-man: the client went away"})
            with self._lock:
                self._conns.discard(conn)
            try:
                f.close()
                conn.close()
            except OSError:
                pass

    def handle(self, req, owner: int) -> dict:
        """One request to one reply (never raises for what a client can send)."""
        rid = request_id(req)
        try:
            cmd = self.tr.command(req, owner)
        except UserError as e:
            out = self._refused(req, str(e))
        except Exception as e:  # noqa: BLE001 - a plan that fails in the model: one line, the loop is untouched
            out = self._refused(req, f"{req.get('cmd')}: cannot be planned: {type(e).__name__}: {e}")
        else:
            if cmd["cmd"] == "check":  # a question: the loop is not asked
                out = {**cmd["reply"], "state": self.m.state.value}
                if rid is not None:
                    out["id"] = rid
                return out
            if "plan" in cmd:  # what the loop would otherwise compute in its cycle
                cmd["peaks"] = plan_peaks(cmd["plan"])
            out = self.m.submit(cmd).wait(self.reply_timeout)
            out = {k: v for k, v in out.items()}
            if cmd["cmd"] == "plan" and out.get("ok"):
                self._plan(cmd, out.pop("theta0"), out["job"])
        if rid is not None:
            out["id"] = rid
        return out

    def _refused(self, req, error: str) -> dict:
        """The reply to a request refused here, before the loop (malformed, bad arguments, not
        planned): one line with the machine's state, and a ``command`` event in the run log as
        the loop writes for the commands it executes (status and keep-alives aside)."""
        error = shorten_tokens(" ".join(error.split()))
        if not (isinstance(req, dict) and req.get("cmd") in ("status", "alive")):
            try:
                text = json.dumps(req) if isinstance(req, dict) else excerpt(req, 200)
            except (TypeError, ValueError):
                text = excerpt(req, 200)
            self.m.event("command", f"{text if len(text) <= 300 else text[:297] + '...'} -> refused: {error}")
        return {"ok": False, "error": error, "state": self.m.state.value}

    def _plan(self, cmd: dict, theta0: list, job: int) -> None:
        """Hand an accepted program to the planning worker; its plan (or the reason it has
        none) goes to the loop as ``planned`` when the worker is done."""
        def done(fut) -> None:
            try:
                kind, value = fut.result()
            except Exception as e:  # noqa: BLE001 - the worker died or was shut down
                kind, value = "error", f"the planning process ended ({type(e).__name__})"
            if kind == "ok":
                self.m.submit({"cmd": "planned", "job": job, "plan": value, "space": "task", "peaks": plan_peaks(value)})
            else:
                self.m.submit({"cmd": "planned", "job": job, "error": value})

        self.worker.submit(cmd["file"], np.asarray(theta0, float), self.m.axes, cmd["speed"]).add_done_callback(done)

    @staticmethod
    def _send(conn: socket.socket, obj: dict) -> None:
        from pkrt.rt.core.plain import to_jsonable

        conn.sendall((json.dumps(to_jsonable(obj)) + "\n").encode())

    def close(self) -> None:
        self._closed = True
        for s in (self.unix, self.tcp):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        with self._lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        try:
            os.unlink(self.path)
        except OSError:
            pass
