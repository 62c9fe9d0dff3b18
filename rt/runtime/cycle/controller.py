"""Controllers: computed torque on the reduced-dynamics tree, and PD plus gravity.

Computed torque (per axis gains Kp (1/s^2), Kd (1/s)):
  tau = H(theta) (thetadd_ref + Kd e_dot + Kp e) + D(theta) [td td] - p_ext(theta) + f(td_ref)
PD plus gravity with the same gains, made forces by the nominal inertia H0 (the diagonal of H
at the centre of the range): tau = diag(H0) (Kd e_dot + Kp e) - p_ext(theta) + f(td_ref).
f is the friction feedforward (viscous b, Coulomb Fc tanh(v / v_eps)); zero unless the
configuration gives it. e = theta_ref - theta. tau is saturated at +/- tau_max.
One numba call a cycle; the workspace arrays are preallocated.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from pkrt.rt.runtime.cycle.flags import FLAG_NONFINITE, FLAG_OVERRUN, FLAG_SATURATED, FLAG_STALE, FLAG_TREE
from pkrt.rt.core.cycleclock import rdtsc
from pkrt.rt.core.friction import V_EPS
from pkrt.rt.core.tree import CLAMPED, OUT_OF_DOMAIN, Tree, eval_model_w, quad_velocities, work_size
from pkrt.rt.core.workspace import entry_point
from pkrt.rt.runtime.cycle import observer
from pkrt.rt.runtime.cycle.observer import observe, observer_state
from pkrt.rt.runtime.cycle.safety import OK, check_feedback
from pkrt.rt.runtime.cycle.staging import stage_row

CT, PD = 0, 1


class Gains(NamedTuple):
    """The controller's per-axis gains by name, each a float array (s,): the rows of one (7, s)
    array (``make_gains``), which the kernel takes (one array: no per-call cost of unboxing a
    tuple of arrays, 2 us a cycle measured) and reads by the row names ``ROW`` below."""

    kp: np.ndarray  # 1/s^2
    kd: np.ndarray  # 1/s
    tau_max: np.ndarray  # N or N m, saturation
    h0: np.ndarray  # nominal inertia: diagonal of H at the centre of the tree's box (PD)
    viscous: np.ndarray  # N s/m or N m s/rad, friction feedforward
    coulomb: np.ndarray  # N or N m, friction feedforward
    v_eps: np.ndarray  # m/s or rad/s, tanh velocity scale of the Coulomb term


# the row of each gain in the kernel's (7, s) array (compile-time constants in numba)
KP, KD, TAU_MAX, H0, VISCOUS, COULOMB, VEPS = range(7)
assert Gains._fields.index("v_eps") == VEPS and Gains._fields.index("kd") == KD
assert (observer.VISCOUS, observer.COULOMB, observer.VEPS) == (VISCOUS, COULOMB, VEPS)  # the observer reads them


def make_gains(s: int, kp, kd, tau_max, h0, viscous=0.0, coulomb=0.0, v_eps=V_EPS) -> np.ndarray:
    """The (7, s) gains array, rows in ``Gains`` order, from numbers or per-axis sequences;
    ``Gains(*array)`` names its rows."""
    return np.vstack([np.broadcast_to(np.asarray(x, float), (s,))
                      for x in (kp, kd, tau_max, h0, viscous, coulomb, v_eps)]).copy()


@njit(cache=True)
def control(T, kind, theta, theta_dot, ref_pos, ref_vel, ref_acc, gains, H, D, p, w, v,
            tau_model, tau, work):
    """Fill tau_model (before saturation) and tau; return (flags, tree status). Allocates
    nothing: H, D, p, w, v and ``work`` (tree scratch) are preallocated. FLAG_NONFINITE: a
    tau entry is not finite (checked here: a numpy check in the loop cost microseconds).

    ``gains``: the (7, s) array of ``make_gains``, read by the row names (``gains[KP, i]``).
    """
    status = eval_model_w(T, theta, H, D, p, work)
    return control_law(kind, status, theta, theta_dot, ref_pos, ref_vel, ref_acc, gains, H, D, p, w, v,
                       tau_model, tau)


@njit(cache=True)
def control_law(kind, status, theta, theta_dot, ref_pos, ref_vel, ref_acc, gains, H, D, p, w, v, tau_model, tau):
    """The control law on a model already evaluated at theta (H, D, p filled; ``status`` its
    status); see ``control``."""
    s = theta.shape[0]
    quad_velocities(theta_dot, w)
    flags = 0
    if status != 0:
        flags |= FLAG_TREE
    for i in range(s):
        fb = gains[KD, i] * (ref_vel[i] - theta_dot[i]) + gains[KP, i] * (ref_pos[i] - theta[i])
        v[i] = ref_acc[i] + fb if kind == CT else fb
    for i in range(s):
        acc = -p[i] + gains[VISCOUS, i] * ref_vel[i] + gains[COULOMB, i] * np.tanh(ref_vel[i] / gains[VEPS, i])
        if kind == CT:
            for j in range(s):
                acc += H[i, j] * v[j]
            for c in range(w.shape[0]):
                acc += D[i, c] * w[c]
        else:
            acc += gains[H0, i] * v[i]
        tau_model[i] = acc
        lim = gains[TAU_MAX, i]
        if acc > lim:
            acc = lim
            flags |= FLAG_SATURATED
        elif acc < -lim:
            acc = -lim
            flags |= FLAG_SATURATED
        tau[i] = acc
        if not np.isfinite(acc):
            flags |= FLAG_NONFINITE
    return flags, status


def controller_workspace(s: int) -> np.ndarray:
    """One flat array holding H, D, p, w, v, tau_model, tau and the tree's scratch
    (``workspace_views``): a kernel call types one argument for all of them."""
    m = s * (s + 1) // 2
    return np.zeros(s * s + s * m + s + m + 4 * s + work_size(s))


@njit(cache=True)
def workspace_views(ws, s):
    """H (s, s), D (s, m), p, w (m), v, tau_model, tau, work: views of ``controller_workspace(s)``."""
    m = s * (s + 1) // 2
    H = ws[:s * s].reshape((s, s))
    o = s * s
    D = ws[o:o + s * m].reshape((s, m))
    o += s * m
    p, w = ws[o:o + s], ws[o + s:o + s + m]
    o += s + m
    v, tau_model, tau = ws[o:o + s], ws[o + s:o + 2 * s], ws[o + 2 * s:o + 3 * s]
    return H, D, p, w, v, tau_model, tau, ws[o + 3 * s:]


@njit(cache=True)
def checked_control(T, kind, theta, theta_dot, ref_pos, ref_vel, ref_acc, gains, limits, ws, obs, k, ns_per_tick,
                    row, err):
    """The safety checks of the feedback (``check_feedback``, ``limits`` the supervisor's),
    then, if they pass, ``control`` and the contact observer of cycle k (``observer.observe`` on
    the state ``obs``, when enabled: its time counts in the law's), then the cycle's log row and
    error staged (``stage_row``: t, wake, compute and flags are left to the caller, tau as
    computed; the residual after the row's 4 + 7 s values when the observer is enabled), in one
    call; returns (check code, its axis -- or when the checks pass, the axis of a contact the
    observer detected, else -1 --, flags, tree status, ns in the tree, in the law, in the
    staging), the times from the time-stamp counter (``pkrt.rt.core.cycleclock``; ``ns_per_tick``
    its period). Seven values, as before the observer: the loop's Python cycle takes the tuple
    without a new size of Python object (a fresh allocator pool there was a page fault)."""
    s = theta.shape[0]
    H, D, p, w, v, tau_model, tau, work = workspace_views(ws, s)
    code, axis = check_feedback(theta, theta_dot, ref_pos, limits)
    flags = status = 0
    c0 = c1 = c2 = rdtsc()
    if code == OK:
        status = eval_model_w(T, theta, H, D, p, work)
        c1 = rdtsc()
        flags, status = control_law(kind, status, theta, theta_dot, ref_pos, ref_vel, ref_acc, gains, H, D, p, w, v,
                                    tau_model, tau)
        if obs[observer.ENABLED] != 0.0 and status != OUT_OF_DOMAIN:
            axis = observe(obs, k, theta_dot, H, D, p, w, gains, tau)  # a contact's axis, or -1
        c2 = rdtsc()
    stage_row(row, 0.0, ref_pos, ref_vel, ref_acc, theta, theta_dot, tau, True, tau_model, 0.0, 0.0, 0, err)
    if obs[observer.ENABLED] != 0.0 and row.shape[0] >= 4 + 8 * s:
        for i in range(s):
            row[4 + 7 * s + i] = obs[observer.NHEAD + s + i]
    c3 = rdtsc()
    return (code, axis, flags, status, int((c1 - c0) * ns_per_tick), int((c2 - c1) * ns_per_tick),
            int((c3 - c2) * ns_per_tick))


class Controller:
    """A controller bound to its tree, gains and preallocated workspace. ``model``: None (the
    tree in the loop) or a callable ``model(theta, H, D, p) -> status`` filling the given arrays
    (the exact reduction, built outside the runtime; status as the tree's: 0 ok, 2 out of
    domain); the tree then only gives H0 for PD."""

    def __init__(self, tree: Tree, kind: str, kp, kd, tau_max, viscous=0.0, coulomb=0.0, model=None):
        if kind not in ("ct", "pd"):
            raise ValueError(kind)
        s = tree.s
        self.tree = tree
        self.arrays = tree.arrays
        self.kind_name = kind
        self.kind = CT if kind == "ct" else PD
        self.model = model
        self.ws = controller_workspace(s)
        self.H, self.D, self.p, self.w, self.v, self.tau_model, self.tau, self.work = workspace_views(self.ws, s)
        # nominal inertia at the centre of the tree's box (plan once)
        centre = 0.5 * (tree.lo + tree.hi)
        H0 = np.zeros((s, s))
        eval_model_w(self.arrays, centre, H0, np.zeros_like(self.D), np.zeros(s), self.work)
        self.gains = make_gains(s, kp, kd, tau_max, np.diag(H0), viscous, coulomb)  # (7, s)
        self.obs = observer_state(s)  # the contact observer's state (``protect``: enabled)
        # ``bind``: (entry point, theta, theta_dot, limits, row, ref pos ring, ref vel ring, ref acc ring,
        # error ring); a plain tuple read by position in ``checked``, once a cycle
        self._bound: tuple | None = None
        self._no_row = np.zeros(1)

    def protect(self, gain: float, period: float, thresholds) -> None:
        """Enable the contact observer (``pkrt.rt.runtime.cycle.observer``): gain K_O (1/s), the loop's
        period (s), thresholds per actuator (N or N m). Before ``bind``: the state array is
        replaced."""
        self.obs = observer_state(self.tree.s, gain, period, thresholds, enabled=True)

    @property
    def protected(self) -> bool:
        return bool(self.obs[observer.ENABLED])

    def observe(self, k: int, theta_dot, row=None, col: int = -1) -> int:
        """The observer of cycle k after ``law`` or ``update`` (the unfused path): the axis of a
        detected contact or -1; its residual staged into ``row[col:]`` when given."""
        return observer.observe_staged(self.obs, k, theta_dot, self.H, self.D, self.p, self.w, self.gains,
                                       self.tau, self._no_row if row is None else row, col if row is not None else -1)

    @property
    def named_gains(self) -> Gains:
        """The gains by name (views of the kernel's array)."""
        return Gains(*self.gains)

    def evaluate(self, theta) -> int:
        """The model (tree or ``model``) at theta into H, D, p; returns its status (the first
        half of ``update``, timed on its own by the loop)."""
        if self.model is not None:
            return self.model(theta, self.H, self.D, self.p)
        return eval_model_w(self.arrays, theta, self.H, self.D, self.p, self.work)

    def law(self, status: int, theta, theta_dot, ref_pos, ref_vel, ref_acc) -> int:
        """The control law on the model ``evaluate`` left (its ``status``): ``self.tau``; returns
        the flags (the second half of ``update``)."""
        return control_law(self.kind, status, theta, theta_dot, ref_pos, ref_vel, ref_acc, self.gains, self.H,
                           self.D, self.p, self.w, self.v, self.tau_model, self.tau)[0]

    def bind(self, theta, theta_dot, limits, row, ref_rings: tuple, err_ring) -> None:
        """Resolve ``checked_control``'s compiled entry point for the loop's own arrays: the
        drives' feedback vectors, the supervisor's ``limits``, the log ``row``, the reference's
        (pos, vel, acc) rings and the error ring, whose rows ``checked`` is given each cycle.
        From Python, numba's dispatcher types every argument on every call, the tree tuple's 19
        among them: in lockstep the safety part (the call's entry and exit) took 5.2-6.6 us a
        cycle through it and 3.9-5.3 us through the entry point (mean, 3 alternated pairs). The
        rings must own their (float64, C-order) memory: a row is recognised by its ``base``."""
        for a in (*ref_rings, err_ring):
            if not (isinstance(a, np.ndarray) and a.dtype == np.float64 and a.ndim == 2
                    and a.flags.c_contiguous and a.base is None):
                self._bound = None
                return
        args = (self.arrays, self.kind, theta, theta_dot, ref_rings[0][0], ref_rings[1][0], ref_rings[2][0],
                self.gains, limits, self.ws, self.obs, 0, 1.0, row, err_ring[0])
        self._bound = (entry_point(checked_control, args), theta, theta_dot, limits, row, *ref_rings, err_ring)

    def checked(self, theta, theta_dot, ref_pos, ref_vel, ref_acc, limits, ns_per_tick: float, row, err,
                k: int = 0) -> tuple:
        """``checked_control`` of cycle k on this controller's tree, gains, workspace and observer: through the entry
        point ``bind`` resolved when the arguments are the bound arrays and rows of the bound
        rings (identity checks: their types are the resolved ones), else numba's dispatcher."""
        b = self._bound
        if (b is not None and theta is b[1] and theta_dot is b[2] and limits is b[3] and row is b[4]
                and getattr(ref_pos, "base", None) is b[5] and getattr(ref_vel, "base", None) is b[6]
                and getattr(ref_acc, "base", None) is b[7] and getattr(err, "base", None) is b[8]):
            call = b[0]
        else:
            call = checked_control
        return call(self.arrays, self.kind, theta, theta_dot, ref_pos, ref_vel, ref_acc, self.gains, limits,
                    self.ws, self.obs, k, ns_per_tick, row, err)

    def update(self, theta, theta_dot, ref_pos, ref_vel, ref_acc) -> tuple[int, int]:
        """Compute ``self.tau``; returns (flags, tree status)."""
        if self.model is not None:
            status = self.model(theta, self.H, self.D, self.p)
            return control_law(self.kind, status, theta, theta_dot, ref_pos, ref_vel, ref_acc, self.gains, self.H,
                               self.D, self.p, self.w, self.v, self.tau_model, self.tau)
        return control(self.arrays, self.kind, theta, theta_dot, ref_pos, ref_vel, ref_acc,
                       self.gains, self.H, self.D, self.p, self.w, self.v, self.tau_model, self.tau,
                       self.work)


__all__ = ["Controller", "Gains", "make_gains", "control", "control_law", "checked_control", "controller_workspace",
           "workspace_views", "CT", "PD", "FLAG_SATURATED", "FLAG_TREE", "FLAG_OVERRUN",
           "FLAG_STALE", "FLAG_NONFINITE", "CLAMPED", "OUT_OF_DOMAIN"]
