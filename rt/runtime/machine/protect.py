"""Contact detection in a run or a served machine: the observer armed from ``[protect]``, the event
of a contact and the reaction to it (the observer itself: ``pkrt.rt.runtime.cycle.observer``).

A contact is a residual beyond its actuator's threshold (in the fused kernel, every cycle). Its
event (``event``): detection cycle and time, the onset estimated from the residual's last two
values (``observer.onset_cycles``: a force step's first-order response), the actuators over their
thresholds, the residual, the force if it is a step (``observer.step_force``: the residual is still
rising at the detection), the position, the reaction, and both forces at the tool when a
``tool_force(theta, tau) -> dict`` is given (the tool Jacobian's least-squares J^T w = tau, built
from the model outside the runtime, ``pkrt.models.kinematics.tooljacobian``; evaluated at the
event only). The reactions:

- ``torque-off`` (stop category 0): the cycle of the detection writes no command; torque off.
- ``stop`` (category 1): the reference stops on its path (``motion.Program.stop``, its rate ramped
  from 1 to 0 in ``stop_ramp`` s or slower, its accelerations within ``stop_deceleration`` of the
  limits: the force the reference's accelerations need must stay within the actuators' while a
  contact pushes), then torque off once every actuator is at standstill (below ``standstill`` of
  its velocity limit) or ``settle_time`` after the reference came to rest.
- ``reflex``: from the reference's state at the detection, a quintic to the detected position
  moved ``reflex_distance`` (actuator units) along the residual's direction (the way the external
  force pushes, away from what it pushes against; clipped to the position limits), timed within
  the velocity and acceleration limits; then the machine holds there.

The reaction's end is a fault reason (``Protection.after``): the run stops with it, a served
machine goes to error stop with it (holding, torque on, after a reflex). Units: actuator units,
N or N m, s.
"""

from __future__ import annotations

import json

import numpy as np

from pkrt.rt.core.plan import Planned, hermite_at
from pkrt.rt.core.schema import ProtectTable
from pkrt.rt.runtime.machine import programs
from pkrt.rt.runtime.machine.motion import Program, Source
from pkrt.rt.runtime.cycle.observer import onset_cycles, residual, step_force, thresholds

REACTION_TEXT = {"stop": "stop (category 1)", "reflex": "reflex", "torque-off": "torque off (category 0)"}


