"""Dwells of a run: where its reference rests long enough for an instrument to read the tool
(``pkrt calibrate``, and the simulated instrument of ``pkrt run --measure``).

A row rests when no axis of the reference moved since the row before by more than
``REST_SPEED`` times the period; a dwell is a run of resting rows of at least ``MIN_DWELL_S``.
The reading is taken over the last ``READING_S`` of each dwell (at most its second half), when
the machine has settled: the instrument averages the tool there, the log's measured positions
are averaged over the same rows. Times in s, positions in actuator units (m or rad).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REST_SPEED = 1e-6  # m/s or rad/s: a reference slower than this rests
MIN_DWELL_S = 0.25  # s: shorter rests (a move's turning point, a demo's corner) are no dwells
READING_S = 0.1  # s: the instrument's reading, at the end of each dwell


@dataclass(frozen=True)
class Dwell:
    """Rows [start, end) of a log or reference rest; the reading averages rows [read, end)."""
    start: int
    end: int
    read: int
    t_start: float  # s
    t_end: float  # s, the last resting row's time
    t_read: float  # s, the middle of the reading

    @property
    def rows(self) -> slice:
        return slice(self.read, self.end)


def resting(ref: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(n,) bool: the reference did not move since the row before (the first row: False)."""
    ref = np.atleast_2d(np.asarray(ref, float))
    rest = np.zeros(len(ref), dtype=bool)
    if len(ref) > 1:
        dt = np.maximum(np.diff(t), 1e-12)
        rest[1:] = np.all(np.abs(np.diff(ref, axis=0)) <= REST_SPEED * dt[:, None], axis=1)
    return rest


def find_dwells(ref: np.ndarray, t: np.ndarray, min_s: float = MIN_DWELL_S, reading_s: float = READING_S
                ) -> list[Dwell]:
    """The dwells of a reference ``ref`` (n, s) sampled at times ``t`` (n,), in order."""
    t = np.asarray(t, float)
    rest = resting(ref, t)
    edges = np.flatnonzero(np.diff(np.r_[0, rest.astype(np.int8), 0]))
    out = []
    for a, b in zip(edges[::2], edges[1::2]):
        a = max(a - 1, 0)  # the row a move ends on rests too
        if t[b - 1] - t[a] + 1e-9 < min_s:
            continue
        span = min(reading_s, 0.5 * (t[b - 1] - t[a]))
        read = int(np.searchsorted(t[a:b], t[b - 1] - span + 1e-9)) + a
        out.append(Dwell(int(a), int(b), read, float(t[a]), float(t[b - 1]), float(0.5 * (t[read] + t[b - 1]))))
    return out


__all__ = ["Dwell", "MIN_DWELL_S", "READING_S", "REST_SPEED", "find_dwells", "resting"]
