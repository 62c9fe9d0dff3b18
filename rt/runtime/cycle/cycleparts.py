"""The cycle's work measured per part, in memory independent of the run's length.

Each cycle stamps ``time.perf_counter_ns()`` at the start of its work and after each part into
one preallocated row (``CycleParts.ts``; its last entry: time spent on the stage part inside
the one kernel call of safety, tree and law, ``timed_step``); ``record`` (one numba call) bins the parts' durations
into fixed histograms (``FINE_NS`` wide up to ``FINE_SPAN_NS``, then ``COARSE_NS`` wide up to
``SPAN_NS``; longer ones in the last bin, the exact maximum kept aside) and adds them to per-part
sums. The parts are consecutive, so they add up
to the cycle exactly (the sums are in integer ns).

Parts, in cycle order: ``read`` (the drives' feedback), ``safety`` (the supervisor's checks),
``tree`` (the model at the feedback: the tree or the exact model), ``law`` (the control law),
``write`` (the drives' command), ``bookkeeping`` (fault handling, counters, the next deadline,
the watchdog), ``stage`` (the error record, the log row and telemetry sample) -- together the
controller's compute -- and then ``plant``: a simulated plant integrating the cycle's
command towards the next read (``Drives.advance``), outside the compute (it runs in the loop's
sleep budget). Times in ns in the arrays, us in the summaries.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from pkrt.drivers.base import DriveError, Drives
from pkrt.rt.core.tree import OUT_OF_DOMAIN
from pkrt.rt.core.cycleclock import ns_per_tick
from pkrt.rt.runtime.cycle.controller import FLAG_NONFINITE, FLAG_STALE, Controller, checked_control
from pkrt.rt.runtime.cycle.observer import observe_staged
from pkrt.rt.runtime.cycle.safety import OK, Supervisor
from pkrt.rt.runtime.cycle.staging import stage_row

PARTS = ("read", "safety", "tree", "law", "write", "bookkeeping", "stage", "plant")
# derived groups, each a set of parts: the compute (all but the plant) and the older summary's split
# (``drive_us``: in the drivers, the simulated plant's integration included, as before)
GROUPS = {"compute": PARTS[:7], "drives": ("read", "write", "plant"), "controller": ("tree", "law"),
          "overhead": ("safety", "bookkeeping", "stage"),
          "without_drives": ("safety", "tree", "law", "bookkeeping", "stage")}
ROWS = PARTS + tuple(GROUPS)
FINE_NS, FINE_SPAN_NS = 50, 100_000  # 50 ns bins up to 100 us
COARSE_NS, SPAN_NS = 2_000, 20_000_000  # then 2 us bins up to 20 ms; a longer part: the last bin
NFINE = FINE_SPAN_NS // FINE_NS
NBINS = NFINE + (SPAN_NS - FINE_SPAN_NS) // COARSE_NS + 1
# each bin's centre (ns); the last bin's is its lower edge (its parts' max is kept exactly)
CENTRES_NS = np.concatenate([(np.arange(NFINE) + 0.5) * FINE_NS,
                             FINE_SPAN_NS + (np.arange(NBINS - NFINE - 1) + 0.5) * COARSE_NS, [SPAN_NS]])
# which parts each row sums: (rows, parts) 0/1
MEMBERS = np.array([[1 if p in (GROUPS.get(r) or (r,)) else 0 for p in PARTS] for r in ROWS], dtype=np.int64)


@njit(cache=True)
def record_fill(ts):
    """A stamp not taken (0: its part did not run) takes the one before it: that part is 0 ns."""
    for i in range(1, ts.shape[0]):
        if ts[i] == 0:
            ts[i] = ts[i - 1]


@njit(cache=True)
def record(ts, members, hist, sums, maxes):
    """Bin one cycle's parts (consecutive differences of the stamps ``ts[:9]``, ns) and the
    groups (``members`` rows of 0/1 over the parts) into ``hist`` (rows, bins); add them to
    ``sums``, keep ``maxes``; clear ``ts``. A stamp not taken counts as in ``record_fill``;
    ``ts[9]`` ns done inside the kernel call that ends at ``ts[4]`` belong to the stage part:
    the stamps from ``ts[2]`` to ``ts[6]`` move that much earlier (no earlier than ``ts[1]``)."""
    n = members.shape[1] + 1
    record_fill(ts[:n])
    moved = ts[n]
    if moved > 0:
        for i in range(2, 7):
            ts[i] = max(ts[i] - moved, ts[1])
    nb = hist.shape[1]
    for r in range(members.shape[0]):
        d = 0
        for i in range(members.shape[1]):
            if members[r, i]:
                d += ts[i + 1] - ts[i]
        d = max(d, 0)
        b = d // FINE_NS if d < FINE_SPAN_NS else NFINE + (d - FINE_SPAN_NS) // COARSE_NS
        hist[r, b if b < nb else nb - 1] += 1
        sums[r] += d
        if d > maxes[r]:
            maxes[r] = d
    ts[:] = 0  # cleared for the next cycle


class CycleParts:
    """Per-part histograms of a run's cycles. ``ts`` is the cycle's stamp row (ns): ``ts[0]``
    at the start of the work, ``ts[i + 1]`` after part i; ``commit`` records it and clears it."""

    def __init__(self):
        self.ts = np.zeros(len(PARTS) + 2, dtype=np.int64)  # the stamps, then ns moved to stage
        self.hist = np.zeros((len(ROWS), NBINS), dtype=np.int64)
        self.sums = np.zeros(len(ROWS), dtype=np.int64)
        self.maxes = np.zeros(len(ROWS), dtype=np.int64)
        self.count = 0
        record(self.ts, MEMBERS, np.zeros_like(self.hist), np.zeros_like(self.sums),
               np.zeros_like(self.maxes))  # compile (or load) before the loop

    def commit(self) -> None:
        """Record the stamped cycle; the stamp row is cleared for the next one."""
        record(self.ts, MEMBERS, self.hist, self.sums, self.maxes)
        self.count += 1

    def percentiles_us(self, row: str) -> dict:
        """p50, p99, p99.9 (bin centres: 50 ns resolution up to 100 us, then 2 us) and the exact max of a part or group
        (``ROWS``), in us; ``None`` values before any cycle."""
        if self.count == 0:
            return {"p50": None, "p99": None, "p99.9": None, "max": None}
        r = ROWS.index(row)
        c = np.cumsum(self.hist[r])
        out = {}
        for name, q in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)):
            b = int(np.searchsorted(c, q * self.count))  # first bin holding the q-th cycle
            out[name] = min(float(CENTRES_NS[b]), float(self.maxes[r])) * 1e-3
        out["max"] = float(self.maxes[r]) * 1e-3
        return out

    def mean_us(self, row: str) -> float | None:
        return float(self.sums[ROWS.index(row)]) / self.count * 1e-3 if self.count else None

    def summary(self) -> dict:
        """Compact: each part's and group's [p50, p99, max] in us (rounded to 0.01 us), the mean
        of each, and the number of cycles."""
        out = {}
        for r in ROWS:
            p = self.percentiles_us(r)
            out[r] = [None if p[x] is None else round(p[x], 2) for x in ("p50", "p99", "max")]
        return {"cycles": self.count, "p50_p99_max_us": out,
                "mean_us": {r: None if self.count == 0 else round(self.mean_us(r), 3) for r in ROWS}}


def timed_step(drives: Drives, sup: Supervisor, ctrl: Controller, t: float, ref_pos: np.ndarray,
               ref_vel: np.ndarray, ref_acc: np.ndarray, ts: np.ndarray, split: bool = True,
               row: np.ndarray | None = None, err: np.ndarray | None = None, k: int = 0,
               on_contact=None) -> tuple[str | None, int, bool]:
    """One read -> safety -> model -> control law -> write at loop time t (s) towards the
    reference (actuator units), stamping ``ts[1..5]`` (ns) after each part (a part not reached
    keeps 0). Returns (fault reason or None, controller flags, whether ``row`` and ``err`` were
    staged); the feedback is ``drives.feedback``.

    With the tree in the loop and a ``row`` (1 + 7 s + 3, ``pkrt.rt.runtime.cycle.staging``) safety,
    tree, law and the staging of ``row`` and ``err`` (ref - pos) are one kernel call
    (``Controller.checked``: ``checked_control``) split by the time-stamp counter: safety also holds the call's entry
    and exit, and the staging's time is moved to the stage part (``ts[9]``). ``split=False``:
    the path before the per-part budget (``Supervisor.check``, then ``Controller.update``,
    model and law counted together as ``tree``); the exact model: three calls.

    ``k``: the cycle's number (the contact observer's, ``Controller.protect``). A contact it
    detects calls ``on_contact(axis)`` (``pkrt.rt.runtime.machine.protect``) before the write: a reason
    returned (a torque-off reaction) ends the cycle as a fault, without writing the command."""
    clock = time.perf_counter_ns
    flags = 0
    staged = False
    try:
        fb = drives.read(t)
        ts[1] = t1 = clock()
        if split and ctrl.model is None and row is not None:
            code, axis, f, status, tree_ns, law_ns, stage_ns = ctrl.checked(
                fb.position, fb.velocity, ref_pos, ref_vel, ref_acc, sup.limits, ns_per_tick(), row, err, k)
            contact = axis if code == OK else -1
            staged = True
            reason = sup.verdict(code, axis, fb, ref_pos)
            ts[4] = t4 = clock()
            ts[3] = t4 - law_ns
            ts[2] = max(t4 - law_ns - tree_ns, t1)
            ts[9] = stage_ns
        else:
            reason, f, status, contact = _step_unfused(sup, ctrl, fb, ref_pos, ref_vel, ref_acc, ts, split, k, row)
        if not fb.fresh:
            flags |= FLAG_STALE
        if reason is None:
            flags |= f
            if status == OUT_OF_DOMAIN:
                reason = (f"model domain: position {np.round(fb.position, 6).tolist()} is in a "
                          f"tree box marked out of domain")
            elif f & FLAG_NONFINITE:
                reason = "controller produced a non-finite torque"
        if reason is None and contact >= 0 and on_contact is not None:
            reason = on_contact(contact)
        if reason is None:
            drives.write(ctrl.tau)
            ts[5] = clock()
    except DriveError as e:
        reason = f"drive: {e}"
    return reason, flags, staged


def warm_up(ctrl: Controller, sup: Supervisor, pos: np.ndarray, vel: np.ndarray, acc: np.ndarray) -> None:
    """Before the first deadline: the counter's period measured (20 ms) and the kernels of
    ``timed_step`` and the staging compiled or loaded from the cache (a first call in the loop
    cost 0.1 s: a run with ``skip`` pacing then skipped as many periods)."""
    s = pos.shape[0]
    row, err = np.zeros(4 + 7 * s), np.zeros(s)
    if ctrl.model is None:
        obs = ctrl.obs.copy()  # the observer's kernel compiled, its state untouched
        checked_control(ctrl.arrays, ctrl.kind, pos, vel, pos, vel, acc, ctrl.gains, sup.limits, ctrl.ws, obs, 0,
                        ns_per_tick(), row, err)
    if ctrl.protected:  # the unfused path's observer call (the exact model, the served machine)
        observe_staged(ctrl.obs.copy(), 0, vel, ctrl.H, ctrl.D, ctrl.p, ctrl.w, ctrl.gains, ctrl.tau, row, -1)
    stage_row(row, 0.0, pos, vel, acc, pos, vel, ctrl.tau, True, ctrl.tau_model, 0.0, 0.0, 0, err)
    parts = CycleParts()
    parts.ts[0] = time.perf_counter_ns()
    parts.commit()


def _step_unfused(sup: Supervisor, ctrl: Controller, fb, ref_pos, ref_vel, ref_acc, ts: np.ndarray,
                  split: bool, k: int = 0, row=None) -> tuple[str | None, int, int, int]:
    """Safety, then the model and the law in one (``split=False``) or two calls, then the
    contact observer (counted in the law, or with ``split=False`` in the tree); (reason, flags,
    status, the axis of a detected contact or -1). The residual is staged into ``row`` after
    its 4 + 7 s values when the row has room."""
    clock = time.perf_counter_ns
    reason = sup.check(fb, ref_pos)
    ts[2] = clock()
    f = status = 0
    contact = -1
    if reason is None:
        if split:
            status = ctrl.evaluate(fb.position)
            ts[3] = clock()
            f = ctrl.law(status, fb.position, fb.velocity, ref_pos, ref_vel, ref_acc)
        else:
            f, status = ctrl.update(fb.position, fb.velocity, ref_pos, ref_vel, ref_acc)
        if ctrl.protected and status != OUT_OF_DOMAIN:
            s = fb.position.shape[0]
            roomy = row is not None and row.shape[0] >= 4 + 8 * s
            contact = ctrl.observe(k, fb.velocity, row if roomy else None, 4 + 7 * s)
        if not split:
            ts[3] = clock()
        ts[4] = clock()
    return reason, f, status, contact


__all__ = ["CycleParts", "PARTS", "GROUPS", "ROWS", "record", "record_fill", "timed_step", "warm_up"]


def control_step(drives: Drives, sup: Supervisor, ctrl: Controller, t: float, ref_pos: np.ndarray,
                 ref_vel: np.ndarray, ref_acc: np.ndarray, ts: np.ndarray | None = None, k: int = 0,
                 on_contact=None) -> tuple[str | None, int, float, float, float]:
    """One read -> safety -> controller -> write at loop time t (s) towards the reference
    (actuator units). Returns (fault reason or None, controller flags, seconds in the drive
    read, in the controller, in the drive write); the feedback is ``drives.feedback``. Used by
    a served machine (``pkrt.rt.runtime.machine.served``); a run stamps each part (``timed_step``).
    ``ts``: the caller's preallocated stamps (``len(PARTS) + 2`` int64), so the cycle allocates none.
    ``k``, ``on_contact``: the cycle's number and the contact hook (``timed_step``)."""
    if ts is None:
        ts = np.zeros(len(PARTS) + 2, dtype=np.int64)
    ts[:] = 0
    ts[0] = time.perf_counter_ns()
    reason, flags, _ = timed_step(drives, sup, ctrl, t, ref_pos, ref_vel, ref_acc, ts, split=False, k=k,
                                  on_contact=on_contact)
    record_fill(ts)
    return reason, flags, (ts[1] - ts[0]) * 1e-9, (ts[4] - ts[2]) * 1e-9, (ts[5] - ts[4]) * 1e-9