class Protection:
    """The contact detection of one run or served machine (``table``: ``[protect]``, enabled)."""

    def __init__(self, table: ProtectTable, limits, axes: list[str], units: list[str], period: float,
                 tool_force=None):
        self.table, self.axes, self.units, self.period = table, axes, units, period
        s = self.s = len(axes)
        self.vmax = limits.velocity * np.ones(s)
        self.amax = limits.acceleration * np.ones(s)
        self.lo, self.hi = limits.position[:, 0].copy(), limits.position[:, 1].copy()
        self.tool_force = tool_force
        self.events: list[dict] = []
        self.event: dict | None = None  # the contact being reacted to (or the last one)
        self.source: Source | None = None  # the reaction's reference (stop, reflex)
        self.rest_k: int | None = None  # the cycle the reaction's reference came to rest
        self.peak = np.zeros(s)  # the largest |residual| per actuator since the detection

    def arm(self, ctrl) -> None:
        """The observer on in ``ctrl`` (``Controller.protect``)."""
        th = self.table.thresholds
        ctrl.protect(self.table.gain, self.period, np.inf if th is None else th)

    @property
    def reacting(self) -> bool:
        """A reaction runs (its reference replaces the machine's)."""
        return self.source is not None

    # -- the detection --------------------------------------------------------------------------
    def detect(self, k: int, axis: int, ctrl, fb) -> dict:
        """The event of a contact detected at cycle k on ``axis`` (``ctrl``: the controller whose
        observer saw it; ``fb``: the feedback of the cycle)."""
        s, r = self.s, residual(ctrl.obs, self.s).copy()
        th = thresholds(ctrl.obs, s)
        j = onset_cycles(ctrl.obs, s, k, axis)
        u = self.units[0]
        ev = {"cycle": k, "time_s": k * self.period, "onset_s": (k - j) * self.period,
              "delay_estimate_s": j * self.period,
              "axes": [self.axes[i] for i in range(s) if abs(r[i]) > th[i]], "axis": self.axes[axis],
              "residual": r.tolist(), "thresholds": th.tolist(), "force_unit": "N" if u == "m" else "N m",
              "position": fb.position.tolist(), "velocity": fb.velocity.tolist(), "reaction": self.table.reaction}
        step = step_force(ctrl.obs, s, k)
        ev["step_force"] = step.tolist()  # the force if it is a step (the residual is still rising)
        if self.tool_force is not None:
            for key, tau in (("tool_force", r), ("tool_force_step", step)):
                try:
                    ev[key] = self.tool_force(fb.position.copy(), tau)
                except Exception as e:  # noqa: BLE001 - the model cannot say: the event stands without it
                    ev[key] = {"error": f"{type(e).__name__}: {e}"}
        self.peak[:] = np.abs(r)
        self.events.append(ev)
        self.event = ev
        return ev

    def reason(self, ev: dict | None = None) -> str:
        """The one-line reason of a contact's fault or error stop."""
        ev = ev or self.event
        i = self.axes.index(ev["axis"])
        text = (f"contact detected on {', '.join(ev['axes'])} at {ev['time_s']:.3f} s (residual "
                f"{ev['residual'][i]:.4g} {ev['force_unit']} on {ev['axis']}, threshold {ev['thresholds'][i]:.4g}")
        tf = ev.get("tool_force_step") or {}
        if "norm" in tf:
            text += f"; a step of about {tf['norm']:.3g} N at the tool"
        text += f"): {REACTION_TEXT[ev['reaction']]}"
        done = ev.get("reaction_done")
        if done:
            text += f", {done}"
        return text

    def begin(self, k: int, path: Source | None, ref_state: tuple, fb) -> str | None:
        """Start the reaction to the event of cycle k: the fault reason now for ``torque-off``,
        else None with the reaction's reference in ``source``: ``path`` (the machine's reference
        as a source, at cycle k's state) stopped, or the reflex from ``ref_state`` (pos, vel, acc)."""
        ev, table = self.event, self.table
        if table.reaction == "torque-off":
            ev["reaction_done"] = "in the detection cycle, no command written"
            ev["torque_off_cycle"] = k
            return self.reason()
        if table.reaction == "stop":
            if isinstance(path, Program):  # ramped down as fast as the stop's share of the limits allows
                path.rdot_max = max(path.rdot_max, 1.0 / table.stop_ramp)
                path.amax = np.minimum(path.amax, table.stop_deceleration * self.amax)
            path.stop()
            self.source = path
        else:
            self.source = self._reflex(ref_state, fb)
        self.rest_k = None
        return None

    def _reflex(self, ref_state: tuple, fb) -> Program:
        """The back-off move: a quintic (Hermite) from the reference's state to the position of the
        detection moved ``reflex_distance`` along the residual, at rest there, in the least time
        (grown by 25 % steps from 20 ms) within the velocity and acceleration limits."""
        pos, vel, acc = (np.asarray(x, float).copy() for x in ref_state)
        r = np.asarray(self.event["residual"])
        n = np.linalg.norm(r)
        d = r / n if n > 0 else np.zeros(self.s)
        target = np.clip(fb.position + self.table.reflex_distance * d, self.lo, self.hi)
        rate = 1.0 / self.period
        T = 0.02
        for _ in range(40):
            tt = np.arange(int(np.ceil(T * rate)) + 1) / rate
            tt[-1] = T
            p, v, a = hermite_at(np.array([0.0, T]), np.array([pos, target]), np.array([vel, np.zeros(self.s)]),
                                 np.array([acc, np.zeros(self.s)]), tt)
            if np.all(np.abs(v) <= self.vmax * (1 + 1e-9)) and np.all(np.abs(a) <= self.amax * (1 + 1e-9)):
                break
            T *= 1.25
        self.event["reflex_target"] = target.tolist()
        self.event["reflex_time_s"] = T
        plan = Planned(rate, p, v, a, {"kind": "reflex"})
        prog = Program(plan, self.vmax * 10.0, self.amax * 10.0, kind="reflex")  # timed above: played as planned
        return prog

    # -- the reaction, each cycle ------------------------------------------------------------------
    def step(self) -> Source:
        """The reaction's reference for this cycle (``source``, stepped one period)."""
        self.source.step(self.period)
        return self.source

    def after(self, k: int, ctrl, fb) -> str | None:
        """After cycle k of a reaction: the fault reason once it is over (``stop``: at standstill,
        the torque to go off; ``reflex``: there, to hold), else None."""
        np.maximum(self.peak, np.abs(residual(ctrl.obs, self.s)), out=self.peak)
        src, ev = self.source, self.event
        if not src.done:
            return None
        if self.rest_k is None:
            self.rest_k = k
        still = bool(np.all(np.abs(fb.velocity) <= self.table.standstill * self.vmax))
        waited = (k - self.rest_k) * self.period
        if not still and waited < self.table.settle_time:
            return None
        dt_ms = (k - ev["cycle"]) * self.period * 1e3
        how = "at standstill" if still else f"not at standstill {self.table.settle_time:g} s after the reference"
        ev["reaction_end_cycle"] = k
        ev["reaction_time_s"] = (k - ev["cycle"]) * self.period
        ev["peak_residual"] = self.peak.tolist()
        if self.table.reaction == "stop":
            ev["reaction_done"] = f"torque off {how} {dt_ms:.0f} ms after the detection"
            ev["torque_off_cycle"] = k
        else:
            ev["reaction_done"] = f"backed off {self.table.reflex_distance:g} and holding ({how}, {dt_ms:.0f} ms)"
        self.source = None
        return self.reason()

    def summary(self) -> dict:
        t = self.table
        return {"enabled": True, "gain": t.gain, "thresholds": None if t.thresholds is None else t.thresholds.tolist(),
                "reaction": t.reaction, "contacts": self.events}

    def log_text(self, ev: dict | None = None) -> str:
        """The event as one JSON line (the run log's ``contact`` event)."""
        return json.dumps(ev or self.event)


