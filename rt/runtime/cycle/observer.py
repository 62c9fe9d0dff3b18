"""Contact detection: the generalized momentum observer in pkrt's reduced coordinates.

The machine's reduced dynamics with an external generalized force tau_ext (actuator space):

    H(theta) thetadd + D(theta) [td td] - p_ext(theta) + f(td) = tau + tau_ext

(H, D, p_ext from the controller's tree or exact model; f the configured friction, viscous
b td + Coulomb Fc tanh(td / v_eps)). With the momentum p = H td, p_dot = H thetadd + H_dot td, so

    p_dot = tau + tau_ext + beta,   beta = H_dot td - D [td td] + p_ext - f(td)

and the residual r = K_O (p(t) - p(0) - integral(tau + beta + r) dt) obeys r_dot = K_O (tau_ext - r):
a first-order filter of the external force, time constant 1 / K_O (De Luca et al. 2003; Haddadin,
De Luca, Albu-Schaeffer 2017; C^T td - g there is beta here: H_dot = C + C^T, D [td td] = C td).

Discretised between cycles k-1 and k (period dt, the command tau_{k-1} held over it by the drive),
with the trapezoid rule for the smooth terms and H_dot from the change of H along the motion:

    integral(H_dot td) ~ (H_k - H_{k-1}) (td_k + td_{k-1}) / 2
    p_k - p_{k-1} - that = (H_k + H_{k-1}) / 2 (td_k - td_{k-1})

so the external impulse over the period is, with rest = p_ext - D [td td] - f(td),

    e_k = (H_k + H_{k-1}) / 2 (td_k - td_{k-1}) - dt (tau_{k-1} + (rest_k + rest_{k-1}) / 2)

and for a force constant over the period the filter's exact step is
r_k = a r_{k-1} + (1 - a) e_k / dt, a = exp(-K_O dt). No derivative of H is evaluated: H of the
last cycle is kept. One call a cycle, after the control law, inside the fused kernel; it
allocates nothing: its state lives in one flat array (``observer_state``).

Two slots of state, cycle k reading slot (k - 1) % 2 and writing slot k % 2, make a call for cycle
k repeatable (the compiled lockstep loop hands a cycle that ends the run back to the Python cycle,
which calls again from the same state). A cycle whose slot before is not cycle k - 1's (the
first cycle, a skipped period, an enable after torque off) restarts the observer: r_k = 0, and
it integrates from there (a force present then is seen after a time constant).
Units: N or N m (actuator forces), s.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pkrt.rt.core.tree import quad_velocities

# the header of the state array
ENABLED, GAIN, PERIOD, DECAY, NHEAD = 0, 1, 2, 3, 4  # 1.0 / 0.0; K_O (1/s); dt (s); exp(-K_O dt)
VISCOUS, COULOMB, VEPS = 4, 5, 6  # rows of the controller's gains (controller.make_gains)


def layout(s: int) -> dict[str, int]:
    """Offsets in the state array: the thresholds (s), the last residual (s), then two slots of
    (cycle, H (s x s), td (s), rest (s), tau (s), r (s))."""
    th = NHEAD
    last = th + s
    slot0 = last + s
    size = 1 + s * s + 4 * s
    return {"thresholds": th, "residual": last, "slot0": slot0, "slot": size, "size": slot0 + 2 * size}


def observer_state(s: int, gain: float = 0.0, period: float = 1e-3, thresholds=np.inf,
                   enabled: bool = False) -> np.ndarray:
    """The observer's flat state array: header, thresholds, last residual, two slots (their
    cycle NaN: empty). ``gain`` K_O (1/s), ``period`` the loop's (s), ``thresholds`` per actuator
    (N or N m; a residual beyond one is a detection)."""
    lay = layout(s)
    obs = np.zeros(lay["size"])
    obs[ENABLED] = 1.0 if enabled else 0.0
    obs[GAIN], obs[PERIOD] = gain, period
    obs[DECAY] = math.exp(-gain * period)
    obs[lay["thresholds"]:lay["thresholds"] + s] = np.broadcast_to(np.asarray(thresholds, float), (s,))
    for j in range(2):
        obs[lay["slot0"] + j * lay["slot"]] = np.nan
    return obs


@njit(cache=True, inline="always")
def _observe_s(obs, k, theta_dot, H, D, p, w, gains, tau, s):
    """``observe`` with s passed in (a compile-time constant in the s = 3 and 6 paths: LLVM
    unrolls the small loops)."""
    m = s * (s + 1) // 2
    last = NHEAD + s
    size = 1 + s * s + 4 * s
    cur = last + s + (k % 2) * size
    prev = last + s + ((k + 1) % 2) * size
    dt, a = obs[PERIOD], obs[DECAY]
    b = (1.0 - a) / dt
    ok = obs[prev] == k - 1
    hc, vc, rc, tc, qc = cur + 1, cur + 1 + s * s, cur + 1 + s * s + s, cur + 1 + s * s + 2 * s, cur + 1 + s * s + 3 * s
    hp, vp, rp, tp, qp = (prev + 1, prev + 1 + s * s, prev + 1 + s * s + s, prev + 1 + s * s + 2 * s,
                          prev + 1 + s * s + 3 * s)
    worst, axis = 1.0, -1
    for i in range(s):
        v = theta_dot[i]
        rest = p[i] - gains[VISCOUS, i] * v - gains[COULOMB, i] * np.tanh(v / gains[VEPS, i])
        for c in range(m):
            rest -= D[i, c] * w[c]
        r = 0.0
        if ok:
            e = -dt * (obs[tp + i] + 0.5 * (rest + obs[rp + i]))
            for j in range(s):
                e += 0.5 * (H[i, j] + obs[hp + i * s + j]) * (theta_dot[j] - obs[vp + j])
            r = a * obs[qp + i] + b * e
        obs[rc + i] = rest
        obs[qc + i] = r
        obs[last + i] = r
        if abs(r) > obs[NHEAD + i]:  # beyond its threshold: the largest ratio is the contact's axis
            x = abs(r) / obs[NHEAD + i]
            if x > worst:
                worst, axis = x, i
    for i in range(s):
        obs[vc + i] = theta_dot[i]
        obs[tc + i] = tau[i]
        for j in range(s):
            obs[hc + i * s + j] = H[i, j]
    obs[cur] = k
    return axis


@njit(cache=True, inline="always")
def observe(obs, k, theta_dot, H, D, p, w, gains, tau):
    """The residual of cycle k (a monotonic cycle number): H, D, p (p_ext) at this cycle's feedback
    and w = [td td] as the control law left them, ``tau`` this cycle's command (held over the next
    period); the residual into obs's ``residual`` and slot k % 2. Returns the actuator whose
    |residual| exceeds its threshold by the largest ratio, or -1."""
    s = theta_dot.shape[0]
    if s == 3:
        return _observe_s(obs, k, theta_dot, H, D, p, w, gains, tau, 3)
    if s == 6:
        return _observe_s(obs, k, theta_dot, H, D, p, w, gains, tau, 6)
    return _observe_s(obs, k, theta_dot, H, D, p, w, gains, tau, s)


@njit(cache=True)
def observe_staged(obs, k, theta_dot, H, D, p, w, gains, tau, row, col):
    """``observe`` for a cycle outside the fused kernel (the exact model in the loop, the served
    machine), its residual staged into ``row[col:col + s]`` when ``col`` >= 0; -1 when disabled."""
    if obs[ENABLED] == 0.0:
        return -1
    axis = observe(obs, k, theta_dot, H, D, p, w, gains, tau)
    if col >= 0:
        s = theta_dot.shape[0]
        for i in range(s):
            row[col + i] = obs[NHEAD + s + i]
    return axis


@njit(cache=True)
def replay(obs, cycles, theta_dot, H, D, p, gains, tau, out):
    """The observer over logged cycles (offline: ``pkrt identify``'s noise floor): row k has the
    loop cycle ``cycles[k]`` (a gap restarts the observer), theta_dot (n, s), the model H (n, s, s),
    D (n, s, m), p (n, s) there and the command tau (n, s); residuals into ``out`` (n, s)."""
    n, s = theta_dot.shape
    w = np.empty(D.shape[2])
    for k in range(n):
        quad_velocities(theta_dot[k], w)
        observe(obs, cycles[k], theta_dot[k], H[k], D[k], p[k], w, gains, tau[k])
        for i in range(s):
            out[k, i] = obs[NHEAD + s + i]


def residual(obs: np.ndarray, s: int) -> np.ndarray:
    """The last residual (a view: N or N m per actuator)."""
    return obs[NHEAD + s:NHEAD + 2 * s]


def thresholds(obs: np.ndarray, s: int) -> np.ndarray:
    """The thresholds (a view)."""
    return obs[NHEAD:NHEAD + s]


def step_force(obs: np.ndarray, s: int, k: int) -> np.ndarray:
    """The external force per actuator, if it is a step, from cycle k's and k - 1's residuals:
    after j periods of a step F the residual is F (1 - a^j), so F = r_{k-1} + (r_k - r_{k-1}) / (1 - a)
    (the residual itself when the slot before is not cycle k - 1's)."""
    lay = layout(s)
    q = 1 + s * s + 3 * s  # r in a slot
    cur, prev = lay["slot0"] + (k % 2) * lay["slot"], lay["slot0"] + ((k + 1) % 2) * lay["slot"]
    rk = obs[cur + q:cur + q + s].copy()
    if obs[prev] != k - 1 or not 0.0 < obs[DECAY] < 1.0:
        return rk
    rp = obs[prev + q:prev + q + s]
    return rp + (rk - rp) / (1.0 - obs[DECAY])


def onset_cycles(obs: np.ndarray, s: int, k: int, axis: int) -> float:
    """Cycles from the onset of the force that cycle k's residual on ``axis`` sees, if it is a
    step (``step_force``): j = ln(1 - r_k / F) / ln(a), at least 1."""
    a = obs[DECAY]
    f = step_force(obs, s, k)[axis]
    rk = obs[NHEAD + s + axis]
    x = rk / f if f != 0.0 else 1.0
    if not (0.0 < a < 1.0 and 0.0 < x < 1.0):
        return 1.0
    return max(1.0, math.log(1.0 - x) / math.log(a))


def restart(obs: np.ndarray, s: int) -> None:
    """Forget the state: the next cycle starts the observer again (r = 0)."""
    lay = layout(s)
    for j in range(2):
        obs[lay["slot0"] + j * lay["slot"]] = np.nan
    residual(obs, s)[:] = 0.0


__all__ = ["observer_state", "observe", "observe_staged", "replay", "residual", "thresholds", "restart", "layout",
           "onset_cycles", "step_force"]
