"""A served machine: the fixed-rate read -> safety -> controller -> write cycle of a run
(``pkrt.rt.runtime.machine.run.control_step``) kept up indefinitely, with the PLCopen-style states of
``states`` and a motion source (``motion``, ``live``) giving each cycle's reference.

Commands arrive from other threads (the socket server) through ``submit`` and are executed
at the start of a cycle, in the loop's thread, so a command never races the cycle; each gets
a reply dict (``ok``, and ``error`` with the reason when refused). Anything slow (planning a
path, inverse kinematics, reading a file) is done by the caller before submitting: the loop
only swaps motion sources. Every command and state change is an event in the run log.
Units: actuator units (m or rad), seconds.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from pkrt.rt.runtime.machine.config import MachineConfig
from pkrt.rt.runtime.cycle.controller import FLAG_OVERRUN, Controller
from pkrt.rt.runtime.cycle.loop import RealClock, VirtualClock, apply_realtime, percentiles_us, restore_realtime
from pkrt.rt.core.plan import Planned
from pkrt.rt.runtime.cycle.cycleparts import PARTS
from pkrt.rt.runtime.machine.run import PACINGS, HostDelays, channel_list, control_step, default_pacing, next_cycle, tree_axes
from pkrt.rt.runtime.machine.journal import COMMANDS as JOURNAL_COMMANDS, Journal, run_status
from pkrt.rt.runtime.machine.motion import Hold, JointJog, Program, Source, motion_limits
from pkrt.rt.runtime.machine.pending import Pending
from pkrt.rt.runtime.machine.programevents import Outputs
from pkrt.rt.runtime.machine.protect import MachineProtection
from pkrt.rt.runtime.machine.states import ENABLED, State, refusal
from pkrt.rt.runtime.cycle.safety import Supervisor
from pkrt.rt.runtime.machine.homing import home, home_cycle
from pkrt.rt.core.tree import Tree

STATE_CODES = {s: i for i, s in enumerate(State)}  # the ``state`` channel of logs and telemetry
# the server's internal commands -> the command whose allowed states they have
INTERNAL = {"plan": "run", "planned": "status"}
PLANNING_REFUSES = ("jog", "move", "run", "plan", "stream", "home")  # while a program is planned
LONG_RING = 1024  # long cycles remembered (``long_at``)


@dataclass
class ServeSettings:
    """Operating limits of a served machine, as fractions of the configuration's [limits]."""

    jog_speed: float = 0.25       # joint jog: fraction of the velocity limit
    jog_accel: float = 0.25       # jogs, stops of jogs and streams: fraction of the acceleration limit
    unhomed_speed: float = 0.05   # joint jog before homing: fraction of the velocity limit
    ramp_s: float = 0.25          # feed hold / resume / override: shortest 0 -> 100 % time of the scaling
    deadman_s: float = 0.5        # a continuous jog without a keep-alive for this long is released
    stream_timeout_s: float = 0.2  # a live-target stream without a target for this long stops
    soft_margin: float = 0.01     # soft limits: the actuator ranges shrunk by this fraction at each end
    limit_margin: float = 0.02    # references within the velocity and acceleration limits less this fraction


def soft_limits(config: MachineConfig, settings: ServeSettings) -> tuple[np.ndarray, np.ndarray]:
    """The soft limits (lo, hi): every reference a served machine follows stays inside them,
    a margin inside the actuator ranges that the safety supervisor and the plant's model guard
    (the machine tracks its reference with an error: at the range it would cross it)."""
    lo, hi = config.limits.position[:, 0], config.limits.position[:, 1]
    m = settings.soft_margin * (hi - lo)
    return lo + m, hi - m