def stop_path(plan: Planned, vmax, amax) -> Program:
    """The run's reference ahead of a detection (rows from its cycle on, checked within the
    limits before the run) as a program at its start, to be stopped on the path within the
    acceleration limits (``Protection.begin``)."""
    prog = Program(plan, np.asarray(vmax) * (1 + 1e-6), np.asarray(amax) * (1 + 1e-6), kind="path")
    prog.r = prog.target = 1.0  # as planned (its rate cap >= 1 up to rounding)
    return prog


def run_channels(config, drives, s: int) -> list[tuple[str, int, str]]:
    """The log channels a run adds with ``[protect]`` enabled (``run.channel_list``'s ``extra``):
    ``residual``, and on a simulated plant with a contact the truth, ``contact_force`` and
    ``contact_tool``; none when it is off."""
    if not config.protect.enabled:
        return []
    out = [("residual", s, "force")]
    if getattr(drives, "contacts", None):
        out += [("contact_force", s, "force"), ("contact_tool", 3, "N")]
    return out


class NoProtection:
    """A run without ``[protect]``: the run's own reference, no contact hook, no channels (so the
    cycle calls the same methods either way)."""

    channels: tuple = ()
    reacting = False

    def reference(self, session, k: int) -> tuple | None:
        return session._reference(k)

    def hook_of(self, k: int, refs: tuple) -> None:
        return None

    def cycle_end(self, session, k: int, reason: str | None) -> str | None:
        return reason

    def summary(self) -> dict:
        return {"enabled": False}


class RunProtection(Protection):
    """The contact detection of a run (``pkrt.rt.runtime.machine.run.Session``): the log's channels
    (``residual``, and for a simulated contact the truth: ``contact_force`` at the actuators and
    ``contact_tool`` at the tool), the hook the cycle calls on a detection (``hook``, with the
    cycle ``k`` and its reference ``refs`` set before), the truth staged and the reaction followed
    after each cycle (``cycle_end``)."""

    def __init__(self, session, config, ctrl, drives, axes, units, tool_force=None):
        super().__init__(config.protect, config.limits, axes, units, 1.0 / config.rate_hz, tool_force)
        self.session, self.ctrl, self.drives = session, ctrl, drives
        s = self.s
        self.arm(ctrl)
        self.truth = bool(getattr(drives, "contacts", None))
        self.channels = run_channels(config, drives, s)
        self.col = 4 + 8 * s  # the truth's first column in the staged row (after CHANNELS and the residual)
        self.k, self.refs = 0, None
        self.peak_true = 0.0

    @classmethod
    def of(cls, session, config, ctrl, drives, axes, units, tool_force=None) -> "RunProtection | NoProtection":
        """The run's protection when ``[protect]`` is enabled, else ``NoProtection``."""
        if not config.protect.enabled:
            return NoProtection()
        return cls(session, config, ctrl, drives, axes, units, tool_force)

    def reference(self, session, k: int) -> tuple | None:
        """Cycle k's reference: the reaction's while it runs, else the run's (``Session._reference``)."""
        if self.source is None:
            return session._reference(k)
        src = self.step()
        return src.pos, src.vel, src.acc

    def hook_of(self, k: int, refs: tuple):
        """The contact hook of cycle k (its reference ``refs``): ``hook``."""
        self.k, self.refs = k, refs
        return self.hook

    def hook(self, axis: int) -> str | None:
        """A contact on ``axis`` in cycle ``k`` (the first of the run; later ones are ignored while
        the reaction runs): its event logged, its reaction begun (a reason: torque off now)."""
        if self.event is not None:
            return None
        sn, k = self.session, self.k
        fb = self.drives.feedback
        ev = self.detect(k, axis, self.ctrl, fb)
        if self.truth:
            c = self.drives.contacts[0]
            ev["true"] = {"onset_s": c.onset, "tool_force_at_detection_n": float(np.linalg.norm(c.force)),
                          "contact": c.describe()}
        path = None
        if self.table.reaction == "stop":
            path = stop_path(sn.ref.rows(k, int(1.0 / self.period)), self.vmax, self.amax)
        reason = self.begin(k, path, self.refs, fb)
        if sn.writer:
            sn.writer.event(k, "contact", self.log_text(ev))
        return reason

    def cycle_end(self, session, k: int, reason: str | None) -> str | None:
        """After cycle k (``reason``: its fault, None): the truth channels staged (a simulated
        contact); a reaction followed: its end's reason."""
        if reason is not None:
            return reason
        if self.truth:
            tau, force = self.drives.contact_truth()
            row, c, s = session.row, self.col, self.s
            row[c:c + s] = tau
            row[c + s:c + s + 3] = force
            self.peak_true = max(self.peak_true, float(np.linalg.norm(force)))
            if self.event is not None:
                self.event["true"]["peak_tool_force_n"] = self.peak_true
        if self.source is None:
            return None
        return self.after(k, self.ctrl, self.drives.feedback)


    def summary(self) -> dict:
        out = super().summary()
        if self.truth:  # the simulated contact's largest force over the run, detected or not
            out["true_peak_tool_force_n"] = self.peak_true
        return out


