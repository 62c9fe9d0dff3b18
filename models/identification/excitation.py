"""Exciting trajectories for identification: a finite Fourier series per actuator,

    theta_i(t) = c_i + sum_k (a_ik / (k w)) sin(k w t) - (b_ik / (k w)) cos(k w t),  w = 2 pi f0,

periodic (period 1 / f0; by default the frequency at which the positions' full range also
reaches the velocity or acceleration limit, so that the masses, seen through the
accelerations, are excited as hard as the limits allow), starting and ending at rest (sum_k a_ik = 0 and sum_k k b_ik = 0 are
imposed by construction), whose coefficients minimise the condition number of the base
regressor stacked over one period with its columns scaled to unit norm (the scaling of
``pkrt identify``'s fit), under position limits (ranges shrunk by a margin), velocity and
acceleration limits, force limits (the model's forces with its friction) and a margin from
singularities (the singularity measure above ``singular_margin`` times the model's threshold).
Limits enter the optimisation as penalties on a coarse grid; the result is then checked on a
dense resample (``check_rate`` Hz over one period: positions, velocities and accelerations in
closed form, forces from the machine's tree, the singularity measure from the exact model at
200 Hz, the passive joints' limits and the bodies' clearances where the description has them,
as ``pkrt run`` checks a trajectory) and shrunk in amplitude until every limit holds there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.errors import UserError

from .baseparams import BaseParameters
from ..kinematics.mechanism import AssemblyError, Mechanism
from ..kinematics.passive import PathCheck, compile_passive
from ..reduction.exact import ExactModel
from .regressor import Regressor


@dataclass(frozen=True)
class Limits:
    """Per-axis limits (SI, actuator units)."""
    lo: np.ndarray
    hi: np.ndarray
    velocity: np.ndarray
    acceleration: np.ndarray
    force: np.ndarray


@dataclass
class Fourier:
    """Coefficients a, b (s, K) in velocity units and offsets c (s)."""
    f0: float
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray

    def sample(self, t: np.ndarray):
        """theta, theta_dot, theta_ddot (n, s) at times t (s)."""
        K = self.a.shape[1]
        w = 2 * math.pi * self.f0
        k = np.arange(1, K + 1)
        ph = np.outer(t, k) * w  # (n, K)
        sn, cs = np.sin(ph), np.cos(ph)
        a, b = self.a, self.b
        th = self.c[None, :] + sn @ (a / (k * w)).T - cs @ (b / (k * w)).T
        td = cs @ a.T + sn @ b.T
        tdd = -sn @ (a * k * w).T + cs @ (b * k * w).T
        return th, td, tdd


def _rest(x: np.ndarray, K: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """a, b (s, K) from free coefficients (s, 2 (K - 1)): the last a_iK and b_iK make the
    start a rest (sum a = 0, sum k b = 0)."""
    x = x.reshape(s, 2, K - 1)
    a = np.c_[x[:, 0], -x[:, 0].sum(axis=1)]
    k = np.arange(1, K)
    b = np.c_[x[:, 1], -(x[:, 1] * k).sum(axis=1) / K]
    return a, b


def scaled_condition(Yb: np.ndarray) -> float:
    """Condition number of the stacked base regressor (rows, r) with unit-norm columns."""
    n = np.linalg.norm(Yb, axis=0)
    if np.any(n == 0):
        return math.inf
    sv = np.linalg.svd(Yb / n, compute_uv=False)
    return float(sv[0] / sv[-1]) if sv[-1] > 0 else math.inf


def balanced_f0(x: np.ndarray, K: int, s: int, half: np.ndarray, limits: Limits) -> float:
    """The base frequency (Hz) at which the shape x (free coefficients, velocity units),
    scaled to use its position range fully, also reaches its velocity or its acceleration
    limit. Per unit of x at f0 = 1 Hz, positions scale as 1 / f0, velocities not, accelerations
    as f0: below this frequency the positions alone bound the amplitude (the accelerations,
    which determine the masses, stay far below their limit); above it the positions shrink."""
    a, b = _rest(x, K, s)
    fo = Fourier(1.0, a, b, np.zeros(s))
    th, td, tdd = fo.sample(np.arange(64 * K) / (64 * K))
    P = float(np.max(np.abs(th) / half))
    V = float(np.max(np.abs(td) / limits.velocity))
    A = float(np.max(np.abs(tdd) / limits.acceleration))
    return min(P / V, math.sqrt(P / A))


def plan_excitation(mech: Mechanism, bp: BaseParameters, limits: Limits, pi0: np.ndarray, tree, **options
                    ) -> tuple[Fourier, dict]:
    """The exciting trajectory and its figures (condition number, peaks against limits); see
    ``_plan`` for the options. BLAS runs on one thread: its matrices (a few hundred rows) are
    far too small for threads, which on a loaded machine made each SVD 60 times slower."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        return _plan(mech, bp, limits, pi0, tree, **options)


