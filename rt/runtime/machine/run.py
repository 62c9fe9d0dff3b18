"""One controlled run of a machine (``run_session``, ``Session``): the reference checked
(``runsetup``), then the fixed-rate read -> safety -> control -> write -> log cycle, then a
summary (``runrecord``). The same cycle code runs in real time and in lockstep.
"""

from __future__ import annotations

import time

import numpy as np

from pkrt.drivers.base import Drives
from pkrt.rt.core.errors import Stopped, UserError
from pkrt.rt.core.tree import Tree
from pkrt.rt.runtime.cycle.controller import FLAG_OVERRUN, Controller
from pkrt.rt.runtime.cycle.cycleparts import CycleParts, timed_step, warm_up
from pkrt.rt.runtime.cycle.errorstats import ErrorStats
from pkrt.rt.runtime.cycle.lockstep import LockstepBlock
from pkrt.rt.runtime.cycle.loop import RealClock, VirtualClock, apply_realtime, restore_realtime
from pkrt.rt.runtime.cycle.memory import (bound_arenas, keep_freed_heap, kernel_moves, prefault, release_unused,
                                          reserve_heap, reserve_objects, status, thread_faults)
from pkrt.rt.runtime.cycle.pacing import PACINGS, HostDelays, default_pacing, next_cycle
from pkrt.rt.runtime.cycle.safety import Supervisor
from pkrt.rt.runtime.cycle.staging import stage_row
from pkrt.rt.runtime.cycle.stopsignals import StopSignals
from pkrt.rt.runtime.machine import runrecord
from pkrt.rt.runtime.machine.config import MachineConfig
from pkrt.rt.runtime.machine.programevents import Outputs, due
from pkrt.rt.runtime.machine.protect import RunProtection
from pkrt.rt.runtime.machine.refstream import RefStream
from pkrt.rt.runtime.machine.runsetup import load_controller_tree, reference_source, tree_axes
from pkrt.rt.runtime.machine.trajectory import Planned


def run_session(config: MachineConfig, drives: Drives, *, trajectory=None, duration=None,
                lockstep: bool = False, log_path: str | None = None, controller: str | None = None,
                telemetry=None, on_cycle=None, tree: Tree | None = None, realtime: bool = True,
                model=None, pacing: str | None = None, old_cycle: bool = False, compiled: bool = True,
                tool_force=None) -> dict:
    """Run the machine over the reference; disable the drives on every way out.

    ``on_cycle(k, t)`` (tests, fault injection) runs at the start of cycle k. Returns the
    summary (errors in actuator units, times in microseconds). A fault stops the run and is
    reported in ``fault``; it does not raise. SIGINT, SIGTERM, SIGHUP and SIGQUIT during the
    run stop it at the next cycle boundary the same way (``StopSignals``). ``model``: the
    model in the loop when not the tree (``Controller``), built outside the runtime.

    ``pacing`` (real time only; default ``default_pacing(drives)``): what a cycle that ends
    past the next deadline (the host held the process, or the cycle overran) does.
    ``skip``: the loop skips to the next period boundary and the overrun counts towards the
    watchdog (``[limits] watchdog_cycles`` in a row: fault) -- right for real drives, whose
    machine keeps moving while the host is held. ``delay``: the loop re-anchors its schedule
    (the next cycle runs at once, every later deadline moves by the delay), no period is
    skipped and the watchdog is not fed: the run is delayed, not broken, and its result is the
    lockstep one -- right for a plant that pauses with the loop (the simulated plant of ``pkrt
    run``, the stepped HIL emulators): for it a late cycle is no plant event, and on a virtual
    machine the host's pauses come in bursts (several late cycles in a row, docs/hil.md) that
    would trip a watchdog of N missed cycles. The watchdog stays for real drives (``skip``),
    whose machine does not pause. Either way the summary's ``host_delays`` names the delays
    (count, longest, when).

    ``old_cycle`` (benchmarks only): the cycle as before its per-part budget -- the simulated
    plant stepped inside the next ``read``, model and law in one kernel call, the log row
    staged by numpy slice assignments -- for a side-by-side comparison in one process.

    ``compiled`` (lockstep only): the plain cycles of a lockstep run on the simulated plant run
    in one compiled loop (``pkrt.rt.runtime.cycle.lockstep``), with the results of the Python cycle;
    False: every cycle through ``Session.cycle`` (tests and benchmarks compare the two).

    ``[protect]`` enabled: contact detection every cycle (``pkrt.rt.runtime.machine.protect``); a contact
    ends the run by its reaction. ``tool_force(theta, tau) -> dict``: its estimate at the tool
    (built from the model outside the runtime).
    """
    if pacing is None:
        pacing = default_pacing(drives)
    if pacing not in PACINGS:
        raise UserError(f"pacing {pacing!r}: expected one of {', '.join(PACINGS)}")
    with StopSignals() as stop:
        session = Session(config, drives, stop, trajectory=trajectory, duration=duration, lockstep=lockstep,
                          log_path=log_path, controller=controller, telemetry=telemetry, on_cycle=on_cycle,
                          tree=tree, realtime=realtime, model=model, pacing=pacing, old_cycle=old_cycle,
                          compiled=compiled, tool_force=tool_force)
        return session.run()


