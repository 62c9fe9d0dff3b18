"""The run's reference streamed to the loop: samples at the loop rate computed in blocks ahead of
it into a fixed ring, so that a run's memory does not grow with the trajectory's duration.

A *source* computes rows ``k0 .. k0 + m - 1`` (t = k / rate_hz) of positions, velocities and
accelerations (actuator units) on demand: ``PlannedSource`` copies them from a ``Planned`` held
whole (the demo, a task-space path, a G-code program, a bag), ``SplineSource`` evaluates the
clamped cubic spline of an actuator CSV (the same spline ``pkrt.rt.core.plan.resample`` samples),
``HermiteSource`` the quintic Hermite pieces of one that has velocities and accelerations,
all holding the last position at rest past their end (``--duration``).

``RefStream`` holds ``blocks`` blocks of ``block`` rows. In lockstep the loop fills the next
block itself when it needs it; in real time a producer thread fills blocks ahead and the loop
only reads: ``slot(k)`` never blocks and never allocates, and returns -1 when row k is not
there yet (the producer fell behind: the run stops safely with ``behind_reason``).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import MAX_SAMPLES, Planned, hermite_at, read_csv_table, sample_count
from pkrt.rt.runtime.cycle.memory import prefault

BLOCK = 512  # rows a block (0.5 s at 1 kHz)
BLOCKS = 8   # blocks in the ring: the producer runs up to 4 s ahead at 1 kHz


class PlannedSource:
    """Rows of a ``Planned`` held whole; past its end the last position at rest."""

    def __init__(self, plan: Planned, n: int | None = None):
        self.plan, self.rate_hz, self.description = plan, plan.rate_hz, plan.description
        self.n = plan.n if n is None else n
        self.s = plan.pos.shape[1]

    def fill(self, k0: int, pos: np.ndarray, vel: np.ndarray, acc: np.ndarray) -> None:
        p, m = self.plan, len(pos)
        j = max(0, min(p.n - k0, m))  # rows from the plan
        pos[:j], vel[:j], acc[:j] = p.pos[k0:k0 + j], p.vel[k0:k0 + j], p.acc[k0:k0 + j]
        pos[j:], vel[j:], acc[j:] = p.pos[-1], 0.0, 0.0


class SplineSource:
    """An actuator CSV's samples joined by a clamped cubic spline (zero end velocities),
    evaluated per block; memory: the CSV's rows, not the loop's samples."""

    def __init__(self, t: np.ndarray, values: np.ndarray, rate_hz: float, description: dict, what: str):
        from scipy.interpolate import CubicSpline

        self.spline = CubicSpline(t - t[0], values, bc_type="clamped")
        self.span = float(t[-1] - t[0])
        self.rate_hz, self.description, self.s = rate_hz, description, values.shape[1]
        self.n = self.n_spline = sample_count(self.span, rate_hz, what)  # as resample() samples it

    def fill(self, k0: int, pos: np.ndarray, vel: np.ndarray, acc: np.ndarray) -> None:
        k = np.arange(k0, k0 + len(pos))
        tt = np.minimum(k / self.rate_hz, self.span)
        pos[...] = self.spline(tt)
        vel[...] = self.spline(tt, 1)
        acc[...] = self.spline(tt, 2)
        past = k >= self.n_spline  # held at rest past the end (a clamped spline ends at rest)
        vel[past], acc[past] = 0.0, 0.0


class HermiteSource:
    """An actuator CSV with velocities and accelerations (``state_columns``) joined by quintic
    Hermite pieces (``pkrt.rt.core.plan.hermite_at``), evaluated per block; past its end the
    last position at rest. A reference written at the loop rate reads back exactly."""

    def __init__(self, t: np.ndarray, pos: np.ndarray, vel: np.ndarray, acc: np.ndarray, rate_hz: float,
                 description: dict, what: str):
        self.t, self.p, self.v, self.a = t - t[0], pos, vel, acc
        self.span = float(self.t[-1])
        self.rate_hz, self.description, self.s = rate_hz, description, pos.shape[1]
        self.n = self.n_data = sample_count(self.span, rate_hz, what)  # as resample_hermite samples it

    def fill(self, k0: int, pos: np.ndarray, vel: np.ndarray, acc: np.ndarray) -> None:
        k = np.arange(k0, k0 + len(pos))
        pos[...], vel[...], acc[...] = hermite_at(self.t, self.p, self.v, self.a,
                                                  np.minimum(k / self.rate_hz, self.span))
        past = k >= self.n_data
        pos[past], vel[past], acc[past] = self.p[-1], 0.0, 0.0


def csv_source(path: str, rate_hz: float, axes: list[str]) -> SplineSource | HermiteSource:
    """An actuator CSV (``t`` then one column per actuator, optionally followed by their
    velocities and accelerations: ``state_columns``) as a streamed source."""
    head, t, vals = read_csv_table(path, [list(axes)])
    s = len(axes)
    if len(head) == 1 + 3 * s:
        return HermiteSource(t, vals[:, :s], vals[:, s:2 * s], vals[:, 2 * s:], rate_hz,
                             {"kind": "csv", "path": str(path), "columns": head[:1 + s]}, str(path))
    return SplineSource(t, vals, rate_hz, {"kind": "csv", "path": str(path), "columns": head}, str(path))


def with_duration(src, duration: float):
    """``src`` cut to ``duration`` s, or held at its last position up to it (refused when the
    reference ends moving)."""
    if duration <= 0:
        raise UserError("--duration must be positive")
    n = int(round(duration * src.rate_hz)) + 1
    if n > MAX_SAMPLES:
        raise UserError(f"--duration: {duration:.6g} s at {src.rate_hz:g} Hz is {n} samples, more than the "
                        f"{MAX_SAMPLES} a run plans (are the times in seconds?)")
    if n > src.n:
        last = [np.zeros((1, src.s)) for _ in range(3)]
        src.fill(src.n - 1, *last)
        if np.any(np.abs(last[1]) > 1e-9):
            raise UserError(f"cannot extend the trajectory to {duration} s: it ends moving")
    src.n = n
    return src


def blocks_of(src, rows: int = 65536):
    """(k0, pos, vel, acc) of the whole source in chunks of ``rows`` (checks before a run)."""
    buf = [np.empty((min(rows, src.n), src.s)) for _ in range(3)]
    for k0 in range(0, src.n, rows):
        m = min(rows, src.n - k0)
        view = [b[:m] for b in buf]
        src.fill(k0, *view)
        yield (k0, *view)


class RefStream:
    """The reference ring the loop reads (``pos``, ``vel``, ``acc``: (block * blocks, s)
    arrays, row k at ``slot(k)``). ``threaded``: a producer thread fills ahead (real time);
    otherwise the loop fills on demand (lockstep). ``start`` fills what fits before the loop."""

    def __init__(self, src, *, threaded: bool, block: int = BLOCK, blocks: int = BLOCKS):
        self.src, self.n, self.rate_hz, self.description = src, src.n, src.rate_hz, src.description
        self.block, self.cap = block, block * blocks
        self.pos, self.vel, self.acc = (np.zeros((self.cap, src.s)) for _ in range(3))
        prefault(self.pos, self.vel, self.acc)  # the loop takes no page fault on the ring
        self.ready = 0   # rows [0, ready) are in the ring
        self.k = 0       # the loop's current row: rows below it may be overwritten
        self.threaded = threaded and self.n > self.cap
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fill_s = 0.0  # longest block fill (s)

    def _fill_next(self) -> None:
        i = self.ready % self.cap
        t0 = time.perf_counter()
        self.src.fill(self.ready, self.pos[i:i + self.block], self.vel[i:i + self.block], self.acc[i:i + self.block])
        self.fill_s = max(self.fill_s, time.perf_counter() - t0)
        self.ready += self.block

    def _room(self) -> bool:
        return self.ready < self.n and self.ready + self.block <= self.k + self.cap

    def start(self) -> None:
        """Fill the ring (rows 0 onwards); start the producer when the reference is longer."""
        while self._room():
            self._fill_next()
        if self.threaded:
            self._thread = threading.Thread(target=self._produce, name="pkrt-reference", daemon=True)
            self._thread.start()

    def _produce(self) -> None:
        nap = self.block / self.rate_hz / 4  # wakes four times a block
        try:
            while not self._stop.is_set() and self.ready < self.n:
                while self._room() and not self._stop.is_set():
                    self._fill_next()
                self._stop.wait(nap)
        except Exception as e:  # reported by the loop's safe stop
            self.error = f"{type(e).__name__}: {e}"

    def slot(self, k: int) -> int:
        """Ring row of reference row k, or -1 if it is not computed yet (never blocks in real
        time; in lockstep the loop computes it here)."""
        self.k = k
        if k >= self.ready:
            if self.threaded:
                return -1
            while k >= self.ready:
                self._fill_next()
        return k % self.cap

    def rows(self, k: int, m: int) -> Planned:
        """A copy of rows k .. k + m - 1 (fewer at the reference's end, or as far as the producer
        has computed in real time; at least row k), as a plan at the loop rate: the path ahead of
        a contact's stop (``pkrt.rt.runtime.machine.protect``; allocates, once, at the event). The
        reader's mark stays at k."""
        end = min(k + m, self.n)
        if not self.threaded:
            while end > self.ready:
                self._fill_next()
        end = max(min(end, self.ready, k + self.cap - self.block), k + 1)
        idx = np.arange(k, end) % self.cap
        self.k = k
        return Planned(self.rate_hz, self.pos[idx], self.vel[idx], self.acc[idx], {"kind": "path ahead"})

    def behind_reason(self, k: int) -> str:
        why = f" ({self.error})" if self.error else " (the host held it, or it is too slow)"
        return (f"reference stream behind: row {k} not computed in time by its producer thread{why}; "
                f"stopped safely")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def figures(self) -> dict:
        """The ring's size and the producer's longest block (for the summary)."""
        return {"ring_rows": self.cap, "block_rows": self.block, "threaded": self.threaded,
                "ring_kb": round(3 * self.pos.nbytes / 1024, 1), "longest_fill_ms": round(self.fill_s * 1e3, 3)}
