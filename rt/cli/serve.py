"""CLI verbs ``pkrt serve`` (a machine as a long-running process with a control socket) and
``pkrt ctl`` (its client: status, enable, disable, home, jog, move, run, stream, hold,
resume, override, stop, estop, reset; and ``check move``/``check travel``, which move nothing)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time

from pkrt.rt.cli.argtypes import positive_number, vector
from pkrt.rt.cli.printing import emit
from pkrt.rt.core.errors import CheckFailed, UserError

ACTIONS = ("status", "enable", "disable", "home", "jog", "release", "move", "run", "stream", "hold", "resume",
           "override", "stop", "estop", "reset", "check")


def direction(text: str):
    """argparse type: a task coordinate's name with an optional sign (x, -z, roll: the machine
    knows its coordinates) or comma-separated numbers."""
    if re.fullmatch(r"[+-]?[a-z]+", text.strip()):
        return text.strip()
    return vector(text)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--machine", default="orthoglide", help="machine configuration file or built-in name")
    p.add_argument("--socket", help="control socket path (default: $XDG_RUNTIME_DIR/pkrt.sock or /tmp/pkrt-UID.sock)")
    p.add_argument("--bus", choices=("can", "serial"),
                   help="serve on the machine's drive emulator (a process of its own, stepped timing) over this "
                        "bus, as pkrt hil does: a CiA 402 machine on can, a Dynamixel one on serial")
    p.add_argument("--lockstep", action="store_true",
                   help="virtual clock: cycles run back to back while moving (simulation only)")
    p.add_argument("--tcp", type=int, metavar="PORT", help="also listen on 127.0.0.1:PORT (needs --token-file)")
    p.add_argument("--token-file", help="TCP: file with the token (created with a fresh one, mode 0600, if missing)")
    p.add_argument("--log", default="pkrt-serve.pktlog", help="run log (default: %(default)s)")
    p.add_argument("--no-log", action="store_true", help="write no log")
    p.add_argument("--no-rt", action="store_true", help="ask for none of the configuration's real-time settings")
    p.add_argument("--telemetry", metavar="HOST:PORT", help="stream msgpack telemetry over UDP (with the state)")
    p.add_argument("--telemetry-rate", type=positive_number, default=50.0, help="telemetry messages per second")
    p.add_argument("--inject", metavar="KIND@T",
                   help="simulated plant (in this process): a fault or contact at T s from the start, as pkrt run "
                        "--inject (nan, stale, push, freeze, contact@T=FX,FY,FZ[,DURATION], clamp@T=STIFFNESS)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object at the end")


def serve(args) -> int:
    from pathlib import Path

    from pkrt.rt.app.serve import Served, write_token

    token = None
    if args.tcp is not None:
        if not 0 < args.tcp < 65536:
            raise UserError(f"--tcp: port must be in 1..65535, got {args.tcp}")
        if not args.token_file:
            raise UserError("--tcp needs --token-file (the token a TCP client must send)")
        tf = Path(args.token_file)
        if tf.exists():
            if tf.stat().st_mode & 0o077:
                raise UserError(f"{tf}: the token file must be readable by its owner only (chmod 600)")
            token = tf.read_text().strip()
            if len(token) < 16:
                raise UserError(f"{tf}: the token must be at least 16 characters")
        else:
            token = write_token(str(tf))
    telemetry = None
    if args.telemetry:
        from pkrt.rt.runtime.record.telemetry import Telemetry

        host, _, port = args.telemetry.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()):
            raise UserError(f"--telemetry: expected HOST:PORT, got '{args.telemetry}'")
        telemetry = (host, int(port))
    srv = Served(args.machine, socket_path=args.socket, lockstep=args.lockstep,
                 log_path=None if args.no_log else args.log, realtime=not args.no_rt and not args.lockstep,
                 tcp_port=args.tcp, token=token, hil=args.bus, inject=args.inject)
    if telemetry is not None:
        srv.machine.telemetry = Telemetry(telemetry[0], telemetry[1], args.telemetry_rate, axes=srv.machine.axes)

    def on_signal(signum, frame):
        srv.machine.shutdown(f"signal {signal.Signals(signum).name}")

    saved = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    where = srv.socket_path + (f" and 127.0.0.1:{srv.server.tcp_port}" if srv.server.tcp else "")
    print(f"pkrt serve: {srv.config.name} on {where} ({_mode(args)} at "
          f"{srv.config.rate_hz:g} Hz); pkrt ctl status --socket {srv.socket_path}", file=sys.stderr, flush=True)
    try:
        summary = srv.machine.run()
    finally:
        for s, old in saved.items():
            signal.signal(s, old)
        srv.server.close()
        srv.drives.close()
        srv.stop_emulator()
        if srv.machine.telemetry is not None:
            srv.machine.telemetry.close()
    summary["machine"] = srv.config.name
    emit(summary, args.json, f"{srv.config.name}: served {summary['cycles']} cycles, overruns {summary['overruns']}, "
                             f"ended {summary['state']}" + (f" (fault: {summary['fault']})" if summary["fault"] else ""))
    return 0


def _mode(args) -> str:
    if args.lockstep:
        return "lockstep"
    return f"real time, {args.bus} HIL emulator, stepped" if args.bus else "real time"


def add_ctl_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=ACTIONS, help="what to ask the machine")
    p.add_argument("value", nargs="?", help="run: FILE (a G-code program or a trajectory CSV) or 'demo'; "
                                            "override: PERCENT (0-120); check: move (with the arguments of move) or "
                                            "travel (with --direction)")
    p.add_argument("--socket", help="control socket path (default: as pkrt serve's)")
    p.add_argument("--tcp", metavar="HOST:PORT", help="connect over TCP (loopback) instead, with --token-file")
    p.add_argument("--token-file", help="TCP: file holding the token")
    p.add_argument("--space", choices=("joint", "task"), default="joint", help="jog, move, stream: joint or task space")
    p.add_argument("--axis", type=int, help="jog: the axis (joint space, from 0)")
    p.add_argument("--velocity", type=float, help="jog: continuous joint jog speed (actuator units per s, signed)")
    p.add_argument("--step", type=vector, help="jog: a step (joint: one value for --axis; task: one per coordinate)")
    p.add_argument("--direction", type=direction,
                   help="jog: continuous task-space direction; check travel: the direction to measure along (a task "
                        "coordinate's name with an optional sign, e.g. x or -z, or one value per task coordinate)")
    p.add_argument("--most", type=positive_number, default=1.0,
                   help="check travel: measure up to this far (m, or rad for a rotation; default: %(default)s)")
    p.add_argument("--speed", type=positive_number,
                   help="task jog: m/s (default 0.02); move, run: fraction of the limits (default 0.25)")
    p.add_argument("--for", dest="duration", type=positive_number, default=1.0,
                   help="continuous jog: how long to hold it (s, keep-alives sent meanwhile; default 1)")
    p.add_argument("--target", type=vector, help="move: the target (actuator values, or task coordinates)")
    p.add_argument("--method", type=int, help="home (CiA 402): homing method, 35 or 37 (here) or 18 (limit switch)")
    p.add_argument("--offset", type=vector, help="home: home offset per axis (actuator units; CiA 402: 0x607C; "
                                                  "Dynamixel: where the machine stands reads this, default 0)")
    p.add_argument("--speeds", type=vector, help="home (CiA 402): switch and zero search speeds (units/s)")
    p.add_argument("--timeout", type=positive_number, help="home (CiA 402): give up after this many seconds")
    p.add_argument("--wait", action="store_true", help="move, run, jog, stop: wait until the machine is at standstill")
    p.add_argument("--json", action="store_true", help="print the reply as one JSON object")


def _client(args):
    from pkrt.rt.app.client import MachineClient
    from pkrt.rt.app.serve import default_socket

    if args.tcp:
        host, _, port = args.tcp.rpartition(":")
        if host not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
            raise UserError(f"--tcp: expected a loopback HOST:PORT, got '{args.tcp}'")
        if not args.token_file:
            raise UserError("--tcp needs --token-file")
        try:
            token = open(args.token_file).read().strip()
        except OSError as e:
            raise UserError(f"{args.token_file}: {e.strerror}") from None
        return MachineClient(tcp=(host, int(port)), token=token)
    return MachineClient(args.socket or default_socket())


def ctl(args) -> int:
    a = args.action
    with _client(args) as c:
        if a == "status":
            st = c.status()
            emit(st, args.json, _status_text(st))
            return 0
        act = _ACTIONS.get(a)
        r = act(c, args) if act is not None else c.call(a)
        if args.wait and a in ("move", "run", "jog", "stop", "home"):
            r = {"ok": True, "status": c.wait_state("standstill", timeout=3600)}
    text = (_check_text(r, args.value) if a == "check"
            else f"{a}: ok (machine {r.get('state', r.get('status', {}).get('state'))})")
    emit(r, args.json, text)
    return 0


def _speed(args) -> dict:
    """``speed=`` for move and run when --speed is given."""
    return {"speed": args.speed} if args.speed else {}


def _override(c, args) -> dict:
    if args.value is None:
        raise UserError("override needs PERCENT (0 to 120)")
    try:
        pct = float(args.value)
    except ValueError:
        raise UserError(f"override: expected a percentage, got '{args.value}'") from None
    if not 0 <= pct <= 120:
        raise UserError(f"override: expected a percentage in [0, 120], got {args.value}")
    return c.override(pct / 100.0)


def _run(c, args) -> dict:
    """A program: a program planned from the model is accepted at once ("planning"); this
    waits for its planning to end and reports the start, or the reason it cannot run."""
    if args.value is None:
        raise UserError("run needs FILE (a G-code program or a trajectory CSV) or 'demo'")
    r = c.run(args.value if args.value == "demo" else os.path.abspath(args.value), **_speed(args))
    if not r.get("planning"):
        return r
    if not args.json:
        print(f"run: accepted, planning (job {r['job']}; machine {r['state']})", flush=True)
    t0 = time.monotonic()
    out = c.wait_planned(r["job"])
    if not out.get("ok"):
        raise UserError(out.get("error", "run: not started"))
    out.setdefault("state", "moving")
    out["waited_s"] = time.monotonic() - t0
    return out


def _move(c, args) -> dict:
    if args.target is None:
        raise UserError("move needs --target")
    return c.move(args.target, space=args.space, **_speed(args))


def _check(c, args) -> dict:
    """``check move`` (the arguments of move) or ``check travel`` (--direction, --most): the
    machine's answer, nothing moves; a move that cannot be done is a failed check (exit 1)."""
    if args.value == "move":
        if args.target is None:
            raise UserError("check move needs --target (as move)")
        r = c.call("check", what="move", target=list(map(float, args.target)), space=args.space, **_speed(args))
        if not r["possible"]:
            emit(r, args.json, f"check move: not possible: {r['reason']}")
            raise CheckFailed(f"check move: {r['reason']}")
        return r
    if args.value == "travel":
        if args.direction is None:
            raise UserError("check travel needs --direction (e.g. x, -z, or 1,0,0)")
        d = args.direction if isinstance(args.direction, str) else list(map(float, args.direction))
        return c.call("check", what="travel", direction=d, most=args.most)
    raise UserError(f"check: expected 'move' or 'travel', got {args.value!r}")


