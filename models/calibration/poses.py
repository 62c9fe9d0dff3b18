"""Measurement poses chosen for observability, and the trajectory that visits them.

Candidates are actuator configurations drawn uniformly inside the position limits (less a
margin), assembled on the machine's branch and kept when their singularity measure is at least
``singular_margin`` times the model's threshold. Among them, ``select`` picks the poses that
maximise the determinant of the information matrix of the scaled identification Jacobian
(base parameters; ``problem``): greedily, then by exchanges (Fedorov) until none helps. That
maximises Borm and Menq's observability index O1 = (product of the singular values)^(1/L) /
sqrt(poses) for the number of poses (``observability``).

The trajectory starts at the reference assembly, visits the poses (nearest first) by quintic
moves timed within 80 % of the velocity and acceleration limits, rests ``dwell`` s at each
(settling, then the instrument's reading: ``pkrt.rt.runtime.machine.dwells``) and returns. Units:
actuator units (m or rad), s.
"""

from __future__ import annotations

import math

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import Planned, concatenate, plan_moves

from ..kinematics.assembly import Assembler
from ..kinematics.mechanism import AssemblyError, Mechanism

QUINTIC_PEAK_VELOCITY = 1.875  # x distance / time
QUINTIC_PEAK_ACCELERATION = 5.7735  # x distance / time^2 (10 / sqrt(3))


