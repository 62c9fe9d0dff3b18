"""What a served machine's clients read (an operator panel, ``pkrt ctl``): its ``status``, the
journal of its recent events with the alarms' acknowledgement, its fixed description
(``info``) and the progress of the program it runs. Kept in the machine, so a client holds
nothing the machine does not (a panel restarted reads them again).

Events: ``(seq, wall time s since the epoch, loop time s, kind, text)``, numbered from 1; kind
``fault`` is an alarm until acknowledged (``ack`` up to a number). Units: actuator (m or rad), s.
"""

from __future__ import annotations

import time
from collections import deque

FIELDS = ("seq", "time", "t", "kind", "text")


class Journal:
    """The last ``size`` events; ``acked``: alarms up to this number acknowledged."""

    def __init__(self, size: int = 256):
        self.ring: deque[tuple] = deque(maxlen=size)
        self.last = self.acked = self.last_alarm = 0

    def add(self, t: float, kind: str, text: str) -> None:
        self.last += 1
        self.ring.append((self.last, time.time(), t, kind, text))
        if kind == "fault":
            self.last_alarm = self.last

    def since(self, seq: int) -> list[dict]:
        """The events numbered after ``seq`` still kept (oldest first)."""
        return [dict(zip(FIELDS, e)) for e in self.ring if e[0] > seq]

    def ack(self, seq: int) -> int:
        """Acknowledge the alarms up to ``seq`` (never past the last event); the new mark."""
        self.acked = max(self.acked, min(int(seq), self.last))
        return self.acked

    def status(self) -> dict:
        return {"last": self.last, "acked": self.acked, "last_alarm": self.last_alarm,
                "unacked_alarm": self.last_alarm > self.acked}


def run_status(program) -> dict | None:
    """A program run, ``(file, its Program source)``: file, kind (csv, gcode, demo),
    progress in [0, 1] (path time over the plan's duration, the move to its start included),
    line (the G-code source line being executed, or of the event holding it; None for other
    programs)."""
    if program is None:
        return None
    file, src = program
    return {**src.program_status(), "file": file}


def machine_status(m) -> dict:
    """A served machine's state as ``status`` reports it: the state and why, homed, cycle and
    time, positions, references and torques (actuator units), the motion source's status,
    override, the fault, timing counts, outputs, the program's progress, the contact."""
    return {"state": m.state.value, "state_reason": m.state_reason, "homed": m.homed, "cycle": m.k, "time_s": m.t,
            "axes": m.axes, "units": m.units, "position": m.pos_now.tolist(),
            "reference": m.ref_now.tolist(), "reference_velocity": m.source.vel.tolist(), "motion": m.source.status(),
            "override": m.override, "fault": m.fault_reason, "fault_time": m.fault_time, "overruns": m.overruns,
            "long_cycles": m.long_cycles,
            "long_cycles_cpu": m.long_cycles_cpu, "pacing": "lockstep" if m.lockstep else m.pacing,
            "lockstep": m.lockstep,
            "torque_on": bool(m.drives.torque_on), "home_result": m.home_result,
            "planning": m.planning, "plan_result": m.plan_result, "events": m.journal.status(),
            **m.outputs.status(),
            "torque": (m.ctrl.tau if m.drives.torque_on else 0 * m.ctrl.tau).tolist(),
            "program": run_status(m.program), "holding": m.holding,
            "contact": m.protect.event if m.protect else None}


def machine_info(m) -> dict:
    """A served machine's fixed description: name, configuration path, axes, units, rate,
    soft limits and velocity limits (actuator units), the jog speed caps (units/s)."""
    st = m.settings
    return {"machine": m.config.name, "config": str(m.config.path), "axes": m.axes, "units": m.units,
            "rate_hz": m.config.rate_hz, "soft_lo": m.lo.tolist(), "soft_hi": m.hi.tolist(), "vmax": m.vmax.tolist(),
            "jog_cap": (st.jog_speed * m.vmax).tolist(), "unhomed_cap": (st.unhomed_speed * m.vmax).tolist(),
            "deadman_s": st.deadman_s}


# commands that read (or acknowledge) what this module holds, in any state: name -> (machine, cmd) -> reply
COMMANDS = {
    "info": lambda m, cmd: {"ok": True, "info": machine_info(m)},
    "events": lambda m, cmd: {"ok": True, "events": m.journal.since(cmd.get("seq", 0)), **m.journal.status()},
    "ack": lambda m, cmd: {"ok": True, "acked": m.journal.ack(cmd.get("seq", 0))},
}