def _check_text(r: dict, what: str) -> str:
    if what == "move":
        return f"check move: possible ({r['space']} space, {r['duration_s']:.3f} s; machine {r['state']})"
    stop = f"limited by {r['limited_by']}" if r["limited_by"] else f"the {r['most']:g} {r['unit']} asked"
    return f"check travel: {r['travel']:.4f} {r['unit']} along {[round(x, 6) for x in r['direction']]} ({stop})"


def _home(c, args) -> dict:
    extra = {k: v for k, v in (("method", args.method), ("timeout", args.timeout),
                               ("offset", None if args.offset is None else args.offset.tolist()),
                               ("speeds", None if args.speeds is None else args.speeds.tolist()))
             if v is not None}
    return c.call("home", **extra)


# action -> (client, arguments) -> reply; the other actions are plain calls
_ACTIONS = {"override": _override, "run": _run, "move": _move, "home": _home, "check": _check,
            "jog": lambda c, args: _jog(c, args), "stream": lambda c, args: _stream(c, args)}


def _jog(c, args) -> dict:
    args_out: dict = {"space": args.space}
    if args.space == "joint":
        if args.axis is None:
            raise UserError("a joint jog needs --axis")
        args_out["axis"] = args.axis
        if args.step is not None:
            if len(args.step) != 1:
                raise UserError("a joint jog --step is one value (for --axis)")
            return c.jog(step=float(args.step[0]), **args_out)
        if args.velocity is None:
            raise UserError("a joint jog needs --velocity (continuous) or --step")
        args_out["velocity"] = args.velocity
    else:
        if args.step is not None:
            return c.jog(step=args.step.tolist(), **args_out, **({"speed": args.speed} if args.speed else {}))
        if args.direction is None:
            raise UserError("a task jog needs --direction (continuous) or --step")
        args_out["direction"] = args.direction if isinstance(args.direction, str) else args.direction.tolist()
        if args.speed:
            args_out["speed"] = args.speed
    r = c.jog(**args_out)
    end = time.monotonic() + args.duration  # hold the jog: keep-alives, then release
    try:
        while time.monotonic() < end:
            time.sleep(min(0.1, max(end - time.monotonic(), 0)))
            c.alive()
    finally:
        c.release()
    return r