def candidate_poses(mech: Mechanism, count: int, lo: np.ndarray, hi: np.ndarray, seed: int = 0,
                    singular_margin: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``count`` configurations uniform in [lo, hi] (s,) that assemble on the branch and
    keep the singularity measure at least ``singular_margin`` times the model's threshold:
    (theta (k, s), singularity measure (k,))."""
    rng = np.random.default_rng(seed)
    asm = Assembler(mech)
    floor = singular_margin * mech.description.singular_threshold
    out, sing = [], []
    for th in lo + (hi - lo) * rng.uniform(size=(3 * count, len(lo))):
        try:
            cfg = asm.solve(th)
        except AssemblyError:
            asm.reset()
            continue
        m = mech.singularity_measure(cfg, th)
        if m >= floor:
            out.append(th)
            sing.append(m)
            if len(out) == count:
                break
    if not out:
        raise UserError(f"{mech.name}: no pose inside the limits assembles away from singularities "
                        f"(measure >= {floor:g})")
    return np.array(out), np.array(sing)


def observability(A: np.ndarray) -> dict:
    """Borm and Menq's O1 and the condition number of the scaled Jacobian A (poses, m, n)."""
    sv = np.linalg.svd(A.reshape(-1, A.shape[-1]), compute_uv=False)
    o1 = float(np.exp(np.mean(np.log(np.maximum(sv, 1e-300)))) / math.sqrt(A.shape[0]))
    return {"o1": o1, "condition_number": float(sv[0] / sv[-1]) if sv[-1] > 0 else math.inf,
            "smallest_singular_value": float(sv[-1])}


def select(A: np.ndarray, count: int, passes: int = 4) -> np.ndarray:
    """Indices of ``count`` candidates (rows of A (K, m, n)) maximising det(sum A_i^T A_i):
    greedy, then exchanges of one pose for another while the determinant grows."""
    K, m, n = A.shape
    if count > K:
        raise UserError(f"{count} poses asked for, {K} candidates inside the workspace")
    info = np.einsum("kmi,kmj->kij", A, A)
    eye = np.eye(m)
    M = 1e-9 * np.trace(info.mean(axis=0)) / n * np.eye(n)
    chosen: list[int] = []

    def gains(Mc: np.ndarray, exclude) -> np.ndarray:
        B = A @ np.linalg.inv(Mc)
        g = np.linalg.slogdet(eye + np.einsum("kmi,kli->kml", B, A))[1]
        g[list(exclude)] = -np.inf
        return g

    for _ in range(count):
        c = int(np.argmax(gains(M, chosen)))
        chosen.append(c)
        M = M + info[c]
    for _ in range(passes):
        better = False
        for p in range(count):
            rest = M - info[chosen[p]]
            g = gains(rest, chosen)
            c = int(np.argmax(g))
            here = np.linalg.slogdet(eye + A[chosen[p]] @ np.linalg.inv(rest) @ A[chosen[p]].T)[1]
            if g[c] > here + 1e-9:
                chosen[p], M, better = c, rest + info[c], True
        if not better:
            break
    return np.array(chosen)


def visiting_order(theta: np.ndarray, home: np.ndarray, span: np.ndarray) -> np.ndarray:
    """The poses' order from ``home``: always the nearest not yet visited (max norm, each axis
    in units of its ``span``)."""
    left = list(range(len(theta)))
    at, order = home, []
    while left:
        d = [np.max(np.abs(theta[i] - at) / span) for i in left]
        i = left.pop(int(np.argmin(d)))
        order.append(i)
        at = theta[i]
    return np.array(order)


def move_time(a: np.ndarray, b: np.ndarray, velocity: np.ndarray, acceleration: np.ndarray,
              shortest: float = 0.3, rate_hz: float = 1000.0) -> float:
    """A quintic move's duration (s) from a to b within ``velocity`` and ``acceleration`` (per
    axis), at least ``shortest``, whole periods."""
    d = np.abs(b - a)
    T = max(shortest, float(np.max(QUINTIC_PEAK_VELOCITY * d / velocity)),
            float(np.max(np.sqrt(QUINTIC_PEAK_ACCELERATION * d / acceleration))))
    return math.ceil(T * rate_hz - 1e-9) / rate_hz


def measurement_trajectory(poses: np.ndarray, home: np.ndarray, velocity: np.ndarray, acceleration: np.ndarray,
                           dwell: float, rate_hz: float, slow: np.ndarray | None = None) -> tuple[Planned, list]:
    """From ``home`` through ``poses`` (k, s) in order, resting ``dwell`` s at each, and back:
    (the plan at ``rate_hz``, [(t_start, t_end) of each dwell]). ``slow`` (k + 1,): a factor on
    each move's duration (1 by default)."""
    pts = np.vstack([home, poses, home])
    slow = np.ones(len(pts) - 1) if slow is None else slow
    T = [move_time(a, b, velocity, acceleration, rate_hz=rate_hz) * f for a, b, f in zip(pts[:-1], pts[1:], slow)]
    T = [math.ceil(x * rate_hz - 1e-9) / rate_hz for x in T]
    there = plan_moves(pts[:-1], T[:-1], rate_hz, dwell=dwell)
    back = plan_moves(pts[-2:], T[-1:], rate_hz)
    plan = concatenate([there, back], {"kind": "calibration poses", "poses": poses.tolist(), "dwell_s": dwell})
    dwells, t = [], 0.0
    for Ti in T[:-1]:
        t += Ti
        dwells.append((t, t + dwell))
        t += dwell
    return plan, dwells


def write_trajectory(path: str, plan: Planned, names: list[str]) -> int:
    """``t`` and one column per actuator, one row per loop period (pkrt run --traj)."""
    with open(path, "w") as f:
        f.write("t," + ",".join(names) + "\n")
        for k in range(plan.n):
            f.write(f"{k / plan.rate_hz:.6f}," + ",".join(f"{x:.12g}" for x in plan.pos[k]) + "\n")
    return plan.n


def check_trajectory(mech: Mechanism, plan: Planned, dwells: list, tree, viscous: np.ndarray, coulomb: np.ndarray,
                     singular_margin: float = 3.0, every: int = 5, sing_rate: float = 50.0) -> dict:
    """The plan's forces (H thetadd + D [td td] - p_ext from the machine's ``tree`` plus the
    friction, every ``every``-th sample) per move (the stretch before each dwell and the last
    one back), and the singularity measure along it at ``sing_rate`` Hz: {"force" (moves, s),
    "singularity_measure_min", "where" (the first problem or None)}."""
    from pkrt.rt.core.friction import V_EPS
    from pkrt.rt.core.tree import OUT_OF_DOMAIN, eval_tau

    s = plan.pos.shape[1]
    H, D, p, tau = np.zeros((s, s)), np.zeros((s, s * (s + 1) // 2)), np.zeros(s), np.zeros(s)
    bounds = [0] + [int(round(b * plan.rate_hz)) for _, b in dwells] + [plan.n]
    force = np.zeros((len(bounds) - 1, s))
    for m, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        for k in range(a, b, every):
            th, td = plan.pos[k], plan.vel[k]
            if eval_tau(tree.arrays, th, td, plan.acc[k], H, D, p, tau) == OUT_OF_DOMAIN:
                return {"force": force, "singularity_measure_min": None,
                        "where": f"move {m + 1} leaves the tree's domain at theta = {np.round(th, 6).tolist()}"}
            force[m] = np.maximum(force[m], np.abs(tau + viscous * td + coulomb * np.tanh(td / V_EPS)))
    asm = Assembler(mech)
    floor = singular_margin * mech.description.singular_threshold
    step = max(1, int(round(plan.rate_hz / sing_rate)))
    low = math.inf
    for k in range(0, plan.n, step):
        try:
            m = mech.singularity_measure(asm.solve(plan.pos[k]), plan.pos[k])
        except AssemblyError as e:
            return {"force": force, "singularity_measure_min": None, "where": f"at t = {k / plan.rate_hz:.3f} s: {e}"}
        low = min(low, m)
        if m < floor:
            return {"force": force, "singularity_measure_min": low,
                    "where": f"at t = {k / plan.rate_hz:.3f} s the singularity measure is {m:.3g} < {floor:.3g}"}
    return {"force": force, "singularity_measure_min": low, "where": None}
