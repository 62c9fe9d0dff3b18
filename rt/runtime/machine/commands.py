"""The served machine's command handlers (``pkrt.rt.runtime.machine.served.Machine``), run in
its loop's thread at the start of a cycle: ``execute`` checks a command against the state
table (``states``), calls its handler and logs it; each handler takes the machine and the
command's JSON object and returns the reply. The handlers of the commands that change the
machine's state are here; those that start motion are in ``moves``, programs in ``programs``,
homing in ``homing``, the journal's in ``journal``. ``HANDLERS`` joins them: the one table of
what the machine does for each command name. Units: actuator units (m or rad), seconds.
"""

from __future__ import annotations

import json
import time

import numpy as np

from pkrt.rt.runtime.machine import homing, moves, programs
from pkrt.rt.runtime.machine.journal import COMMANDS as JOURNAL_COMMANDS
from pkrt.rt.runtime.machine.motion import Hold, Program
from pkrt.rt.runtime.machine.pending import Pending
from pkrt.rt.runtime.machine.states import INTERNAL, PLANNING_REFUSES, State, refusal

QUIET = ("status", "alive", "events", "info")  # commands not logged as events


def execute(m, p: Pending) -> None:
    """Run the pending command ``p`` on machine ``m`` and set its reply (with the state after it)."""
    cmd = p.cmd
    name = cmd.get("cmd")
    try:
        reply = command(m, name, cmd)
    except (ValueError, TypeError, KeyError) as e:  # a malformed argument the caller did not catch
        reply = {"ok": False, "error": f"{name}: bad argument: {e}"}
    if name not in QUIET:
        m.event("command", json.dumps({k: v for k, v in cmd.items() if k not in ("plan", "peaks")}, default=str)
                + (" -> ok" if reply.get("ok") else f" -> refused: {reply.get('error')}"))
    reply.setdefault("state", m.state.value)
    p.set(reply)


def command(m, name, cmd: dict) -> dict:
    """The reply to command ``name``: a program being planned first (stop and disable cancel it,
    motion is refused meanwhile), then the state table, then the handler."""
    if m.planning is not None and name in ("stop", "disable"):
        programs.cancel_planning(m, f"cancelled by {name}")
        if m.state is State.STANDSTILL and name == "stop":
            return {"ok": True, "note": "planning cancelled"}
    if m.planning is not None and name in PLANNING_REFUSES:
        return {"ok": False, "error": f"{name} refused: a program is being planned (stop cancels it)"}
    why = refusal(INTERNAL.get(name, str(name)), m.state)
    if why is not None:
        return {"ok": False, "error": why}
    handler = HANDLERS.get(name) if isinstance(name, str) else None
    if handler is None:
        return {"ok": False, "error": f"unknown command '{name}'"}
    return handler(m, cmd)


def alive(m, cmd: dict) -> dict:
    """A keep-alive of the client that owns the running jog or stream."""
    if m.owner is not None and cmd.get("owner") == m.owner:
        m.last_alive = time.monotonic()
    return {"ok": True}


def enable(m, cmd: dict) -> dict:
    """Drives configured and enabled, holding where they are (refused outside the actuator ranges)."""
    d = m.drives
    if not m.prepared:
        d.prepare(m.start_pos.copy())
        m.prepared = True
    try:
        d.configure()
        d.enable()
        fb = d.read(m.t)
    except Exception as e:  # noqa: BLE001 - a drive that does not come up: torque off, refused
        d.disable()
        return {"ok": False, "error": f"enable failed: {e}"}
    lim = m.config.limits.position
    if not (np.all(np.isfinite(fb.position)) and np.all(fb.position >= lim[:, 0]) and np.all(fb.position <= lim[:, 1])):
        d.disable()
        return {"ok": False, "error": f"enable refused: position {np.round(fb.position, 6).tolist()} "
                                      f"outside the actuator ranges"}
    m.sup.stale = m.sup.late = 0
    m.source = Hold(fb.position.copy())
    m.set_state(State.STANDSTILL, "enable")
    return {"ok": True}


def disable(m, cmd: dict) -> dict:
    m.drives.disable()
    m.source = Hold(m.source.pos.copy())
    m.set_state(State.DISABLED, "disable")
    return {"ok": True}


def reset(m, cmd: dict) -> dict:
    """Out of error stop: the fault cleared, torque off (disabled)."""
    m.fault_reason, m.holding = None, False
    m.drives.disable()
    m.set_state(State.DISABLED, "reset")
    return {"ok": True}


def override(m, cmd: dict) -> dict:
    """Feed override in [0, 1.2], applied to a running move or program (ramped by its source)."""
    f = float(cmd["value"])
    if not (np.isfinite(f) and 0.0 <= f <= 1.2):
        return {"ok": False, "error": f"override must be in [0, 1.2] (0 to 120 %), got {cmd['value']}"}
    m.override = f
    if isinstance(m.source, Program):
        m.source.set_override(f)
    return {"ok": True, "override": f}


def release(m, cmd: dict) -> dict:
    """A jog's end (never refused: a dead-man must work)."""
    src = m.source
    if m.state is State.MOVING and src.kind == "jog" and (cmd.get("owner") in (None, m.owner)):
        src.stop()
        m.set_state(State.STOPPING, cmd.get("why", "jog released"))
    return {"ok": True}


def hold(m, cmd: dict) -> dict:
    """Feed hold of a move or program: it stops on its path (holding once at rest)."""
    src = m.source
    if not isinstance(src, Program) or src.kind == "jog":
        return {"ok": False, "error": f"hold refused: the {src.kind} is not a move or program (stop it instead)"}
    src.hold()
    return {"ok": True}


def resume(m, cmd: dict) -> dict:
    m.source.resume()
    m.set_state(State.MOVING, "resume")
    return {"ok": True}


def stop(m, cmd: dict) -> dict:
    """A controlled stop of the motion (then standstill); homing halted (then error stop)."""
    if m.state is State.HOMING:
        homing.abort(m, "stopped")
        return {"ok": True, "note": "homing halted: the machine goes to error stop (not homed)"}
    m.source.stop()
    m.owner = None
    m.set_state(State.STOPPING, "stop")
    return {"ok": True}


def estop(m, cmd: dict) -> dict:
    m.fault("emergency stop", estop=True)
    return {"ok": True}


# command name -> handler (machine, command) -> reply; the states each is allowed in: ``states.ALLOWED``
HANDLERS = {
    "status": lambda m, cmd: {"ok": True, "status": m.status()},
    "alive": alive, "enable": enable, "disable": disable, "estop": estop, "reset": reset, "override": override,
    "home": homing.home, "release": release, "jog": moves.jog, "move": lambda m, cmd: programs.program(m, cmd, "move"),
    "run": lambda m, cmd: programs.program(m, cmd, "run"), "stream": moves.stream,
    "hold": hold, "resume": resume, "stop": stop, "plan": programs.plan, "planned": programs.planned, **JOURNAL_COMMANDS,
}
