"""Lockstep cycles on the simulated plant in one compiled loop.

A lockstep run (virtual clock) of the tree controller on the noiseless simulated plant does, per
cycle, what ``Session.cycle`` does -- the feedback read from the plant stepped ahead, the fused
safety, tree, law and staging call (``checked_control``), the command written, the cycle's
records, the log row, the tracking error, the plant stepped to the next read, the parts'
histograms -- with the same kernels, called from one numba loop instead of Python: from
Python the cycle took ~30 us (the plant 5.7 us, the controller ~1.5 us, the rest the
interpreter between the calls).

The loop covers only the nominal case and hands everything else back to the Python cycle:
``LockstepBlock.run`` runs cycles while the run is plain (no fault injection, sensor noise,
transport delay, exact model, telemetry or per-cycle hook), up to the log writer's current
buffer, the reference rows computed and the end, and stops *before* a cycle whose safety check,
tree status or torque would end the run (``Session.cycle`` then does that cycle again from the
same state and ends the run with its reason) and after a plant step that left the plant's model
(the next read reports it). The results are those of the Python cycle to the bit (tests);
only the timing columns differ. Times: s, ns in the parts' stamps (the time-stamp counter,
``pkrt.rt.core.cycleclock``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pkrt.drivers.base import Drives
from pkrt.drivers.sim import SimDrives, plant_step
from pkrt.rt.core.cycleclock import ns_per_tick, rdtsc
from pkrt.rt.core.tree import OUT_OF_DOMAIN
from pkrt.rt.runtime.cycle.controller import FLAG_NONFINITE, checked_control, workspace_views
from pkrt.rt.runtime.cycle.cycleparts import MEMBERS, record
from pkrt.rt.runtime.cycle.errorstats import accumulate_error
from pkrt.rt.runtime.cycle.safety import OK

FREE_ROWS = 256  # cycles per call without a log (a stop signal is seen between calls)


@njit(cache=True, nogil=True)
def lockstep_cycles(k0, k1, n, period, ctl, fb_pos, fb_vel, refs, rec, plant, parts):
    """Cycles k0 .. k1 - 1 (of a reference of ``n`` rows, ``period`` s) as ``Session.cycle``
    runs them in lockstep on a plant stepped ahead to ``k0 * period``.

    ``ctl``: (tree arrays, kind, gains, limits, workspace, observer state, ns per tick) of
    ``checked_control``;
    ``refs``: the reference rings (pos, vel, acc), row k at k % len; ``rec``: (log row, error
    ring, wake ring, ran ring, compute ring, error sums of squares, error maxima, the log
    writer's free rows, whether to fill them, wake column); ``plant``: (tree arrays, state x,
    held command, substeps, parameters, workspace, state before the last step); ``parts``:
    ``CycleParts``' (stamps, members, histograms, sums, maxima).

    Returns (the next cycle, cycles done, finite error samples, saturated cycles, longest
    compute in s, the last plant step's status, whether the next cycle was not run because its
    check, tree status or torque ends the run or its observer detected a contact); it stops at
    k1, before such a cycle, or after a plant step of nonzero status."""
    T, kind, gains, limits, ws, obs, npt = ctl
    rp, rv, ra = refs
    row, err, wake, ran, comp, sq, big, log_rows, logging, c = rec
    PT, x, tau_cmd, n_sub, params, pws, x_before = plant
    ts, members, hist, sums, maxes = parts
    s = fb_pos.shape[0]
    tau = workspace_views(ws, s)[6]  # Controller.tau
    cap, window = rp.shape[0], err.shape[0]
    done = finite = saturated = 0
    comp_max = 0.0
    st = 0
    ends = False
    k = k0
    while k < k1:
        t = k * period
        t0 = rdtsc()
        for a in range(s):  # read: the plant was stepped ahead to this read
            fb_pos[a] = x[a]
            fb_vel[a] = x[s + a]
        t1 = rdtsc()
        i, j = k % cap, k % window
        code, axis, f, status, tree_ns, law_ns, stage_ns = checked_control(
            T, kind, fb_pos, fb_vel, rp[i], rv[i], ra[i], gains, limits, ws, obs, k, npt, row, err[j])
        if code != OK or status == OUT_OF_DOMAIN or (f & FLAG_NONFINITE) != 0 or axis >= 0:
            ends = True  # this cycle ends the run or detects a contact: the Python cycle does it again
            break        # from the same state (the observer's call for cycle k repeats) and says why
        t4 = rdtsc()
        tau_cmd[:] = tau  # write
        t5 = rdtsc()
        saturated += f & 1
        wake[j] = 0.0
        ran[j] = True
        t6 = rdtsc()
        ts[0], ts[1], ts[4], ts[5], ts[6] = int(t0 * npt), int(t1 * npt), int(t4 * npt), int(t5 * npt), int(t6 * npt)
        ts[3] = ts[4] - law_ns
        ts[2] = max(ts[3] - tree_ns, ts[1])
        ts[9] = stage_ns
        cs = (ts[6] - ts[0]) * 1e-9
        comp[j] = cs
        comp_max = max(comp_max, cs)
        row[0], row[c], row[c + 1], row[c + 2] = t, 0.0, cs * 1e6, f
        if logging:
            log_rows[done, :] = row
        if accumulate_error(err[j], sq, big):
            finite += 1
        ts[7] = int(rdtsc() * npt)
        done += 1
        k += 1
        if k < n:  # the plant stepped to the next read, the command held (SimDrives.advance)
            x_before[:] = x
            st = max(0, plant_step(PT, x, tau_cmd, k * period - t, n_sub, params, pws))
            ts[8] = int(rdtsc() * npt)
        record(ts, members, hist, sums, maxes)
        if st != 0:
            break
    return k, done, finite, saturated, comp_max, st, ends


def plain_sim(drives: Drives) -> bool:
    """Whether these drives are the simulated plant as ``lockstep_cycles`` steps it
    (``SimDrives.plain``)."""
    return isinstance(drives, SimDrives) and drives.plain


class LockstepBlock:
    """The compiled lockstep path of one ``Session`` (``of``: only when its run qualifies);
    ``warm_up`` before the loop, then ``run(k)`` runs what it can from cycle k."""

    def __init__(self, session):
        self.session = session
        sn, ctrl = session, session.ctrl
        self.ctl = (ctrl.arrays, ctrl.kind, ctrl.gains, sn.sup.limits, ctrl.ws, ctrl.obs, ns_per_tick())
        self.refs = (sn.ref.pos, sn.ref.vel, sn.ref.acc)
        self.plant = session.drives.step_arrays()
        pt = sn.parts
        self.parts = (pt.ts, MEMBERS, pt.hist, pt.sums, pt.maxes)
        self.spare = np.zeros((FREE_ROWS, sn.row.shape[0]))  # the rows' target without a log
        self.cycles = 0  # cycles run compiled

    @classmethod
    def of(cls, session) -> "LockstepBlock | None":
        """The compiled path of a session that can have one: lockstep on the plain simulated plant
        (``plain_sim``) with the tree controller, no telemetry, no per-cycle hook, the cycle as it
        is (not ``old_cycle``), supervisor counters that a plain cycle cannot trip; else None."""
        sn = session
        if (sn.lockstep and not sn.old_cycle and sn.ctrl.model is None and sn.telemetry is None
                and sn.on_cycle is None and plain_sim(sn.drives) and sn.sup.stale_max > 0
                and sn.sup.watchdog_max > 0):
            return cls(session)
        return None

    def warm_up(self) -> None:
        """Compile (or load) the loop's kernel for these arrays before the loop: a call of no
        cycle (loading it in the loop took ~950 page faults)."""
        self._call(0, 0)

    def _call(self, k: int, k1: int) -> tuple:
        sn, d = self.session, self.session.drives
        rows, logging = (sn.writer.free_rows(), True) if sn.writer else (self.spare, False)
        rec = (sn.row, sn.err, sn.wake, sn.ran, sn.comp, sn.errs.sq, sn.errs.big, rows, logging, sn.wake_col)
        return lockstep_cycles(k, min(k1, k + rows.shape[0]), sn.ref.n, sn.period, self.ctl, d.feedback.position,
                               d.feedback.velocity, self.refs, rec, self.plant, self.parts)

    def ready(self, k: int) -> bool:
        """Cycle k can run compiled: the drives are enabled, still plain and stepped ahead to its
        read, no stop signal is pending, no contact's reaction runs."""
        sn, d = self.session, self.session.drives
        return (sn.stop_signals.reason is None and d.torque_on and d.ahead_to(k * sn.period) and d.plain
                and not sn.protect.reacting)

    def run(self, k: int, until: int | None = None) -> int:
        """Cycles from k in compiled calls while ``ready`` (and before cycle ``until``: a
        program's event there); returns the first cycle left to ``Session.cycle`` (k itself
        when none ran), or the reference's end."""
        sn = self.session
        ref, n = sn.ref, sn.ref.n
        end = n if until is None else min(n, until)
        while k < end and self.ready(k):
            ref.slot(k)  # computes the reference's rows up to k (lockstep) and marks the ring's reader
            k1 = min(end, ref.ready)
            k_next, done, finite, saturated, comp_max, st, ends = self._call(k, k1)
            if done:
                self._account(k_next - 1, done, finite, saturated, comp_max, st)
            if sn.writer and done:
                sn.writer.committed(done)
            if ends or st != 0 or done == 0:
                return k_next
            k = k_next
        return k

    def _account(self, k_last: int, done: int, finite: int, saturated: int, comp_max: float, st: int) -> None:
        """The Python state after compiled cycles up to ``k_last``: the session's counters, the
        supervisor's, the drives' read and step ahead (``SimDrives.read`` / ``advance``)."""
        sn, d = self.session, self.session.drives
        sn.cycles += done
        self.cycles += done
        sn.saturated += saturated
        sn.errs.n += finite
        sn.parts.count += done
        sn.last_k = k_last
        sn.comp_max = max(sn.comp_max, comp_max)
        sn.sup.stale = sn.sup.late = 0
        t_next = (k_last + 1) * sn.period if k_last + 1 < sn.ref.n else None  # no step after the last cycle
        d.stepped(k_last * sn.period, t_next, st)


__all__ = ["LockstepBlock", "lockstep_cycles", "plain_sim"]