class Machine:
    """The long-running loop. ``start`` is where a simulated plant starts (real drives stay
    where they are). Drives with absolute encoders (simulated plant, Dynamixel) are homed by
    ``home`` at once; CiA 402 drives run homing mode 6 (``pkrt.drivers.cia402_homing``) in a
    helper thread while the loop waits in ``homing`` without drive I/O."""

    def __init__(self, config: MachineConfig, drives, tree: Tree, *, start: np.ndarray, lockstep: bool = False,
                 log_path: str | None = None, telemetry=None, settings: ServeSettings | None = None,
                 realtime: bool = False, controller: str | None = None, pacing: str | None = None, guard=None,
                 tool_force=None):
        self.config, self.drives, self.tree = config, drives, tree
        self.guard = guard  # streams and velocity jogs: (pos, stopping point) -> why not (``motion.guarded``)
        self.pacing = pacing or default_pacing(drives)
        if self.pacing not in PACINGS:
            raise ValueError(f"pacing {self.pacing!r}: expected one of {', '.join(PACINGS)}")
        self.lockstep, self.telemetry, self.realtime = lockstep, telemetry, realtime
        self.settings = settings or ServeSettings()
        self.axes, self.units = tree_axes(tree)
        s = self.s = tree.s
        c = config.controller
        self.ctrl = Controller(tree, controller or c.kind, c.kp, c.kd, c.tau_max, c.viscous, c.coulomb)
        self.sup = Supervisor(config.limits, self.axes, self.units)
        self.protect = MachineProtection.of(self, config, tool_force)  # [protect]: contacts (rt/runtime/machine/protect.py)
        self.holding = False  # in error stop after a contact's reflex: holding, torque on, until reset
        lim = config.limits
        self.lo, self.hi = soft_limits(config, self.settings)
        self.vmax, self.amax = motion_limits(lim, self.settings.limit_margin)
        self.period = 1.0 / config.rate_hz
        self.start_pos = np.asarray(start, float).copy()
        self.state = State.DISABLED
        self.state_reason = "start"  # why the machine entered its state (a stream's guard, a stale stream, ...)
        self.homed = False
        self.prepared = False
        self.source: Source = Hold(self.start_pos)
        self.override = 1.0
        self.fault_reason: str | None = None
        self.fault_time: float | None = None  # time.monotonic() of the fault (the host-pause probe's clock)
        self.k = 0
        self.t = 0.0
        self.overruns = self.cycles = 0
        self.long_cycles = 0  # cycles whose work (wake-up excluded) took longer than the period, wall time
        self.long_cycles_cpu = 0  # ... in the loop thread's CPU time (other threads excluded; on a virtual
        # machine a pause of the hypervisor while the thread runs counts as its CPU time: measured here)
        # the last LONG_RING long cycles: (time.monotonic() at the cycle's end, wall s, CPU s, cycle)
        self.long_at: deque[tuple[float, float, float, int]] = deque(maxlen=LONG_RING)
        self.delays = HostDelays()  # late cycles (the host held the process, or a long cycle)
        self.owner = None      # who runs the current jog or stream (a connection's id)
        self.last_alive = 0.0  # monotonic time of its last keep-alive
        self.homing = None
        self.outputs = Outputs()  # spindle, coolant, tool as the program's events left them
        self.planning: dict | None = None     # the program being planned out of process (``plan``)
        self.plan_result: dict | None = None  # how the last planned program ended (started, refused, cancelled)
        self._jobs = 0
        self.home_result: dict | None = None  # what the drives reported when homing ended
        self.journal, self.program = Journal(), None  # recent events; the last program run: (file, its source)
        self.shutdown_reason: str | None = None
        self.finished = threading.Event()
        # queue.Queue, not SimpleQueue: CPython 3.11's SimpleQueue.get(timeout) can block forever when
        # it takes its lock on an empty queue (an item taken by get_nowait) after its deadline passed
        # (seen as a hung lockstep test, the loop thread in a futex wait with no timeout)
        self._q: queue.Queue[Pending] = queue.Queue()
        self._stamps = np.zeros(len(PARTS) + 2, dtype=np.int64)  # control_step's, allocated once
        self.ref_now = self.start_pos.copy()  # the last reference (read by other threads for planning)
        self.pos_now = self.start_pos.copy()  # the last feedback
        self.comp = np.zeros(1 << 16)  # the last 65536 cycles' compute times (s), a ring
        self.comp_cpu = np.zeros(1 << 16)  # ... in the loop thread's CPU time (s), a ring
        self.writer = None
        channels = channel_list(s, self.units[0], self.protect.channels if self.protect else ()) + [("state", 1, "code")]
        if log_path:
            from pkrt.rt.runtime.record.logfile import LogWriter

            header = {"machine": config.raw, "machine_path": config.path, "tree_path": config.tree,
                      "rate_hz": config.rate_hz, "axes": self.axes, "units": self.units, "served": True,
                      "state_codes": {st.value: i for st, i in STATE_CODES.items()},
                      "lockstep": lockstep, "plant": drives.describe()}
            self.writer = LogWriter(log_path, header, channels)
            self.row, self.slices, self.views = self.writer.row, self.writer.slices, self.writer.views
        else:
            sl, n = {}, 0
            for name, width, _ in channels:
                sl[name], n = slice(n, n + width), n + width
            self.row, self.slices = np.zeros(n), sl
            self.views = {name: self.row[x] for name, x in sl.items()}
        self.clock = VirtualClock() if lockstep else RealClock()
        self.rt_report: dict = {}
        # warm the kernels before the first deadline
        z = np.zeros(s)
        self.ctrl.update(self.start_pos, z, self.start_pos, z, z)
        still = np.array([self.start_pos, self.start_pos])  # and the program player's first call
        Program(Planned(config.rate_hz, still, 0 * still, 0 * still, {}), self.vmax, self.amax).step(self.period)
        if self.protect is not None:
            self.protect.warm_up(self.views)

    # -- commands (any thread) --------------------------------------------------------------------
    def submit(self, cmd: dict) -> Pending:
        p = Pending(cmd)
        if self.finished.is_set():
            p.set({"ok": False, "error": "the machine's loop has ended"})
        else:
            self._q.put(p)
        return p

    def call(self, cmd: dict, timeout: float = 5.0) -> dict:
        return self.submit(cmd).wait(timeout)

    # -- state and events (loop thread) -----------------------------------------------------------
    def event(self, kind: str, text: str) -> None:
        self.journal.add(self.t, kind, text)
        if self.writer:
            self.writer.event(self.k, kind, text)

    def set_state(self, new: State, why: str) -> None:
        if new is not self.state:
            self.event("state", f"{self.state.value} -> {new.value}: {why}")
            self.state, self.state_reason = new, why

    def fault(self, reason: str, *, estop: bool = False, hold: bool = False) -> None:
        """Torque off at once, error stop with the reason (``hold``: after a contact's reflex, the
        torque stays on, the machine holding where it is until reset)."""
        self.holding = hold
        if hold:
            pass
        elif estop:
            self.drives.disable()
        else:
            self.drives.fault(reason)
        self.fault_reason, self.fault_time = reason, time.monotonic()
        self._outputs_off(f"fault: {reason}")
        self.source = Hold(self.drives.feedback.position.copy() if self.prepared else self.source.pos.copy())
        self.owner = self.homing = None
        self._cancel_planning(f"cancelled: {reason}")
        self.event("fault", reason)
        self.set_state(State.ERROR_STOP, reason)

    def status(self) -> dict:
        return {"state": self.state.value, "state_reason": self.state_reason, "homed": self.homed, "cycle": self.k, "time_s": self.t,
                "axes": self.axes, "units": self.units, "position": self.pos_now.tolist(),
                "reference": self.ref_now.tolist(), "reference_velocity": self.source.vel.tolist(), "motion": self.source.status(), "override": self.override,
                "fault": self.fault_reason, "fault_time": self.fault_time, "overruns": self.overruns,
                "long_cycles": self.long_cycles,
                "long_cycles_cpu": self.long_cycles_cpu, "pacing": "lockstep" if self.lockstep else self.pacing,
                "lockstep": self.lockstep,
                "torque_on": bool(self.drives.torque_on), "home_result": self.home_result,
                "planning": self.planning, "plan_result": self.plan_result, "events": self.journal.status(),
                **self.outputs.status(),
                "torque": (self.ctrl.tau if self.drives.torque_on else 0 * self.ctrl.tau).tolist(),
                "program": run_status(self.program), "holding": self.holding,
                "contact": self.protect.event if self.protect else None}

    # -- command handling (loop thread) -----------------------------------------------------------
    def _execute(self, p: Pending) -> None:
        cmd = p.cmd
        name = cmd.get("cmd")
        try:
            reply = self._command(name, cmd)
        except (ValueError, TypeError, KeyError) as e:  # a malformed argument the caller did not catch
            reply = {"ok": False, "error": f"{name}: bad argument: {e}"}
        if name not in ("status", "alive", "events", "info"):
            self.event("command", json.dumps({k: v for k, v in cmd.items() if k not in ("plan", "peaks")}, default=str)
                       + (" -> ok" if reply.get("ok") else f" -> refused: {reply.get('error')}"))
        reply.setdefault("state", self.state.value)
        p.set(reply)

    def _command(self, name, cmd: dict) -> dict:
        if self.planning is not None and name in ("stop", "disable"):
            self._cancel_planning(f"cancelled by {name}")
            if self.state is State.STANDSTILL and name == "stop":
                return {"ok": True, "note": "planning cancelled"}
        if self.planning is not None and name in PLANNING_REFUSES:
            return {"ok": False, "error": f"{name} refused: a program is being planned (stop cancels it)"}
        why = refusal(INTERNAL.get(name, str(name)), self.state)
        if why is not None:
            return {"ok": False, "error": why}
        handler = self._COMMANDS.get(name) if isinstance(name, str) else None
        if handler is None:
            return {"ok": False, "error": f"unknown command '{name}'"}
        return handler(self, cmd)

    # Each handler: (the command's JSON object) -> the reply; state checks done by ``refusal``.
    def _alive(self, cmd: dict) -> dict:
        if self.owner is not None and cmd.get("owner") == self.owner:
            self.last_alive = time.monotonic()
        return {"ok": True}

    def _plan(self, cmd: dict) -> dict:
        """A program accepted for planning out of process: the machine stays at standstill
        (holding) until ``planned`` brings the plan; the plan starts at ``theta0``."""
        self._jobs += 1
        self.planning = {"job": self._jobs, "file": cmd.get("file"), "since_s": self.t}
        self.event("planning", json.dumps(self.planning))
        return {"ok": True, "planning": True, "job": self._jobs, "theta0": self.source.pos.tolist()}

    def _planned(self, cmd: dict) -> dict:
        """The planning of job ``job`` ended: its plan (``plan``) starts, or ``error`` says why not."""
        job = cmd.get("job")
        if self.planning is None or self.planning["job"] != job:
            return {"ok": False, "error": f"run: plan {job} dropped (it was cancelled)"}
        (since, file), self.planning = (self.planning["since_s"], self.planning["file"]), None
        if "error" in cmd:
            reply = {"ok": False, "error": f"run refused: {cmd['error']}"}
        else:
            why = refusal("run", self.state)
            reply = {"ok": False, "error": why} if why is not None else self._program({**cmd, "file": file}, "run")
        self.plan_result = {"job": job, "planning_s": self.t - since, "cycle": self.k, **reply}
        if not reply["ok"]:
            self.event("planning", f"job {job}: {reply['error']}")
        return reply

    def _cancel_planning(self, why: str) -> None:
        if self.planning is not None:
            job, self.planning = self.planning["job"], None
            self.plan_result = {"job": job, "ok": False, "error": f"run {why}"}
            self.event("planning", f"job {job}: {why}")

    def _disable(self, cmd: dict) -> dict:
        self.drives.disable()
        self.source = Hold(self.source.pos.copy())
        self.set_state(State.DISABLED, "disable")
        return {"ok": True}

    def _reset(self, cmd: dict) -> dict:
        self.fault_reason, self.holding = None, False
        self.drives.disable()
        self.set_state(State.DISABLED, "reset")
        return {"ok": True}

    def _override(self, cmd: dict) -> dict:
        f = float(cmd["value"])
        if not (np.isfinite(f) and 0.0 <= f <= 1.2):
            return {"ok": False, "error": f"override must be in [0, 1.2] (0 to 120 %), got {cmd['value']}"}
        self.override = f
        if isinstance(self.source, Program):
            self.source.set_override(f)
        return {"ok": True, "override": f}

    def _release(self, cmd: dict) -> dict:
        src = self.source
        if self.state is State.MOVING and src.kind == "jog" and (cmd.get("owner") in (None, self.owner)):
            src.stop()
            self.set_state(State.STOPPING, cmd.get("why", "jog released"))
        return {"ok": True}

    def _hold(self, cmd: dict) -> dict:
        src = self.source
        if not isinstance(src, Program) or src.kind == "jog":
            return {"ok": False, "error": f"hold refused: the {src.kind} is not a move or program (stop it instead)"}
        src.hold()
        return {"ok": True}

    def _resume(self, cmd: dict) -> dict:
        self.source.resume()
        self.set_state(State.MOVING, "resume")
        return {"ok": True}

    def _stop(self, cmd: dict) -> dict:
        if self.state is State.HOMING:
            self._home_abort("stopped")
            return {"ok": True, "note": "homing halted: the machine goes to error stop (not homed)"}
        self.source.stop()
        self.owner = None
        self.set_state(State.STOPPING, "stop")
        return {"ok": True}

    def _estop(self, cmd: dict) -> dict:
        self.fault("emergency stop", estop=True)
        return {"ok": True}

    # command name -> handler (called with the machine and the command)
    _COMMANDS = {
        "status": lambda m, cmd: {"ok": True, "status": m.status()},
        "alive": _alive, "enable": lambda m, cmd: m._enable(), "disable": _disable, "estop": _estop,
        "reset": _reset, "override": _override, "home": lambda m, cmd: home(m, cmd), "release": _release,
        "jog": lambda m, cmd: m._jog(cmd), "move": lambda m, cmd: m._program(cmd, "move"),
        "run": lambda m, cmd: m._program(cmd, "run"), "stream": lambda m, cmd: m._stream(cmd),
        "hold": _hold, "resume": _resume, "stop": _stop, "plan": _plan, "planned": _planned, **JOURNAL_COMMANDS,
    }

    def _enable(self) -> dict:
        d = self.drives
        if not self.prepared:
            d.prepare(self.start_pos.copy())
            self.prepared = True
        try:
            d.configure()
            d.enable()
            fb = d.read(self.t)
        except Exception as e:  # noqa: BLE001 - a drive that does not come up: torque off, refused
            d.disable()
            return {"ok": False, "error": f"enable failed: {e}"}
        lim = self.config.limits.position
        if not (np.all(np.isfinite(fb.position)) and np.all(fb.position >= lim[:, 0]) and np.all(fb.position <= lim[:, 1])):
            d.disable()
            return {"ok": False, "error": f"enable refused: position {np.round(fb.position, 6).tolist()} "
                                          f"outside the actuator ranges"}
        self.sup.stale = self.sup.late = 0
        self.source = Hold(fb.position.copy())
        self.set_state(State.STANDSTILL, "enable")
        return {"ok": True}

    def _home_abort(self, why: str) -> None:
        """Halt the drives' homing (controlword bit 8); the homing ends in error stop."""
        if self.homing is not None:
            self.homing["halt"].set()
            self.homing["why"] = why

    def _jog(self, cmd: dict) -> dict:
        src, owner = self.source, cmd.get("owner")
        if self.state is State.MOVING and src.kind != "jog":
            return {"ok": False, "error": f"jog refused: a {src.kind} is running (stop it first)"}
        if "plan" in cmd:  # a planned jog (a step, or a task-space line): a program that release stops
            if self.state is not State.STANDSTILL:
                return {"ok": False, "error": "jog refused: a jog is running (release it first)"}
            return self._program(cmd, "jog")
        v = np.asarray(cmd["velocity"], float)
        if v.shape != (self.s,) or not np.all(np.isfinite(v)):
            return {"ok": False, "error": f"jog: velocity needs {self.s} finite values"}
        frac = self.settings.jog_speed if self.homed else self.settings.unhomed_speed
        vmax = frac * self.vmax
        if isinstance(src, JointJog) and self.state is State.MOVING:
            if owner != self.owner:
                return {"ok": False, "error": "jog refused: another client's jog is running"}
            src.set_velocity(v)
        else:
            if self.state is State.MOVING:
                return {"ok": False, "error": "jog refused: a planned jog is running (release it first)"}
            self.source = JointJog(src.pos.copy(), v, vmax, self.settings.jog_accel * self.amax, *self._limits_at(src.pos),
                                   self.guard, self.period)
            self.set_state(State.MOVING, "jog")
        self.owner, self.last_alive = owner, time.monotonic()
        return {"ok": True, "speed_cap": vmax.tolist(), "homed": self.homed}

    def _program(self, cmd: dict, name: str) -> dict:
        plan: Planned = cmd["plan"]
        if cmd.get("space") == "task" and not self.homed:
            return {"ok": False, "error": f"{name} refused: task-space motion needs the machine homed (pkrt ctl home)"}
        if abs(plan.rate_hz - self.config.rate_hz) > 1e-9:
            return {"ok": False, "error": f"{name}: planned at {plan.rate_hz} Hz, the loop runs at {self.config.rate_hz} Hz"}
        gap = np.abs(plan.pos[0] - self.source.pos).max()
        if gap > 1e-6:
            return {"ok": False, "error": f"{name} refused: it starts {gap:.3g} away from the machine's reference "
                                          f"(planned from a stale position)"}
        kind = "jog" if name == "jog" else ("move" if name == "move" else "program")
        f = cmd.get("file")
        info = {"file": f, "kind": "demo" if f == "demo" else ("gcode" if plan.line is not None else "csv")}
        self.source = Program(plan, self.vmax, self.amax, self.settings.ramp_s, self.override, kind=kind,
                              peaks=cmd.get("peaks"), info=info)
        self.owner = cmd.get("owner") if kind == "jog" and cmd.get("continuous") else None
        self.program = (str(cmd.get("file")), self.source) if name == "run" else self.program
        self.last_alive = time.monotonic()
        self.set_state(State.MOVING, name)
        return {"ok": True, "duration_s": plan.duration, "rate_cap": self.source.rate_cap}

    def _stream(self, cmd: dict) -> dict:
        from pkrt.rt.runtime.machine.live import LiveTarget

        src = self.source
        if cmd.get("space") == "task" and not self.homed:
            return {"ok": False, "error": "stream refused: task-space targets need the machine homed (pkrt ctl home)"}
        target = np.asarray(cmd["target"], float)
        if target.shape != (self.s,) or not np.all(np.isfinite(target)):
            return {"ok": False, "error": f"stream: a target needs {self.s} finite values"}
        if np.any(target < self.lo) or np.any(target > self.hi):
            return {"ok": False, "error": f"stream: target {np.round(target, 6).tolist()} outside the soft limits "
                                          f"{np.c_[self.lo, self.hi].round(6).tolist()}"}
        if self.state is State.MOVING:
            if not isinstance(src, LiveTarget) or src.stopping:
                return {"ok": False, "error": f"stream refused: a {src.kind} is running"}
            src.set_target(target, self.t)
            return {"ok": True}
        frac = self.settings.jog_speed if self.homed else self.settings.unhomed_speed
        self.source = LiveTarget(src.pos.copy(), target, self.t, frac * self.vmax, self.settings.jog_accel * self.amax,
                                 *self._limits_at(src.pos), self.period, self.settings.stream_timeout_s, self.guard)
        self.owner = cmd.get("owner")
        self.set_state(State.MOVING, "stream")
        return {"ok": True}

    def _limits_at(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The soft limits widened to ``pos``, where a motion starts: a machine enabled or
        stopped beyond them (by its tracking error) holds there, and may come back, never go further."""
        return np.minimum(self.lo, pos), np.maximum(self.hi, pos)

    # -- the cycle (loop thread) -------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            try:
                p = self._q.get_nowait()
            except queue.Empty:
                return
            self._execute(p)

    def cycle(self, k: int) -> int:
        period = self.period
        self.k, self.t = k, t = k, k * period
        wake = self.clock.wait_until(t)
        t0, c0 = time.perf_counter(), time.thread_time()
        self._drain()
        st = self.state
        if self.shutdown_reason is not None and st is State.MOVING:
            self.source.stop()
            self.set_state(State.STOPPING, self.shutdown_reason)
        if st is State.MOVING and self.owner is not None and self.source.kind == "jog" \
                and time.monotonic() - self.last_alive > self.settings.deadman_s:
            self.source.stop()
            self.owner = None
            self.set_state(State.STOPPING, f"dead-man: no keep-alive for {self.settings.deadman_s:g} s")
        flags = 0
        if self.state is State.HOMING:
            home_cycle(self)
        if (self.state in ENABLED or self.holding) and self.state is not State.HOMING:
            flags = self._control(k, t)
        elif self.protect is not None:
            self.protect.view[:] = 0.0  # not observing: no residual
        self.ref_now[:] = self.source.pos
        nxt, lateness = next_cycle(self.clock, k, period, self.pacing)
        self._lateness(k, lateness)
        if lateness > 0.0:
            flags |= FLAG_OVERRUN
        work = self.comp[k & 0xFFFF] = time.perf_counter() - t0
        cpu = self.comp_cpu[k & 0xFFFF] = time.thread_time() - c0
        if work > period:
            self.long_cycles += 1
            self.long_at.append((t0 + work, work, cpu, k))
            if cpu > period:
                self.long_cycles_cpu += 1
        self.cycles += 1
        self._stage(t, wake, flags)
        return nxt

    def _control(self, k: int, t: float) -> int:
        """The motion source's reference of cycle k through ``control_step``; the contact
        observer's residual and reaction (``MachineProtection``); returns the cycle's flags."""
        src, pr, hold = self.source, self.protect, False
        src.step(self.period)
        if pr is not None:
            pr.k = k
        reason, flags, _, _, _ = control_step(self.drives, self.sup, self.ctrl, t, src.pos, src.vel, src.acc,
                                            self._stamps, k, pr and pr.hook)
        if reason is None and pr is not None:
            reason, hold = pr.cycle_end(k)  # the residual staged; a contact's reaction at its end
        if reason is not None:
            self.fault(reason, hold=hold)
        elif not (pr and pr.reacting):
            self._after_step(src)
        self.pos_now[:] = self.drives.feedback.position
        return flags

    def _lateness(self, k: int, lateness: float) -> None:
        """A cycle that ended past the next deadline: with pacing ``skip`` (real drives) a
        missed cycle for the watchdog; with ``delay`` (a plant that pauses with the loop: the
        simulated plant, the stepped HIL emulators) a delay, counted, not a fault."""
        late = lateness > 0.0
        if late:
            self.delays.add(k, lateness, time.monotonic())
        if self.state not in ENABLED:
            return
        if late:
            self.overruns += 1
        wd = self.sup.overrun(late and self.pacing == "skip")
        if wd is not None:
            self.fault(wd)

    def _after_step(self, src: Source) -> None:
        st = self.state
        if getattr(src, "fired", None):
            self._program_events(src)
        if src.done and st in (State.MOVING, State.STOPPING):
            why = "stopped" if st is State.STOPPING else f"{src.kind} done"
            if getattr(src, "stale", False):
                why = src.stale
            if st is State.STOPPING and src.kind == "program":
                self._outputs_off("program stopped")
            self.source = Hold(src.pos.copy())
            self.owner = None
            self.set_state(State.STANDSTILL, why)
        elif st is State.MOVING and isinstance(src, Program) and src.held and src.at_rest:
            self.set_state(State.HOLDING, src.waiting["text"] if src.waiting else "feed hold")
        elif st is State.MOVING and getattr(src, "stopping", False):
            self.set_state(State.STOPPING, getattr(src, "stale", None) or "stop")
        limit = getattr(src, "limit_error", None)
        if limit:
            self.fault(limit)

    def _program_events(self, src: Program) -> None:
        """The events the program passed this cycle: logged, the outputs set on the drives."""
        for ev in src.fired:
            self.drives.set_outputs(self.outputs.apply(ev), self.t)
            self.event(ev["kind"], ev["text"])
        src.fired.clear()

    def _outputs_off(self, why: str) -> None:
        """Spindle and coolant off (a program stopped early, a fault), logged if they were on."""
        ch = self.outputs.off()
        if ch:
            self.drives.set_outputs(ch, self.t)
            self.event("outputs", f"{why}: spindle and coolant off")

    def _stage(self, t: float, wake: float, flags: int) -> None:
        v, src, fb = self.views, self.source, self.drives.feedback
        v["t"][0] = t
        v["ref_pos"][...] = src.pos
        v["ref_vel"][...] = src.vel
        v["ref_acc"][...] = src.acc
        v["pos"][...] = fb.position
        v["vel"][...] = fb.velocity
        v["tau"][...] = self.ctrl.tau if self.drives.torque_on else 0.0
        v["tau_model"][...] = self.ctrl.tau_model
        v["wake_us"][0] = wake * 1e6
        v["compute_us"][0] = self.comp[self.k & 0xFFFF] * 1e6
        v["flags"][0] = flags
        v["state"][0] = STATE_CODES[self.state]
        if self.writer:
            self.writer.commit()
        if self.telemetry is not None:
            self.telemetry.maybe_send(self.k, t, self.row, self.slices)

    # -- the loop ----------------------------------------------------------------------------------
    def idle(self) -> bool:
        """Nothing moves under the loop's control (homing drives move themselves, in wall time)."""
        return self.state not in (State.MOVING, State.STOPPING)

    def _apply_realtime(self) -> None:
        """The configuration's real-time settings (real time only), then what the loop does not
        use unlocked (warmed up at construction; the drives are not enabled yet)."""
        if not self.lockstep and self.realtime:
            r = self.config.realtime
            self.rt_report = apply_realtime(r.priority, r.cpu, r.mlockall, r.gc_freeze)
            if self.rt_report["mlockall"].startswith("applied"):
                from pkrt.rt.runtime.cycle.memory import release_unused

                self.rt_report["unlocked"] = release_unused()
        elif not self.lockstep:  # the loop must get the GIL back from planning threads within its period
            self.rt_report = apply_realtime(0, -1, False, False)

    def run(self, max_cycles: int | None = None, on_cycle=None) -> dict:
        """Cycle until ``shutdown`` (then stop any motion, torque off) or ``max_cycles``.
        ``on_cycle(machine)`` (tests) runs before each cycle in the loop's thread. In lockstep
        an idle machine waits up to 1 ms of wall time for a command each cycle (no busy loop)."""
        self._apply_realtime()
        k = 0
        wall0 = time.perf_counter()
        try:
            if not self.lockstep:
                self.clock.t0 = time.monotonic() + 2 * self.period
            while max_cycles is None or self.cycles < max_cycles:
                if on_cycle is not None:
                    on_cycle(self)
                if self.lockstep and self.idle() and self._q.empty():
                    try:
                        p = self._q.get(timeout=0.001)
                        self.k, self.t = k, k * self.period  # it takes effect in cycle k: its events say so
                        self._execute(p)
                    except queue.Empty:
                        pass
                k = self.cycle(k)
                if self.shutdown_reason is not None and self.state is not State.STOPPING \
                        and self.state is not State.MOVING:
                    break
        except BaseException as exc:
            self.fault(f"internal error: {type(exc).__name__}: {exc}", estop=True)
            raise
        finally:
            self.drives.disable()
            self.finished.set()
            while True:  # commands that came too late
                try:
                    self._q.get_nowait().set({"ok": False, "error": "the machine's loop has ended"})
                except queue.Empty:
                    break
            if self.rt_report:
                restore_realtime(self.rt_report)
            summary = self._summary(time.perf_counter() - wall0)
            if self.writer:
                self.writer.close(summary)
        return summary

    def _summary(self, wall_s: float) -> dict:
        return {"cycles": self.cycles, "overruns": self.overruns, "long_cycles": self.long_cycles,
                "long_cycles_cpu": self.long_cycles_cpu, "pacing": "lockstep" if self.lockstep else self.pacing,
                "host_delays": self.delays.summary(), "state": self.state.value, "fault": self.fault_reason,
                "fault_time": self.fault_time, "wall_s": wall_s, "compute_us": percentiles_us(self.comp[:min(self.cycles, len(self.comp))])}

    def shutdown(self, reason: str) -> None:
        """Ask the loop to end (any thread): motion stops under control, then torque off."""
        self.shutdown_reason = reason