def _stream(c, args) -> dict:
    """Targets from stdin, one comma-separated line each, sent as they arrive."""
    n = 0
    r: dict = {"ok": True}
    for line in sys.stdin:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            target = [float(x) for x in line.split(",")]
        except ValueError:
            raise UserError(f"stream: line {n + 1}: expected comma-separated numbers, got '{line}'") from None
        r = c.stream(target, space=args.space)
        n += 1
    r["targets"] = n
    return r


def _status_text(st: dict) -> str:
    pos = ", ".join(f"{x:.6g}" for x in st["position"])
    lines = [f"state {st['state']}{' (homed)' if st['homed'] else ' (not homed)'}, override {st['override'] * 100:.0f} %,"
             f" cycle {st['cycle']}, overruns {st['overruns']}",
             f"  position [{pos}] ({', '.join(st['units'])})", f"  motion: {st['motion']}"]
    prog = st.get("program")
    if prog:
        line = f", line {prog['line']}" if prog.get("line") else ""
        lines.append(f"  program {prog['file']} ({prog['kind']}): {prog['progress'] * 100:.1f} %{line}")
    if "spindle" in st:
        sp, co = st["spindle"], st["coolant"]
        coolant = " and ".join(k for k in ("mist", "flood") if co[k]) or "off"
        lines.append(f"  spindle {sp['state']} (S{sp['speed']:g}), coolant {coolant}, tool T{st['tool']}")
    if st.get("fault"):
        lines.append(f"  fault: {st['fault']}" + (" (holding, torque on, until reset)" if st.get("holding") else ""))
    return "\n".join(lines)


VERBS = {"serve": (add_serve_arguments, serve), "ctl": (add_ctl_arguments, ctl)}
