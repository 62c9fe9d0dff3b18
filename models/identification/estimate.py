"""Identification of a mechanism's base parameters from sampled motion and forces, and the
physically consistent standard parameters that reproduce them.

- ``fit``: weighted least squares on the base regressor, rows (sample, axis) stacked; weights
  1 / sigma_i per axis from the residual variance of a first unweighted pass (the covariance
  inflated by the residuals' correlation between neighbouring samples); rows of an axis whose
  velocity is near zero or changes sign within the filter window are left out (the sign of
  Coulomb friction is undefined there, and the filter smears its step). Standard deviations
  from the weighted covariance, relative standard deviation = standard deviation / |value|.
  With instruments: under control, a force disturbance (the drives' force noise, unmodelled
  forces) moves the machine, so the measured accelerations in the regressor correlate with
  the equation's error and least squares shrinks the parameters they multiply (the hexapod:
  5 N of force noise against 1.9 m/s^2 of excitation, base parameters 2.2 standard deviations
  off on average). The regressor of the reference the run followed (planned before it, so free
  of its noise, and close to the measured one) is an instrument: solve Z^T W (tau - Y x) = 0
  (IDIM-IV, Janot, Vandanjon and Gautier, IEEE TCST 2014, with the reference as the
  instruments' source instead of a simulation), covariance (Z^T W Y)^-1 Z^T W Z (Y^T W Z)^-1
  times the residual variance.
- ``consistent``: standard parameters pi closest (scaled least squares) to the model's pi0
  such that beta pi equals the identified base parameters, every mass positive, every body's
  4x4 pseudo-inertia [[tr(I)/2 1 - I, m c], [(m c)^T, m]] (about the frame origin) positive
  semidefinite, friction non-negative; bodies with an idle spin (a rod between two ball
  joints) keep their shape (pi_b = k pi0_b, k > 0), so they stay idle. When no consistent set
  reproduces the estimate exactly (noise makes weakly determined base parameters unphysical),
  the minimum of its Mahalanobis distance (the metric of its covariance) plus a weak prior at
  pi0 (``PRIOR_RSD`` of each parameter's scale): a well determined base parameter follows
  the data, an undetermined one stays near the original model.
- ``write_model``: the description file with the new bodies' values and an
  ``[identification]`` table (provenance); TOML written by ``dump_toml``.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError

from .baseparams import BaseParameters
from ..kinematics.description import INERTIA_RTOL
from ..kinematics.mechanism import Mechanism
from .regressor import ACTUATOR_PARAMS, body_from_parameters


PRIOR_RSD = 1.0  # prior standard deviation of a standard parameter, relative to its scale
INERTIA_MARGIN = 1000 * INERTIA_RTOL  # written inertias this far inside the physical set (``inside``)
INSIDE = 10 * INERTIA_MARGIN  # the consistent parameters' second moments, relative to the body's m L^2


class NotExcited(UserError):
    """The data do not determine some base parameter (one line, exit 2)."""


@dataclass
class Fit:
    """Weighted least-squares estimate of the base parameters."""
    value: np.ndarray  # (r,)
    std: np.ndarray  # (r,)
    cov: np.ndarray  # (r, r)
    sigma: np.ndarray  # (s,) residual standard deviation per axis (N or N m)
    rows: int
    cond: float  # condition number of the weighted, column-scaled data matrix
    correlation: float = 1.0  # variance factor for residuals correlated between samples
    estimator: str = "least squares"
    metric: np.ndarray | None = None  # L with L L^T = cov^-1 on the fitted directions (``fixed``)
    fixed: tuple | None = None  # (C, d): combinations held at C value = d (``fit``)

    @property
    def rsd(self) -> np.ndarray:
        return self.std / np.maximum(np.abs(self.value), 1e-300)

    def mahalanobis_factor(self) -> np.ndarray:
        """L with L L^T = cov^-1: the estimate's metric (``consistent``); by eigenvalues (the
        smallest raised to 1e-14 of the largest) when the covariance is too ill-conditioned to
        invert and factor."""
        if self.metric is not None:
            return self.metric
        try:
            return np.linalg.cholesky(np.linalg.inv(self.cov + 1e-12 * np.diag(np.diag(self.cov))))
        except np.linalg.LinAlgError:
            lam, V = np.linalg.eigh(self.cov)
            return V / np.sqrt(np.maximum(lam, 1e-14 * lam.max()))


def design_rows(Yb: np.ndarray, tau: np.ndarray, keep: np.ndarray):
    """Stacked rows (A, b, axis of each row) from Y_base (n, s, r) and tau (n, s), the rows
    where ``keep`` (n, s) holds."""
    A = Yb[keep]  # rows in (sample, axis) order
    b = tau[keep]
    axis = np.nonzero(keep)[1]
    return A, b, axis


def fit(Yb: np.ndarray, tau: np.ndarray, keep: np.ndarray, labels: list[str],
        excite_rtol: float = 1e-7, Zb: np.ndarray | None = None, fixed=None) -> Fit:
    """WLS per axis on the rows where ``keep`` (n, s) holds (e.g. velocity steady in sign);
    NotExcited names the parameters the data do not determine. ``Zb`` (n, s, r): instruments,
    the regressor of the run's reference (``instrumental``); None: least squares. ``fixed``
    (C (k, r), d (k,)): combinations held at C x = d (``BaseParameters.weak`` at the model's
    values); the others are fitted, and the fixed ones get a variance beyond the data's."""
    if fixed is not None and len(fixed[0]):
        return _fit_fixed(Yb, tau, keep, excite_rtol, Zb, np.asarray(fixed[0], float), np.asarray(fixed[1], float))
    s = tau.shape[1]
    A, b, axis = design_rows(Yb, tau, keep)
    Z = None if Zb is None else Zb[keep]
    r = A.shape[1]
    if len(b) < 2 * r:
        raise NotExcited(f"too few moving samples ({len(b)} rows for {r} base parameters); record a longer run")
    norms = np.linalg.norm(A, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    sv, Vt = _svd(A / scale)
    weak = sv < excite_rtol * sv[0]
    if weak.any() or np.any(norms == 0):
        comp = np.abs(Vt[weak]).max(axis=0) if weak.any() else np.zeros(r)
        comp[norms == 0] = 1.0
        names = [labels[j] for j in np.argsort(-comp)[:max(1, int(np.sum(comp > 0.3)))]]
        raise NotExcited(f"parameter not excited by these logs: {'; '.join(names[:3])} "
                         f"({int(weak.sum() + np.sum(norms == 0))} direction(s)); "
                         f"record an exciting trajectory (pkrt identify plan)")
    x0 = _solve(A, b, Z, covariance=False)[0]
    res = b - A @ x0
    dof = max(len(b) - r, 1)
    sigma = np.array([math.sqrt(np.sum(res[axis == i] ** 2) / max(np.sum(axis == i) * dof / len(b), 1.0))
                      for i in range(s)])
    sigma = np.where(sigma > 0, sigma, max(float(sigma.max()), 1e-300))
    w = 1.0 / sigma[axis]
    Aw, bw = A * w[:, None], b * w
    x, cov1, sw = _solve(Aw, bw, None if Z is None else Z * w[:, None])
    rw = bw - Aw @ x
    s2 = float(rw @ rw) / dof
    svw = np.linalg.svd(Aw / sw, compute_uv=False)
    corr = correlation_factor(rw, keep)
    cov = corr * s2 * cov1
    # per-axis sigma after weighting (the weights rescale each axis to unit variance)
    sig = np.array([math.sqrt(np.mean(rw[axis == i] ** 2)) if np.any(axis == i) else 0.0 for i in range(s)]) * sigma
    return Fit(x, np.sqrt(np.diag(cov)), cov, sig, len(b), float(svw[0] / svw[-1]), corr,
               "least squares" if Z is None else "instrumental variables (the reference's regressor)")


def _fit_fixed(Yb, tau, keep, excite_rtol, Zb, C, d) -> Fit:
    """``fit`` with C x = d: x = x_d + N y (N the null space of C, x_d the least-norm solution),
    y fitted; the fixed directions' variance 100 times the largest fitted one (reported: not
    determined by the data); the metric on the fitted directions, the fixed ones a constraint
    of the consistent parameters."""
    x_d = np.linalg.lstsq(C, d, rcond=None)[0]
    N = np.linalg.svd(C)[2][len(C):].T  # (r, r - k)
    Q = np.linalg.qr(C.T)[0]  # (r, k): the fixed directions
    off = np.einsum("nsr,r->ns", Yb, x_d)
    yb = np.einsum("nsr,rq->nsq", Yb, N)
    zb = None if Zb is None else np.einsum("nsr,rq->nsq", Zb, N)
    names = [f"combination {i + 1} of the base parameters" for i in range(N.shape[1])]
    f = fit(yb, tau - off, keep, names, excite_rtol, zb)
    cov = N @ f.cov @ N.T
    cov += 100.0 * max(float(np.diag(cov).max()), 1e-300) * (Q @ Q.T)
    return Fit(x_d + N @ f.value, np.sqrt(np.diag(cov)), cov, f.sigma, f.rows, f.cond, f.correlation, f.estimator,
               N @ f.mahalanobis_factor(), (C, d))


def _solve(A: np.ndarray, b: np.ndarray, Z: np.ndarray | None, covariance: bool = True,
           rtol: float = 1e-7):
    """x minimising |b - A x| (Z None), or solving Z^T (b - A x) = 0 (instruments Z); and (with
    ``covariance``, else None) the covariance of x per unit residual variance, (A^T A)^-1 or
    (Z^T A)^-1 Z^T Z (A^T Z)^-1; columns scaled to unit norm (returned: the scale).

    The instruments' equations go through Z = Q R: Z^T (b - A x) = 0 is G x = Q^T b with
    G = Q^T A, and the covariance (G^T G)^-1, so the condition number is G's, about A's, not
    the square of it that forming Z^T A gives (a calibrated Delta's 3.8e6 became 1.4e13).
    Refused in one line when Z or G has a direction below ``rtol`` of its largest (as least
    squares refuses A's): the reference does not determine what the motion does."""
    sc = np.linalg.norm(A, axis=0)
    sc = np.where(sc > 0, sc, 1.0)
    As = A / sc
    if Z is None:
        x = np.linalg.lstsq(As, b, rcond=None)[0]
        if not covariance:
            return x / sc, None, sc
        Ainv = np.linalg.pinv(As)
        return x / sc, (Ainv @ Ainv.T) / np.outer(sc, sc), sc
    Zs = Z / sc
    Q, R = np.linalg.qr(Zs) if np.all(np.isfinite(Zs)) else (None, None)
    G = None if Q is None else Q.T @ As
    if G is None or not np.all(np.isfinite(G)) or _cond(R) * rtol > 1 or _cond(G) * rtol > 1:
        raise NotExcited("the reference in these logs does not follow the measured motion (its regressor and the "
                         "measured one are not related); identify by least squares (--estimator ls)")
    Gi = np.linalg.inv(G)
    x = Gi @ (Q.T @ b)
    return x / sc, (Gi @ Gi.T) / np.outer(sc, sc) if covariance else None, sc


def _cond(M: np.ndarray) -> float:
    """The 2-norm condition number (inf when singular)."""
    sv = np.linalg.svd(M, compute_uv=False)
    return float(sv[0] / sv[-1]) if sv[-1] > 0 else math.inf


def correlation_factor(rw: np.ndarray, keep: np.ndarray, max_lag: int = 8) -> float:
    """Variance inflation of a mean over residuals correlated in time (filtered noise is, when
    samples are closer than the filter window): 1 + 2 sum_l rho_l over the lags l while the
    residuals' autocorrelation rho_l (per axis, pooled, samples in time order) stays positive;
    at least 1. ``rw``: the weighted residuals of the kept rows in (sample, axis) order."""
    n, s = keep.shape
    full = np.full((n, s), np.nan)
    full[keep] = rw
    num = np.zeros(max_lag + 1)
    den = np.zeros(max_lag + 1)
    for lag in range(max_lag + 1):
        a, b = full[:n - lag], full[lag:]
        ok = np.isfinite(a) & np.isfinite(b)
        num[lag] = np.sum(a[ok] * b[ok])
        den[lag] = np.count_nonzero(ok)
    if den[0] == 0 or num[0] <= 0:
        return 1.0
    rho = (num / np.maximum(den, 1)) / (num[0] / den[0])
    f = 1.0
    for lag in range(1, max_lag + 1):
        if rho[lag] <= 0 or den[lag] < 10:
            break
        f += 2 * rho[lag]
    return float(f)


def _svd(M: np.ndarray):
    _, sv, Vt = np.linalg.svd(M, full_matrices=False)
    return sv, Vt


def _pseudo_inertia(p):
    """4x4 pseudo-inertia (cvxpy expression) of 10 parameters about the frame origin."""
    import cvxpy as cp

    m, h = p[0], p[1:4]
    I = cp.bmat([[p[4], p[5], p[6]], [p[5], p[7], p[8]], [p[6], p[8], p[9]]])
    Sigma = 0.5 * cp.trace(I) * np.eye(3) - I
    return cp.bmat([[Sigma, cp.reshape(h, (3, 1), order="F")], [cp.reshape(h, (1, 3), order="F"), cp.reshape(m, (1, 1), order="F")]])


def consistent(mech: Mechanism, bp: BaseParameters, est: Fit, pi0: np.ndarray) -> tuple[np.ndarray, dict]:
    """Physically consistent standard parameters reproducing the estimate (see the module)."""
    import cvxpy as cp

    nb, s = mech.n_bodies, mech.n_act
    p = len(pi0)
    scale = np.empty(p)
    for b in range(nb):  # per body: kg, kg m, kg m^2 scales from its own values
        q = pi0[10 * b:10 * b + 10]
        m = max(q[0], 1e-6)
        L = max(math.sqrt(max(q[4] + q[7] + q[9], 1e-12) / m), 1e-3)
        scale[10 * b:10 * b + 10] = np.r_[m, [m * L] * 3, [m * L * L] * 6]
    fr = np.abs(pi0[10 * nb:])
    fscale = np.maximum(fr, np.maximum(np.abs(est.value).max() * 1e-3, 1e-3))
    scale[10 * nb:] = fscale
    x = cp.Variable(p)
    cons = []
    idle = {f.body for f in mech.idle}
    kept = kept_parameters(mech, bp)
    for b, name in enumerate(mech.body_names):
        q = x[10 * b:10 * b + 10]
        if name in idle:
            k = cp.Variable(nonneg=True)
            cons.append(q == k * pi0[10 * b:10 * b + 10])
        else:
            # strictly inside the physical set (principal second moments >= INSIDE of the body's
            # m L^2), so that ``inside`` leaves the result as it is and the kept values stay exact
            inner = np.diag([INSIDE * scale[10 * b + 4]] * 3 + [0.0])
            cons += [q[0] >= 1e-6 * scale[10 * b], _pseudo_inertia(q) >> inner]
            own = kept.get(name, [])
            if own:  # no effect on the forces: the original values, not wherever the solver leaves them
                cons.append(x[own] == pi0[own])
    for a in range(s):
        cons += [x[10 * nb + 3 * a] >= 0, x[10 * nb + 3 * a + 1] >= 0]  # viscous, Coulomb
    dev = cp.multiply(x - pi0, 1.0 / scale)
    if est.fixed is not None:  # combinations no motion can determine: the model's
        C, d = est.fixed
        cons.append(C @ (bp.beta @ x) == d)
    exact = cp.Problem(cp.Minimize(cp.sum_squares(dev)), cons + [bp.beta @ x == est.value])
    info = {"solver": "CLARABEL",
            "kept_at_original": {b: [bp.names[j].split(".", 1)[1] for j in js] for b, js in kept.items()},
            "bodies_kept_at_original": [b for b, js in kept.items() if len(js) == 10]}
    try:
        exact.solve(solver=cp.CLARABEL)
    except cp.error.SolverError:
        pass
    if exact.status in ("optimal", "optimal_inaccurate"):
        info["reproduces_estimate"] = True
        info["mahalanobis"] = 0.0
    else:  # the estimate is not physical (noise makes weakly determined base parameters so):
        # the estimate's own metric (Mahalanobis) plus a weak prior at pi0 (relative standard
        # deviation PRIOR_RSD of each parameter's scale): the data decide the well determined
        # directions, the original values the others
        L = est.mahalanobis_factor()
        maha = cp.sum_squares(L.T @ (bp.beta @ x - est.value))
        prob = cp.Problem(cp.Minimize(maha + cp.sum_squares(dev) / PRIOR_RSD ** 2), cons)
        try:
            prob.solve(solver=cp.CLARABEL)
        except cp.error.SolverError:
            pass  # its status says so below
        if prob.status not in ("optimal", "optimal_inaccurate"):
            raise UserError(f"no physically consistent parameters found (solver status {prob.status})")
        info["reproduces_estimate"] = False
        info["mahalanobis"] = float(math.sqrt(max(float(maha.value), 0.0)))
    pi = np.asarray(x.value, float)
    for js in kept.values():
        pi[js] = pi0[js]  # exactly (the solver meets equalities to its tolerance)
    for b, name in enumerate(mech.body_names):  # an idle spin's body: its original shape, scaled exactly
        if name in idle and pi0[10 * b] > 0:  # (a rod's zero moment about its axis stays zero, not
            pi[10 * b:10 * b + 10] = pi[10 * b] / pi0[10 * b] * pi0[10 * b:10 * b + 10]  # 1e-11 of noise)
    dev_std = np.abs(bp.beta @ pi - est.value) / np.maximum(est.std, 1e-300)
    well = est.rsd < 0.05
    info["max_base_error_in_std"] = float(dev_std.max())
    info["max_base_error_in_std_rsd_below_5pct"] = float(dev_std[well].max()) if well.any() else None
    return pi, info


def kept_parameters(mech: Mechanism, bp: BaseParameters) -> dict[str, list[int]]:
    """Per body (not one with an idle spin, which keeps its shape) the indices of its standard
    parameters that have no effect on the actuator forces (``bp.zero``): the consistent
    parameters keep their original values there."""
    idle = {f.body for f in mech.idle}
    zero = set(int(j) for j in bp.zero)
    out = {}
    for b, name in enumerate(mech.body_names):
        js = [j for j in range(10 * b, 10 * b + 10) if j in zero]
        if js and name not in idle:
            out[name] = js
    return out


# -- writing ---------------------------------------------------------------------------------
def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, np.ndarray):
        return _toml_value(v.tolist())
    if isinstance(v, np.generic):
        return _toml_value(v.item())
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def dump_toml(doc: dict, comment: str = "") -> str:
    """TOML text of a document of tables, arrays of tables and plain values (one level of
    tables; deeper tables inline)."""
    out = [f"# {ln}" for ln in comment.splitlines()]
    plain = {k: v for k, v in doc.items() if not isinstance(v, dict) and not _is_table_list(v)}
    for k, v in plain.items():
        out.append(f"{_key(k)} = {_toml_value(v)}")
    for k, v in doc.items():
        if isinstance(v, dict):
            out += ["", f"[{_key(k)}]"] + [f"{_key(a)} = {_toml_value(b)}" for a, b in v.items()]
        elif _is_table_list(v):
            for t in v:
                out += ["", f"[[{_key(k)}]]"] + [f"{_key(a)} = {_toml_value(b)}" for a, b in t.items()]
    return "\n".join(out) + "\n"


