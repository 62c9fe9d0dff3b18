"""A served machine: the fixed-rate read -> safety -> controller -> write cycle of a run
(``pkrt.rt.runtime.cycle.cycleparts.control_step``) kept up indefinitely, with the PLCopen-style states of
``states`` and a motion source (``motion``, ``live``) giving each cycle's reference.

Commands arrive from other threads (the socket server) through ``submit`` and are executed
at the start of a cycle, in the loop's thread, so a command never races the cycle; each gets
a reply dict (``ok``, and ``error`` with the reason when refused). Anything slow (planning a
path, inverse kinematics, reading a file) is done by the caller before submitting: the loop
only swaps motion sources. Every command and state change is an event in the run log.
Units: actuator units (m or rad), seconds.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

import numpy as np

from pkrt.rt.runtime.machine.config import MachineConfig
from pkrt.rt.runtime.cycle.controller import FLAG_OVERRUN, Controller
from pkrt.rt.runtime.cycle.loop import RealClock, VirtualClock, apply_realtime, percentiles_us, restore_realtime
from pkrt.rt.core.plan import Planned
from pkrt.rt.runtime.cycle.cycleparts import PARTS
from pkrt.rt.runtime.cycle.pacing import PACINGS, HostDelays, default_pacing, next_cycle
from pkrt.rt.runtime.cycle.cycleparts import control_step
from pkrt.rt.runtime.machine.runsetup import tree_axes
from pkrt.rt.runtime.machine import commands, programs, servedrow
from pkrt.rt.runtime.machine.journal import Journal, machine_status
from pkrt.rt.runtime.machine.motion import Hold, Program, Source, motion_limits
from pkrt.rt.runtime.machine.pending import Pending
from pkrt.rt.runtime.machine.programevents import Outputs
from pkrt.rt.runtime.machine.protect import MachineProtection
from pkrt.rt.runtime.machine.settings import ServeSettings, soft_limits
from pkrt.rt.runtime.machine.states import ENABLED, State
from pkrt.rt.runtime.cycle.safety import Supervisor
from pkrt.rt.runtime.machine.homing import home_cycle
from pkrt.rt.core.tree import Tree

LONG_RING = 1024  # long cycles remembered (``long_at``)


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
        self.jobs = 0  # programs accepted for planning so far (their job numbers)
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
        servedrow.open_row(self, log_path, lockstep)  # the log (or a plain row) and its views
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
        programs.outputs_off(self, f"fault: {reason}")
        self.source = Hold(self.drives.feedback.position.copy() if self.prepared else self.source.pos.copy())
        self.owner = self.homing = None
        programs.cancel_planning(self, f"cancelled: {reason}")
        self.event("fault", reason)
        self.set_state(State.ERROR_STOP, reason)

    def status(self) -> dict:
        return machine_status(self)

    # -- the cycle (loop thread) -------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            try:
                p = self._q.get_nowait()
            except queue.Empty:
                return
            commands.execute(self, p)

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
        servedrow.stage(self, t, wake, flags)
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
            programs.program_events(self, src)
        if src.done and st in (State.MOVING, State.STOPPING):
            why = "stopped" if st is State.STOPPING else f"{src.kind} done"
            if getattr(src, "stale", False):
                why = src.stale
            if st is State.STOPPING and src.kind == "program":
                programs.outputs_off(self, "program stopped")
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
                        commands.execute(self, p)
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