def _plan(mech: Mechanism, bp: BaseParameters, limits: Limits, pi0: np.ndarray, tree, *,
                    f0: float | None = None, harmonics: int = 5, margin: float = 0.05, singular_margin: float = 3.0,
                    samples: int = 80, iterations: int = 150, seed: int = 0, check_rate: float = 10000.0,
                    starts: int = 4) -> tuple[Fourier, dict]:
    from scipy.optimize import minimize

    s, K = mech.n_act, harmonics
    rng = np.random.default_rng(seed)
    lo, hi = limits.lo, limits.hi
    w = hi - lo
    plo, phi = lo + margin * w, hi - margin * w
    c = 0.5 * (plo + phi)
    half = 0.5 * (phi - plo)
    x_starts = [rng.normal(size=s * 2 * (K - 1)) for _ in range(starts)]
    f0_auto = f0 is None
    if f0_auto:  # the median over the random starts, to 2 significant digits
        f0 = float(f"{np.median([balanced_f0(x, K, s, half, limits) for x in x_starts]):.2g}")
    T = 1.0 / f0
    t_opt = np.arange(samples) * T / samples
    reg = Regressor(mech)
    exact = ExactModel(mech)
    protection = compile_passive(mech)  # passive joints' limits and capsules, where the model has them
    passive = PathCheck(mech, protection) if protection is not None else None
    thresh = singular_margin * mech.description.singular_threshold
    # the amplitude scale of the free coefficients: positions reach about half the range
    x_scale = half.repeat(2 * (K - 1)) * 2 * math.pi * f0

    t_fit = np.arange(8 * K * 4) * T / (8 * K * 4)

    def traj(x):
        """The shape x scaled so that its largest position, velocity or acceleration use on
        a fine grid is 95 % of its limit (the optimiser searches shapes, not sizes)."""
        a, b = _rest(x * x_scale, K, s)
        fo = Fourier(f0, a, b, c.copy())
        th, td, tdd = fo.sample(t_fit)
        use = max(float(np.max(np.abs(th - c) / half)), float(np.max(np.abs(td) / limits.velocity)),
                  float(np.max(np.abs(tdd) / limits.acceleration)), 1e-12)
        return Fourier(f0, a * 0.95 / use, b * 0.95 / use, c.copy())

    def violation(th, td, tdd):
        v = np.maximum(th - phi, 0) / w + np.maximum(plo - th, 0) / w
        v = v.sum() + (np.maximum(np.abs(td) - limits.velocity, 0) / limits.velocity).sum()
        return v + (np.maximum(np.abs(tdd) - limits.acceleration, 0) / limits.acceleration).sum()

    def cost(x):
        th, td, tdd = traj(x).sample(t_opt)
        pen = violation(th, td, tdd)
        if pen > 0:
            return 1e3 * (1 + pen)
        try:
            reg.assembler.reset()
            Y = reg.batch(th, td, tdd)
        except (AssemblyError, UserError):
            return 1e3
        tau = Y @ pi0
        fpen = (np.maximum(np.abs(tau) - limits.force, 0) / limits.force).sum()
        return math.log10(scaled_condition(Y[:, :, bp.base].reshape(-1, bp.n_base))) + 10 * fpen

    best_x, best_c = None, math.inf
    for x0 in x_starts:
        cc = cost(x0)
        if cc < best_c:
            best_x, best_c = x0, cc
    res = minimize(cost, best_x, method="Powell", options={"maxfev": iterations, "xtol": 1e-2, "ftol": 1e-3})
    x = res.x if res.fun < best_c else best_x
    fo = traj(x)
    # dense check over one period; shrink the amplitude (about the centre) until it holds
    t_chk = np.arange(int(round(T * check_rate))) / check_rate
    shrink = 1.0
    for _ in range(30):
        th, td, tdd = fo.sample(t_chk)
        report = _check(mech, exact, fo, th, td, tdd, limits, plo, phi, pi0, thresh, check_rate, tree, passive)
        if report["ok"]:
            break
        fo = Fourier(f0, fo.a * 0.9, fo.b * 0.9, fo.c)
        shrink *= 0.9
    else:
        raise UserError(f"{mech.name}: no exciting trajectory meets the limits (shrunk to {shrink:.3g})")
    th, td, tdd = fo.sample(t_opt)
    reg.assembler.reset()
    Y = reg.batch(th, td, tdd)
    report.update({"condition_number": scaled_condition(Y[:, :, bp.base].reshape(-1, bp.n_base)),
                   "condition_scaling": "base regressor columns scaled to unit norm, "
                                        f"{samples} states over one period",
                   "period_s": T, "f0_hz": f0, "f0_from": "balanced" if f0_auto else "given",
                   "harmonics": K, "amplitude_shrink": shrink,
                   "optimizer": {"method": "Powell", "evaluations": int(res.nfev), "start_cost": float(best_c),
                                 "final_cost": float(min(res.fun, best_c))}})
    return fo, report