def _is_table_list(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _clean(x: float, scale: float) -> float:
    """Round off solver noise far below the scale (12 significant digits of it)."""
    return float(round(x / scale, 12) * scale) if scale > 0 else float(x)


def inside(I: np.ndarray, margin: float = INERTIA_MARGIN) -> np.ndarray:
    """An inertia about the centre of mass (3x3) moved just inside the physical set: its
    principal second moments sigma_i = tr(I)/2 - I_i (the mass distribution's extent along
    each principal axis; >= 0 is the triangle inequality of the moments) raised to at least
    ``margin`` of the largest (a body at the boundary -- a slender rod's zero moment, or the
    solver's 1e-8 of infeasibility -- comes out ``margin`` inside it, so the file's rounded
    numbers pass the loader's check, ``INERTIA_RTOL``); an inertia already inside is returned
    as it is."""
    ev, V = np.linalg.eigh(0.5 * (I + I.T))
    sigma = 0.5 * ev.sum() - ev
    floor = margin * max(float(sigma.max()), 1e-300)
    if sigma.min() >= floor:
        return I
    sigma = np.maximum(sigma, floor)
    return (V * (sigma.sum() - sigma)) @ V.T


def body_values(pi: np.ndarray, nb: int, moved_inside=()) -> list[tuple[float, list[float], list[list[float]]]]:
    """(mass, com, inertia about the centre of mass as a 3x3 list) per body; the inertias of
    the bodies in ``moved_inside`` (indices) ``inside`` the physical set."""
    out = []
    for b in range(nb):
        m, c, I = body_from_parameters(pi[10 * b:10 * b + 10])
        if b in moved_inside:
            I = inside(I)
        Is = max(float(np.abs(I).max()), 1e-300)
        out.append((_clean(m, m), [_clean(x, max(np.abs(c).max(), 1e-300)) for x in c],
                    [[_clean(I[i, j], Is) for j in range(3)] for i in range(3)]))
    return out


def write_model(mech: Mechanism, pi: np.ndarray, path: str, provenance: dict, keep=()) -> str:
    """The description file with the identified bodies and ``[identification]``; returns its
    text. The bodies whose indices are in ``keep`` (none of their parameters acts on the
    forces) keep the original file's values as written there; the inertias of the others but
    those with an idle spin (zero inertia about its axis, kept by their shape) are moved
    ``inside`` the physical set, so that the loader accepts the written numbers."""
    src = mech.description.path
    doc = tomllib.loads(Path(src).read_text(encoding="utf-8"))
    idle = {f.body for f in mech.idle}
    vals = body_values(pi, mech.n_bodies, [b for b, n in enumerate(mech.body_names) if n not in idle])
    for k, (b, (m, c, I)) in enumerate(zip(doc["bodies"], vals)):
        if k not in keep:
            b["mass"], b["com"], b["inertia"] = m, c, I
    doc["identification"] = provenance
    text = dump_toml(doc, f"{mech.name}: masses, centres of mass and inertias identified by pkrt identify\n"
                          f"from {src}; provenance in [identification].")
    Path(path).write_text(text, encoding="utf-8")
    return text


def friction_values(pi: np.ndarray, nb: int, s: int) -> dict[str, list[float]]:
    """viscous, coulomb, offset per actuator."""
    f = pi[10 * nb:].reshape(s, 3)
    return {k: [float(x) for x in f[:, i]] for i, k in enumerate(ACTUATOR_PARAMS)}


__all__ = ["Fit", "NotExcited", "body_values", "consistent", "design_rows", "dump_toml", "fit",
           "friction_values", "write_model"]
