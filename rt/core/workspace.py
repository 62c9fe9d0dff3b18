"""The per-cycle data of a tree (the Data of the Model/Data split): preallocated outputs and the
kernels' compiled entry points, called from Python without numba's dispatcher."""

from __future__ import annotations

import numpy as np
from numba import typeof

from pkrt.rt.core.tree import BAD_SHAPE, Tree, eval_model_w, eval_tau_w, work_size

_F64 = np.dtype(np.float64)
_VEC = (8,)  # the strides of a contiguous float64 vector


def entry_point(dispatcher, args: tuple):
    """The compiled entry of a jitted kernel for exactly these arguments' numba types (loaded
    from the cache or compiled). Calling it skips the dispatcher's type resolution, which for
    the tree tuple costs about 1.5 us a call (measured); the caller guarantees the types."""
    sig = tuple(typeof(a) for a in args)
    dispatcher.compile(sig)
    return dispatcher.overloads[sig].entry_point


def _checked(status: int, s: int) -> int:
    """The kernel's status, or ValueError for BAD_SHAPE."""
    if status == BAD_SHAPE:
        raise ValueError(f"a state vector must be {s} real numbers")
    return status


class TreeWorkspace:
    """Preallocated outputs for one tree (the per-cycle data of the Model/Data split).

    ``tau_of`` and ``model_of`` from Python call the kernels' compiled entry points directly
    when the tree is the workspace's own and the state vectors are contiguous float64 (1.2 us
    a call on this machine type instead of 2.9 us through numba's dispatcher); other vectors of
    the right length (strided views, other dtypes, lists) are first copied into preallocated
    contiguous ones (numba would compile a new specialisation, about a minute, for each new
    layout); anything else raises ValueError. Another tree object takes the dispatcher's
    path."""

    def __init__(self, tree: Tree):
        s = tree.s
        self.H = np.zeros((s, s))
        self.D = np.zeros((s, s * (s + 1) // 2))
        self.p_ext = np.zeros(s)
        self.tau = np.zeros(s)
        self.work = np.zeros(work_size(s))
        self._T = tree.arrays
        v = np.zeros(s)
        self._tau_entry = entry_point(eval_tau_w, (self._T, v, v, v, self.H, self.D, self.p_ext,
                                                    self.tau, self.work))
        self._model_entry = entry_point(eval_model_w, (self._T, v, self.H, self.D, self.p_ext,
                                                        self.work))
        self._in = np.zeros((3, s))  # contiguous copies of other inputs

    def _copied(self, s: int, *xs) -> tuple:
        """The vectors ``xs`` copied into ``_in`` (contiguous float64); ValueError when one is
        not s real numbers (no broadcasting of a scalar or a row)."""
        try:
            for i, x in enumerate(xs):
                if np.shape(x) != self._in[i].shape:
                    raise ValueError
                np.copyto(self._in[i], x, casting="same_kind")
        except (TypeError, ValueError):
            raise ValueError(f"a state vector must be {s} real numbers, got {x!r:.60}") from None
        return tuple(self._in[:len(xs)])

    def tau_of(self, tree: Tree, theta, theta_dot, theta_ddot) -> int:
        """Fill H, D, p_ext and tau at a state; return the status. Allocates nothing. Raises
        ValueError for a state vector that is not s numbers."""
        T = tree.arrays
        if T is not self._T:  # another tree: numba's dispatcher checks and converts
            return _checked(eval_tau_w(T, theta, theta_dot, theta_ddot, self.H, self.D,
                                       self.p_ext, self.tau, self.work), tree.s)
        try:  # inline checks (a helper function with a loop cost 0.7 us here): a contiguous
            # float64 vector; numba's unboxing refuses what is not an array
            fast = (theta.dtype is _F64 and theta_dot.dtype is _F64 and theta_ddot.dtype is _F64
                    and theta.strides == _VEC and theta_dot.strides == _VEC
                    and theta_ddot.strides == _VEC)
        except AttributeError:  # not an array (the entry point would refuse it too)
            fast = False
        if not fast:
            theta, theta_dot, theta_ddot = self._copied(tree.s, theta, theta_dot, theta_ddot)
        status = self._tau_entry(T, theta, theta_dot, theta_ddot, self.H, self.D, self.p_ext,
                                 self.tau, self.work)
        return status if status >= 0 else _checked(status, tree.s)

    def model_of(self, tree: Tree, theta) -> int:
        """Fill H, D, p_ext at theta; return the status. Allocates nothing. Raises ValueError
        for a theta that is not s numbers."""
        T = tree.arrays
        if T is not self._T:
            return _checked(eval_model_w(T, theta, self.H, self.D, self.p_ext, self.work), tree.s)
        try:
            fast = theta.dtype is _F64 and theta.strides == _VEC
        except AttributeError:
            fast = False
        if not fast:
            theta, = self._copied(tree.s, theta)
        status = self._model_entry(T, theta, self.H, self.D, self.p_ext, self.work)
        return status if status >= 0 else _checked(status, tree.s)