def _check(mech, exact, fo, th, td, tdd, limits, plo, phi, pi0, thresh, rate, tree, passive=None,
           sing_rate=200.0) -> dict:
    """Every limit at every dense sample: positions, velocities, accelerations in closed form;
    forces (H thetadd + D [td td] - p_ext from the machine's tree, which also marks where it is
    out of its domain, plus the friction of pi0); the singularity measure from the exact model
    at ``sing_rate`` Hz; the passive joints' limits and the capsules' clearances (``passive``, a
    ``PathCheck``) as ``pkrt run`` checks a trajectory."""
    from pkrt.rt.core.tree import OUT_OF_DOMAIN, eval_tau

    s = mech.n_act
    fr = pi0[10 * mech.n_bodies:].reshape(s, 3)
    H, D, p = np.zeros((s, s)), np.zeros((s, s * (s + 1) // 2)), np.zeros(s)
    tau = np.empty_like(th)
    T = tree.arrays
    for k in range(len(th)):
        if eval_tau(T, th[k], td[k], tdd[k], H, D, p, tau[k]) == OUT_OF_DOMAIN:
            return {"ok": False, "why": f"out of the tree's domain at theta = {th[k].tolist()}"}
    tau += fr[:, 0] * td + fr[:, 1] * np.tanh(td / 1e-3) + fr[:, 2]
    exact.assembler.reset()
    step = max(1, int(round(rate / sing_rate)))
    sing = []
    try:
        for k in range(0, len(th), step):
            sing.append(mech.singularity_measure(exact.assembler.solve(th[k]), th[k]))
    except (AssemblyError, UserError) as e:
        return {"ok": False, "why": str(e)}
    sing = np.array(sing)
    if passive is not None and (v := passive.first_violation(th)) is not None:
        k, item, margin = v
        return {"ok": False, "why": f"at t = {k / rate:.4f} s " + (passive.passive.value(item, margin) if item >= 0
                                                                  else "outside the workspace")}
    peaks = {"position_min": th.min(axis=0).tolist(), "position_max": th.max(axis=0).tolist(),
             "velocity": np.abs(td).max(axis=0).tolist(), "acceleration": np.abs(tdd).max(axis=0).tolist(),
             "force": np.abs(tau).max(axis=0).tolist(), "singularity_measure_min": float(sing.min())}
    ok = (np.all(th >= plo - 1e-12) and np.all(th <= phi + 1e-12)
          and np.all(np.abs(td) <= limits.velocity) and np.all(np.abs(tdd) <= limits.acceleration)
          and np.all(np.abs(tau) <= limits.force) and sing.min() >= thresh)
    return {"ok": bool(ok), "checked_at_hz": rate, "checked_samples": len(th), "peaks": peaks,
            "singularity_checked_at_hz": rate / step, "forces_from": "the machine's tree",
            "limits": {"position": [plo.tolist(), phi.tolist()], "velocity": limits.velocity.tolist(),
                       "acceleration": limits.acceleration.tolist(), "force": limits.force.tolist(),
                       "singularity_measure": thresh}}


def write_csv(path: str, fo: Fourier, names: list[str], periods: int, rate: float = 1000.0) -> int:
    """``t`` and one column per actuator at ``rate`` over whole periods (pkrt run --traj)."""
    t = np.arange(int(round(periods / fo.f0 * rate)) + 1) / rate
    th = fo.sample(t)[0]
    with open(path, "w") as f:
        f.write("t," + ",".join(names) + "\n")
        for k in range(len(t)):
            f.write(f"{t[k]:.6f}," + ",".join(f"{x:.9f}" for x in th[k]) + "\n")
    return len(t)


__all__ = ["Fourier", "Limits", "plan_excitation", "scaled_condition", "write_csv"]