class MachineProtection(Protection):
    """The contact detection of a served machine (``pkrt.rt.runtime.machine.served.Machine``): a contact
    (the first since the last reset) logs its event, makes the machine's own motion source stop
    (``stop``) or replaces it by the reflex, with the machine in ``stopping``; the reaction's end
    is its error stop (``cycle_end``: the reason, and whether it holds: after a reflex)."""

    def __init__(self, machine, config, tool_force=None):
        super().__init__(config.protect, config.limits, machine.axes, machine.units, 1.0 / config.rate_hz,
                         tool_force)
        self.machine = machine
        self.arm(machine.ctrl)
        self.channels = [("residual", self.s, "force")]
        self.k = 0

    @classmethod
    def of(cls, machine, config, tool_force=None) -> "MachineProtection | None":
        return cls(machine, config, tool_force) if config.protect.enabled else None

    def warm_up(self, views: dict) -> None:
        """The unfused path's observer kernel compiled (or loaded) before the loop, on a copy of
        the state; ``views``: the log row's channels (the residual's is staged each cycle)."""
        from pkrt.rt.runtime.cycle.observer import observe_staged

        c = self.machine.ctrl
        z = np.zeros(self.s)
        observe_staged(c.obs.copy(), 0, z, c.H, c.D, c.p, c.w, c.gains, c.tau, z, -1)
        self.view = views["residual"]

    def hook(self, axis: int) -> str | None:
        """A contact on ``axis`` in cycle ``k``: ignored while a reaction runs or the machine is in
        error stop; else its event and reaction (a reason: torque off now)."""
        from pkrt.rt.runtime.machine.states import State

        m = self.machine
        if self.source is not None and self.source is not m.source:
            self.source = None  # a reaction cut short by an error stop, and the machine enabled again
        if self.source is not None or m.state is State.ERROR_STOP:
            return None
        src, fb = m.source, m.drives.feedback
        ev = self.detect(self.k, axis, m.ctrl, fb)
        m.event("contact", self.log_text(ev))
        reason = self.begin(self.k, src, (src.pos, src.vel, src.acc), fb)
        if reason is None:
            m.source, m.owner = self.source, None
            programs.cancel_planning(m, f"cancelled: {self.reason()}")
            m.set_state(State.STOPPING, self.reason())
        return reason

    def cycle_end(self, k: int) -> tuple[str | None, bool]:
        """After cycle k: the residual staged; a reaction followed: its end's reason and whether the
        machine holds (a reflex) rather than taking the torque off."""
        self.view[:] = residual(self.machine.ctrl.obs, self.s)
        if self.source is not None and self.source is not self.machine.source:
            self.source = None  # the reaction was cut short (an emergency stop, a fault): it is over
        if self.source is None:
            return None, False
        hold = self.table.reaction == "reflex"
        return self.after(k, self.machine.ctrl, self.machine.drives.feedback), hold


__all__ = ["Protection", "NoProtection", "RunProtection", "MachineProtection", "REACTION_TEXT", "run_channels",
           "stop_path"]