class Session:
    """One controlled run: planned and checked at construction (tree, reference, controller,
    log), then ``start`` (real-time settings, then the drives up), ``cycle`` (read -> safety ->
    controller -> write -> log/telemetry staging) until the reference ends or a fault, ``stop``
    (torque off, real-time settings restored) and ``summary`` (the log closed with it).
    Every way a run ends early goes through ``fault``: a drive error, a safety reason, the
    watchdog, a stop signal, an unexpected exception."""

    def __init__(self, config: MachineConfig, drives: Drives, stop: StopSignals, *, trajectory, duration,
                 lockstep: bool, log_path: str | None, controller: str | None, telemetry, on_cycle,
                 tree: Tree | None, realtime: bool, model=None, pacing: str = "skip", old_cycle: bool = False,
                 compiled: bool = True, tool_force=None):
        self.config, self.drives, self.stop_signals = config, drives, stop
        self.pacing = pacing
        self.lockstep, self.log_path, self.telemetry, self.on_cycle = lockstep, log_path, telemetry, on_cycle
        self.realtime = realtime
        tree = tree if tree is not None else load_controller_tree(config)
        s = tree.s
        self.ref = ref = RefStream(reference_source(config, tree, trajectory, duration), threaded=not lockstep)
        self.axes, self.units = axes, units = tree_axes(tree)
        self.kind = kind = controller or config.controller.kind
        if kind not in ("ct", "pd"):
            raise UserError(f"unknown controller '{kind}' (ct or pd)")
        c = config.controller
        if c.model == "exact" and model is None:
            raise UserError(f"{config.path}: [controller] model = \"exact\" needs the exact model, built from "
                            f"the model before the run (pkrt.rt.app.reference.exact_model)")
        self.model_kind = "exact" if model is not None else "tree"
        self.ctrl = Controller(tree, kind, c.kp, c.kd, c.tau_max, c.viscous, c.coulomb, model=model)
        self.sup = Supervisor(config.limits, axes, units)
        self.period = 1.0 / config.rate_hz
        self.protect = RunProtection.of(self, config, self.ctrl, drives, axes, units, tool_force)
        extra = self.protect.channels
        # preallocated per-cycle records: a ring of the last WINDOW cycles (memory independent of
        # the run's duration), written once here so that the loop takes no page fault on them
        N = self.window = min(ref.n, WINDOW)
        self.wake = np.zeros(N)
        self.comp = np.zeros(N)
        self.parts = CycleParts()  # the cycle's work per part (rt/runtime/cycle/cycleparts.py)
        self.tau_cols, self.wake_col = slice(1 + 5 * s, 1 + 6 * s), 1 + 7 * s  # in the staging row (CHANNELS)
        self.old_cycle = old_cycle
        self.err = np.zeros((N, s))
        self.ran = np.zeros(N, dtype=bool)
        self.errs = ErrorStats(s)  # tracking error over the whole run
        self.last_k = -1
        self.wake_max = self.comp_max = 0.0
        prefault(self.wake, self.comp, self.err, self.ran, self.parts.hist)
        # bounded before the log writer's and the reference's threads start (each would make its own)
        self.mem_report = ({"malloc_arenas": bound_arenas()}
                           if realtime and not lockstep and config.realtime.mlockall else {})
        heap = keep_freed_heap()  # before the reference's first blocks: their temporaries
        runrecord.open_log(self, tree, trajectory, extra)  # the log writer (or a plain row) and its views
        self.rt_report: dict = {}
        self.fault_reason: str | None = None
        self.fault_cycle = self.torque_off_cycle = None
        self.fault_time: float | None = None
        self.overruns = self.saturated = self.cycles = 0
        self.clock = VirtualClock() if lockstep else RealClock()
        self.delays = HostDelays()
        self.fb = drives.feedback  # the last reading, even if the first read fails
        self.wall = self.cpu = self.cpu0 = 0.0  # s: the loop's wall time, its thread's CPU time
        self.loop_end: float | None = None  # time.perf_counter() when the last cycle ended
        self.memory: dict = {"heap": heap}  # VmLck, VmRSS, pinned memory at the loop's start and end, its page faults
        # lockstep on the plain simulated plant: its plain cycles in one compiled loop
        self.block = LockstepBlock.of(self) if compiled else None
        # a program's events (G-code spindle, coolant, tool changes, stops): logged and set on the
        # drives at their cycle; nothing holds a run (no operator resumes it: pkrt serve holds)
        self.events = list(trajectory.events) if isinstance(trajectory, Planned) else []
        self.next_event = 0
        self.outputs = Outputs()

    # -- the one fault path ------------------------------------------------------------------------
    def fault(self, k: int, reason: str, *, drive_fault: bool = True) -> None:
        """Stop the run at cycle k for ``reason``: torque off first (``drives.fault`` for a
        fault, ``drives.disable`` for a stop signal or an internal error), then the log's event."""
        self.fault_reason, self.fault_cycle = reason, k
        self.fault_time = time.monotonic()  # on the clock of the host-pause probe (rt/core/hostprobe.py)
        if drive_fault:
            self.drives.fault(reason)
        else:
            self.drives.disable()
        if not self.drives.torque_on:
            self.torque_off_cycle = k
        if self.writer:
            self.writer.event(k, "fault", reason)

    # -- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Real-time settings, kernel warm-up, drives configured and enabled. On any failure
        (or a stop signal) the drives are disabled, the log closed with the reason, and the
        exception raised."""
        stop, drives, ref = self.stop_signals, self.drives, self.ref
        ref.start()  # the reference's first blocks; its producer thread (if any) before the real-time
        # settings, which move the threads running then off the loop's CPU and priority
        if not self.lockstep and self.realtime:  # before enabling: the full collection of gc_freeze holds
            r = self.config.realtime             # the GIL for tens of ms, which would starve the drives'
            self.rt_report = apply_realtime(r.priority, r.cpu, r.mlockall, r.gc_freeze)  # heartbeat thread
            self.rt_report.update(self.mem_report)
        stop.abort = True
        try:
            if stop.reason is not None:  # asked while the log opened
                raise Stopped(stop.reason)
            p0, v0, a0 = ref.pos[0].copy(), ref.vel[0].copy(), ref.acc[0].copy()
            # warm up the kernels (compile or load from cache) before the first deadline
            self.ctrl.update(p0, v0, p0, v0, a0)
            warm_up(self.ctrl, self.sup, p0, v0, a0)  # the cycle's parts' kernels
            if self.row is not None:  # the fused call's entry point for the loop's own arrays
                self.ctrl.bind(drives.feedback.position, drives.feedback.velocity, self.sup.limits, self.row,
                               (ref.pos, ref.vel, ref.acc), self.err)
            if self.block is not None:
                self.block.warm_up()
            self.sup.check(_Probe(p0, v0), p0)
            self.sup.stale = 0
            if self.rt_report.get("mlockall", "").startswith("applied"):  # warmed up: unlock what the loop does
                self.rt_report["unlocked"] = release_unused()  # not use (tens of ms: before the drives' watchdogs run)
            if self.memory["heap"].startswith("applied"):
                reserve_heap()  # the loop's temporaries find resident heap (keep_freed_heap)
            reserve_objects()  # and its Python objects touched pools (30-45 ms: before the drives' watchdogs run)
            drives.prepare(p0)
            drives.configure()
            drives.enable()
        except BaseException as exc:  # the drives never came up (or a stop signal): torque off, the log says why
            stop.abort = False
            drives.disable()
            ref.close()
            if self.rt_report:
                restore_realtime(self.rt_report)
            if self.writer:
                self.writer.event(0, "fault", f"drives not enabled: {exc}")
                self.writer.close({"fault": f"drives not enabled: {exc}", "cycles": 0})
            raise
        stop.abort = False  # torque may be on: from here a signal is seen by the loop (at cycle 0 at the latest)

    # -- cycle ----------------------------------------------------------------------------------
    def cycle(self, k: int) -> int | None:
        """Cycle k: wait for its deadline, read -> safety -> model -> law -> write ->
        bookkeeping -> staging, each part stamped (``CycleParts``), then the simulated plant
        stepped to the next read (``Drives.advance``: in the sleep, not in the compute);
        returns the next cycle (past a period skipped by an overrun), None when the run stops."""
        drives, ref, period, ts, clock = self.drives, self.ref, self.period, self.parts.ts, time.perf_counter_ns
        wake_s = self.clock.wait_until(k * period)
        if self.stop_signals.reason is not None:  # a stop signal: torque off before anything else
            self.fault(k, self.stop_signals.reason, drive_fault=False)
            return None
        ts[0] = t_start = clock()
        t = k * period
        if self.on_cycle is not None:
            self.on_cycle(k, t)
        refs = self.protect.reference(self, k)  # the run's, or a contact's reaction's
        if refs is None:  # the reference's producer fell behind: never wait for it in the loop
            self.fault(k, ref.behind_reason(k))
            return None
        ref_pos, ref_vel, ref_acc = refs
        j = k % self.window
        err = self.err[j]
        reason, flags, staged = timed_step(drives, self.sup, self.ctrl, t, ref_pos, ref_vel, ref_acc, ts,
                                           not self.old_cycle, self.row, err, k,
                                           self.protect.hook_of(k, refs))
        fb = self.fb = drives.feedback
        reason = self.protect.cycle_end(self, k, reason)  # the truth channels; a reaction's end
        if reason is not None:
            self.fault(k, reason)
        self.saturated += flags & 1
        self.wake[j] = wake_s
        self.ran[j] = True
        self.last_k = k
        self.wake_max = max(self.wake_max, wake_s)
        self.cycles += 1
        nxt, lateness = next_cycle(self.clock, k, period, self.pacing)
        late = lateness > 0.0
        if late:
            self.overruns += 1
            flags |= FLAG_OVERRUN
            self.delays.add(k, lateness, time.monotonic())
            if self.pacing == "delay":  # a delay of a plant that waits: not a missed cycle (no watchdog)
                late = False
        wd = self.sup.overrun(late) if reason is None else None
        ts[6] = clock()
        comp = self.comp[j] = (ts[6] - t_start) * 1e-9
        self.comp_max = max(self.comp_max, comp)
        if self.old_cycle:
            np.subtract(ref_pos, fb.position, out=err)
            if self.views is not None:
                runrecord.stage_views(self, k, t, fb, wake_s, flags, refs, comp)
        else:
            row = self.row
            if staged:  # the vectors are in (checked_control): the scalars, and tau 0 with the torque off
                c = self.wake_col
                row[0], row[c], row[c + 1], row[c + 2] = t, wake_s * 1e6, comp * 1e6, flags
                if not drives.torque_on:
                    row[self.tau_cols] = 0.0
            else:
                stage_row(row, t, ref_pos, ref_vel, ref_acc, fb.position, fb.velocity, self.ctrl.tau,
                          drives.torque_on, self.ctrl.tau_model, wake_s * 1e6, comp * 1e6, flags, err)
            if self.writer:
                self.writer.commit()
            if self.telemetry is not None:
                self.telemetry.maybe_send(k, t, self.row, self.slices)
        self.errs.add(err)  # tracking error over the whole run
        ts[7] = clock()
        if reason is None and wd is None and self.going(nxt) and not self.old_cycle:
            drives.advance(nxt * period)
            ts[8] = clock()
        self.parts.commit()
        if reason is not None:
            return None
        if wd is not None:
            self.fault(k, wd)
            return None
        return nxt

    def _reference(self, k: int) -> tuple | None:
        """Cycle k's reference (pos, vel, acc): its ring row, None when not computed in time."""
        i = self.ref.slot(k)
        return None if i < 0 else (self.ref.pos[i], self.ref.vel[i], self.ref.acc[i])

    def going(self, k: int) -> bool:
        """Cycle k is to run: within the reference, or a contact's reaction runs past its end."""
        return k < self.ref.n or self.protect.reacting

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> dict:
        """start, cycles until the end of the reference or a fault, stop, summary."""
        self.start()
        stop = self.stop_signals
        self.memory["at_start"] = status()  # before the loop's time starts (reading /proc takes ms)
        k, wall0 = 0, time.perf_counter()
        try:
            stop.in_loop = True
            moves0, faults0 = kernel_moves(), thread_faults()
            wall0 = time.perf_counter()
            self.cpu0 = time.thread_time()
            if not self.lockstep:
                self.clock.t0 = time.monotonic() + 2 * self.period  # start on a clean boundary
            while k is not None and self.going(k):
                if self.next_event < len(self.events):
                    self._events(k)
                if self.block is not None:  # what it can (up to the next event), then the cycle it leaves in Python
                    k = self.block.run(k, self.events[self.next_event]["sample"] if self.next_event < len(self.events)
                                       else None)
                    if k >= self.ref.n:
                        break
                    if self.next_event < len(self.events):
                        self._events(k)
                k = self.cycle(k)
            self.loop_end = time.perf_counter()
            faults1, moves1 = thread_faults(), kernel_moves()  # the loop thread's page faults over all its cycles
            self.memory.update(at_end=status(), loop_minor_faults=faults1[0] - faults0[0],
                               loop_major_faults=faults1[1] - faults0[1],
                               kernel_moves={n: moves1[n] - moves0[n] for n in moves0 if moves1[n] != moves0[n]})
        except KeyboardInterrupt:  # a second stop signal while stuck in a driver call
            self.fault(k, stop.reason or "interrupted by the user", drive_fault=False)
        except BaseException as exc:  # anything unexpected: the drives are off, the log is kept
            self.fault(k, f"internal error: {type(exc).__name__}: {exc}", drive_fault=False)
            if self.writer:
                self.writer.close({"fault": f"internal error: {exc}", "cycles": self.cycles})
            raise
        finally:
            self.stop(wall0)
        return runrecord.summary(self)

    def _events(self, k: int) -> None:
        """The program's events due at cycle k: the drives' outputs set, each logged."""
        j = due(self.events, self.next_event, k)
        for ev in self.events[self.next_event:j]:
            self.drives.set_outputs(self.outputs.apply(ev), k * self.period)
            if self.writer:
                self.writer.event(k, ev["kind"], ev["text"] + (" (pkrt run does not hold)" if ev.get("hold") else ""))
        self.next_event = j

    def stop(self, wall0: float) -> None:
        """Torque off (idempotent), loop time measured, real-time settings restored."""
        self.stop_signals.in_loop = False
        self.drives.disable()
        self.wall = (self.loop_end or time.perf_counter()) - wall0
        self.cpu = time.thread_time() - self.cpu0
        self.ref.close()
        if self.rt_report:
            restore_realtime(self.rt_report)

WINDOW = 1 << 16  # cycles whose timings the summary's percentiles cover (65.5 s at 1 kHz)


class _Probe:
    """Feedback-shaped object for warming up the safety kernel."""

    def __init__(self, pos, vel):
        self.position, self.velocity, self.fresh = pos, vel, True


