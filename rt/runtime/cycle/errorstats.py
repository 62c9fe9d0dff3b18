"""The tracking error over a whole run in fixed memory (actuator units)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def accumulate_error(e, sq, big) -> bool:
    """Add one error sample to the sums of squares and maxima unless a value is not finite."""
    for i in range(e.shape[0]):
        if not np.isfinite(e[i]):
            return False
    for i in range(e.shape[0]):
        sq[i] += e[i] * e[i]
        big[i] = max(big[i], abs(e[i]))
    return True


class ErrorStats:
    """Tracking error over a whole run in fixed memory: per axis the sum of squares, the
    largest magnitude and the count of finite samples (a non-finite feedback sample is the
    fault, not an error). ``add``: one jitted call, nothing allocated."""

    def __init__(self, s: int):
        self.sq, self.big = np.zeros(s), np.zeros(s)
        self.n = 0
        accumulate_error(np.zeros(s), np.zeros(s), np.zeros(s))  # compiled or loaded before the loop

    def add(self, e: np.ndarray) -> None:
        if accumulate_error(e, self.sq, self.big):
            self.n += 1

    def summary(self) -> dict:
        """rms_error, max_error (all axes) and per axis, in actuator units; None without samples."""
        if not self.n:
            return {"rms_error": None, "max_error": None, "rms_error_axes": None, "max_error_axes": None}
        axes = np.sqrt(self.sq / self.n)
        return {"rms_error": float(np.sqrt(self.sq.sum() / (self.n * len(self.sq)))),
                "max_error": float(self.big.max()), "rms_error_axes": axes.tolist(),
                "max_error_axes": self.big.tolist()}


__all__ = ["ErrorStats", "accumulate_error"]
