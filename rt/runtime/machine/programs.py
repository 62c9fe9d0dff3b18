"""A served machine's programs: a planned reference (a move, a planned jog, a CSV or G-code
program, the demo) started as the ``Program`` motion source; a program planned out of process
(``plan``, then ``planned`` with its plan or its refusal, or cancelled); the program's events
(spindle, coolant, tool, stops) applied to the drives' outputs as it passes them. Handlers of
``commands.HANDLERS`` and what the cycle calls, in the loop's thread. Units: actuator units (m
or rad), seconds.
"""

from __future__ import annotations

import json
import time

import numpy as np

from pkrt.rt.core.plan import Planned
from pkrt.rt.runtime.machine.motion import Program
from pkrt.rt.runtime.machine.states import State, refusal


def program(m, cmd: dict, name: str) -> dict:
    """Start the plan ``cmd["plan"]`` (a ``Planned`` at the loop's rate, from the machine's
    reference) as command ``name``: move, jog or run."""
    plan: Planned = cmd["plan"]
    if cmd.get("space") == "task" and not m.homed:
        return {"ok": False, "error": f"{name} refused: task-space motion needs the machine homed (pkrt ctl home)"}
    if abs(plan.rate_hz - m.config.rate_hz) > 1e-9:
        return {"ok": False, "error": f"{name}: planned at {plan.rate_hz} Hz, the loop runs at {m.config.rate_hz} Hz"}
    gap = np.abs(plan.pos[0] - m.source.pos).max()
    if gap > 1e-6:
        return {"ok": False, "error": f"{name} refused: it starts {gap:.3g} away from the machine's reference "
                                      f"(planned from a stale position)"}
    kind = "jog" if name == "jog" else ("move" if name == "move" else "program")
    f = cmd.get("file")
    info = {"file": f, "kind": "demo" if f == "demo" else ("gcode" if plan.line is not None else "csv")}
    m.source = Program(plan, m.vmax, m.amax, m.settings.ramp_s, m.override, kind=kind,
                       peaks=cmd.get("peaks"), info=info)
    m.owner = cmd.get("owner") if kind == "jog" and cmd.get("continuous") else None
    m.program = (str(cmd.get("file")), m.source) if name == "run" else m.program
    m.last_alive = time.monotonic()
    m.set_state(State.MOVING, name)
    return {"ok": True, "duration_s": plan.duration, "rate_cap": m.source.rate_cap}


def plan(m, cmd: dict) -> dict:
    """A program accepted for planning out of process: the machine stays at standstill
    (holding) until ``planned`` brings the plan; the plan starts at ``theta0``."""
    m.jobs += 1
    m.planning = {"job": m.jobs, "file": cmd.get("file"), "since_s": m.t}
    m.event("planning", json.dumps(m.planning))
    return {"ok": True, "planning": True, "job": m.jobs, "theta0": m.source.pos.tolist()}


def planned(m, cmd: dict) -> dict:
    """The planning of job ``job`` ended: its plan (``plan``) starts, or ``error`` says why not."""
    job = cmd.get("job")
    if m.planning is None or m.planning["job"] != job:
        return {"ok": False, "error": f"run: plan {job} dropped (it was cancelled)"}
    (since, file), m.planning = (m.planning["since_s"], m.planning["file"]), None
    if "error" in cmd:
        reply = {"ok": False, "error": f"run refused: {cmd['error']}"}
    else:
        why = refusal("run", m.state)
        reply = {"ok": False, "error": why} if why is not None else program(m, {**cmd, "file": file}, "run")
    m.plan_result = {"job": job, "planning_s": m.t - since, "cycle": m.k, **reply}
    if not reply["ok"]:
        m.event("planning", f"job {job}: {reply['error']}")
    return reply


def cancel_planning(m, why: str) -> None:
    """The program being planned (if any) dropped: its result says why."""
    if m.planning is not None:
        job, m.planning = m.planning["job"], None
        m.plan_result = {"job": job, "ok": False, "error": f"run {why}"}
        m.event("planning", f"job {job}: {why}")


def program_events(m, src: Program) -> None:
    """The events the program passed this cycle: logged, the outputs set on the drives."""
    for ev in src.fired:
        m.drives.set_outputs(m.outputs.apply(ev), m.t)
        m.event(ev["kind"], ev["text"])
    src.fired.clear()


def outputs_off(m, why: str) -> None:
    """Spindle and coolant off (a program stopped early, a fault), logged if they were on."""
    ch = m.outputs.off()
    if ch:
        m.drives.set_outputs(ch, m.t)
        m.event("outputs", f"{why}: spindle and coolant off")
