"""The commands that start a served machine's manual motion sources: ``jog`` (a joint velocity
jog, or a planned step or task-space line: a program that ``release`` stops) and ``stream``
(live targets, ``live.LiveTarget``). Handlers of ``commands.HANDLERS``: (machine, command) ->
reply, in the loop's thread. Units: actuator units (m or rad), seconds.
"""

from __future__ import annotations

import time

import numpy as np

from pkrt.rt.runtime.machine import programs
from pkrt.rt.runtime.machine.live import LiveTarget
from pkrt.rt.runtime.machine.motion import JointJog
from pkrt.rt.runtime.machine.settings import limits_at
from pkrt.rt.runtime.machine.states import State


def jog(m, cmd: dict) -> dict:
    """A velocity jog (``velocity``: one value per actuator, capped to the jog speed; a running
    jog of the same owner takes the new velocity), or a planned jog (``plan``)."""
    src, owner = m.source, cmd.get("owner")
    if m.state is State.MOVING and src.kind != "jog":
        return {"ok": False, "error": f"jog refused: a {src.kind} is running (stop it first)"}
    if "plan" in cmd:  # a planned jog (a step, or a task-space line): a program that release stops
        if m.state is not State.STANDSTILL:
            return {"ok": False, "error": "jog refused: a jog is running (release it first)"}
        return programs.program(m, cmd, "jog")
    v = np.asarray(cmd["velocity"], float)
    if v.shape != (m.s,) or not np.all(np.isfinite(v)):
        return {"ok": False, "error": f"jog: velocity needs {m.s} finite values"}
    frac = m.settings.jog_speed if m.homed else m.settings.unhomed_speed
    vmax = frac * m.vmax
    if isinstance(src, JointJog) and m.state is State.MOVING:
        if owner != m.owner:
            return {"ok": False, "error": "jog refused: another client's jog is running"}
        src.set_velocity(v)
    else:
        if m.state is State.MOVING:
            return {"ok": False, "error": "jog refused: a planned jog is running (release it first)"}
        m.source = JointJog(src.pos.copy(), v, vmax, m.settings.jog_accel * m.amax, *limits_at(m, src.pos),
                            m.guard, m.period)
        m.set_state(State.MOVING, "jog")
    m.owner, m.last_alive = owner, time.monotonic()
    return {"ok": True, "speed_cap": vmax.tolist(), "homed": m.homed}


def stream(m, cmd: dict) -> dict:
    """A live target (``target``: actuator values inside the soft limits): starts a stream, or
    gives a running one its next target."""
    src = m.source
    if cmd.get("space") == "task" and not m.homed:
        return {"ok": False, "error": "stream refused: task-space targets need the machine homed (pkrt ctl home)"}
    target = np.asarray(cmd["target"], float)
    if target.shape != (m.s,) or not np.all(np.isfinite(target)):
        return {"ok": False, "error": f"stream: a target needs {m.s} finite values"}
    if np.any(target < m.lo) or np.any(target > m.hi):
        return {"ok": False, "error": f"stream: target {np.round(target, 6).tolist()} outside the soft limits "
                                      f"{np.c_[m.lo, m.hi].round(6).tolist()}"}
    if m.state is State.MOVING:
        if not isinstance(src, LiveTarget) or src.stopping:
            return {"ok": False, "error": f"stream refused: a {src.kind} is running"}
        src.set_target(target, m.t)
        return {"ok": True}
    frac = m.settings.jog_speed if m.homed else m.settings.unhomed_speed
    m.source = LiveTarget(src.pos.copy(), target, m.t, frac * m.vmax, m.settings.jog_accel * m.amax,
                          *limits_at(m, src.pos), m.period, m.settings.stream_timeout_s, m.guard)
    m.owner = cmd.get("owner")
    m.set_state(State.MOVING, "stream")
    return {"ok": True}
