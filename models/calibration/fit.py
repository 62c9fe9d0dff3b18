"""The fit: the base parameters and the instrument's pose that best explain the readings.

Weighted nonlinear least squares (scipy ``least_squares``, trust-region reflective: the bounded
method of the Levenberg-Marquardt family) on the readings' residuals divided by the
instrument's standard deviations, with the exact Jacobian (``jacobian``) and bounds on every
parameter: each geometric one within ``Bounds`` of the description's value (a physically absurd
fit, a 217 mm rod found 234 mm, cannot happen silently: a fit that ends on a bound is refused,
naming the parameter), the instrument's pose within ``Bounds.tracker_*`` of where the first
registration put it. The instrument's pose starts from the rigid registration (Kabsch) of its
readings onto the description's tool positions. Parameters outside the base set keep the
description's values. Standard deviations come from the Jacobian at the solution and the
stated noise, inflated by the residual's chi-square per degree of freedom when above 1.

Refused in one line before fitting: too few readings for the base parameters, a base parameter
that the measured poses do not excite (its column dependent on the others, or its standard
deviation beyond its bound). Units: m, rad.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg
from scipy.optimize import least_squares

from pkrt.rt.core.errors import UserError

from ..kinematics.description import rotation_from_vector
from .identifiability import TOL, BaseSet
from .jacobian import Frame, PoseModel, register, residual_jacobian, residuals
from .problem import Problem


class CalibrationInputError(UserError):
    """Readings that cannot calibrate this machine (one line, exit 2)."""


@dataclass(frozen=True)
class Readings:
    """What the instrument read at actuator configurations ``theta`` (N, s): positions (N, 3,
    m) and, when it measures them, tool frames (N, 3, 3), all in its own frame."""
    theta: np.ndarray
    position: np.ndarray
    rotation: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.theta)

    def subset(self, idx) -> "Readings":
        return Readings(self.theta[idx], self.position[idx], None if self.rotation is None else self.rotation[idx])


@dataclass(frozen=True)
class Bounds:
    """How far a parameter may move from the description's value: lengths (m), angles (rad),
    scales (1); the instrument's pose from its first registration (m, rad)."""
    length: float = 5e-3
    angle: float = 20e-3
    scale: float = 0.02
    tracker_length: float = 0.05
    tracker_angle: float = 0.05

    def of(self, units: list[str], tracker: np.ndarray) -> np.ndarray:
        out = np.array([{"m": self.length, "rad": self.angle, "1": self.scale}[u] for u in units])
        out[tracker[:3]], out[tracker[3:]] = self.tracker_angle, self.tracker_length
        return out


@dataclass
class Fit:
    """A calibration: ``delta`` (the geometric parameters' change, zero outside the base set),
    the instrument's pose ``frame``, the base parameters' estimates and standard deviations
    (their units), the residuals (N, m) of the fit's readings with the description (its own
    instrument pose ``frame_cad``) and with the fit, chi-square, degrees of freedom."""
    base: BaseSet
    delta: np.ndarray
    frame: Frame
    frame_cad: Frame
    value: np.ndarray
    std: np.ndarray
    residual: np.ndarray
    residual_cad: np.ndarray
    chi2: float
    dof: int
    evaluations: int
    at_bound: list[int]


class _Objective:
    """Residuals (whitened) and their Jacobian as functions of the scaled base parameters x."""

    def __init__(self, problem: Problem, cols: np.ndarray, model: PoseModel, readings: Readings, frame0: Frame):
        self.p, self.cols, self.model, self.r, self.frame0 = problem, cols, model, readings, frame0
        self.geo = cols < problem.n_geo

    def split(self, x) -> tuple[np.ndarray, np.ndarray, Frame]:
        p = self.p
        v = np.asarray(x, float) * p.scale[self.cols]
        delta, inc = np.zeros(p.n_geo), np.zeros(6)
        delta[self.cols[self.geo]] = v[self.geo]
        inc[self.cols[~self.geo] - p.n_geo] = v[~self.geo]
        frame = Frame(rotation_from_vector(inc[:3]) @ self.frame0.R, self.frame0.t + inc[3:])
        return delta, inc, frame

    def residuals(self, x) -> np.ndarray:
        delta, _, frame = self.split(x)
        P, Rt = self.model.poses(delta)
        return (residuals(P, Rt, frame, self.r.position, self.r.rotation, self.p.orientation) / self.p.sigma).ravel()

    def jacobian(self, x) -> np.ndarray:
        delta, inc, frame = self.split(x)
        P, Rt, J = self.model.jacobian(delta)
        Jg, Jf = residual_jacobian(P, Rt, J, frame, self.r.rotation, self.p.orientation, inc[:3])
        A = np.concatenate([Jg, Jf], axis=2)[:, :, self.cols] * self.p.scale[self.cols] / self.p.sigma[None, :, None]
        return A.reshape(-1, len(self.cols))


def calibrate(problem: Problem, base: BaseSet, readings: Readings, bounds: Bounds = Bounds()) -> Fit:
    """Fit the base parameters and the instrument's pose to ``readings``."""
    p = problem
    cols = base.base
    if readings.n * p.m <= len(cols):
        need = len(cols) // p.m + 1
        raise CalibrationInputError(
            f"too few poses: {readings.n} readings of {p.m} coordinates for {len(cols)} base parameters "
            f"(with the instrument's pose); measure at least {need} poses for the fit")
    model = PoseModel(p.params, readings.theta)
    P0, _ = model.poses(np.zeros(p.n_geo))
    frame0 = register(P0, readings.position)
    width = bounds.of(p.units, p.tracker)[cols] / p.scale[cols]
    obj = _Objective(p, cols, model, readings, frame0)
    _check_excited(obj, width, p.names)
    # the description as it is, with the instrument's pose fitted: the residual before
    trk = np.flatnonzero(~obj.geo)
    cad = _Objective(p, cols[trk], model, readings, frame0)
    r_cad = least_squares(cad.residuals, np.zeros(len(trk)), jac=cad.jacobian, method="trf",
                          bounds=(-width[trk], width[trk]), xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=30)
    frame_cad = cad.split(r_cad.x)[2]
    res_cad = cad.residuals(r_cad.x).reshape(readings.n, p.m) * p.sigma
    # from there (x = 0: scipy's first trust region is |x0|, or 1 at x0 = 0), the instrument's
    # bounds about the first registration
    obj = _Objective(p, cols, model, readings, frame_cad)
    lo, hi = -width.copy(), width.copy()
    lo[trk], hi[trk] = -width[trk] - r_cad.x, width[trk] - r_cad.x
    sol = least_squares(obj.residuals, np.zeros(len(cols)), jac=obj.jacobian, method="trf", bounds=(lo, hi),
                        xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=60)
    delta, _, frame = obj.split(sol.x)
    r = obj.residuals(sol.x)
    A = obj.jacobian(sol.x)
    dof = len(r) - len(cols)
    chi2 = float(r @ r)
    cov = np.linalg.inv(A.T @ A) * max(1.0, chi2 / dof)
    std = np.sqrt(np.diag(cov)) * p.scale[cols]
    near = np.minimum(sol.x - lo, hi - sol.x) <= 1e-6 * width
    at_bound = [int(cols[i]) for i in np.flatnonzero((sol.active_mask != 0) | near)]
    value = sol.x * p.scale[cols]
    return Fit(base, delta, frame, frame_cad, value, std, r.reshape(readings.n, p.m) * p.sigma, res_cad, chi2, dof,
               int(sol.nfev), at_bound)


def _check_excited(obj: _Objective, width: np.ndarray, names: list[str]) -> None:
    """Refuse a base parameter the poses do not excite: its scaled column dependent on the
    others (pivoted QR), or its standard deviation wider than its bound."""
    A = obj.jacobian(np.zeros(len(obj.cols)))
    norms = np.linalg.norm(A, axis=0)
    if norms.min() == 0:
        j = int(np.argmin(norms))
        raise CalibrationInputError(f"no pose excites parameter {names[obj.cols[j]]} (it does not move the tool at "
                                    f"any measured pose); measure other poses (pkrt calibrate plan)")
    _, r, piv = scipy.linalg.qr(A / norms, mode="economic", pivoting=True)
    d = np.abs(np.diag(r))
    if d[-1] <= TOL:
        j = int(piv[np.flatnonzero(d <= TOL)[0]])
        raise CalibrationInputError(f"no pose excites parameter {names[obj.cols[j]]} apart from the others (the "
                                    f"measured poses cannot tell it apart); measure other poses (pkrt calibrate plan)")
    std = np.sqrt(np.diag(np.linalg.inv(A.T @ A)))
    bad = np.flatnonzero(std > width)
    if len(bad):
        j = int(bad[np.argmax(std[bad] / width[bad])])
        raise CalibrationInputError(
            f"the measured poses hardly excite parameter {names[obj.cols[j]]}: its standard deviation would be "
            f"{std[j] / width[j]:.3g} times its bound; measure more or other poses (pkrt calibrate plan)")


def predicted(problem: Problem, delta, frame: Frame, readings: Readings) -> np.ndarray:
    """Residuals (N, m) of ``readings`` with the geometry ``delta`` and the instrument at ``frame``."""
    P, Rt = PoseModel(problem.params, readings.theta).poses(delta)
    return residuals(P, Rt, frame, readings.position, readings.rotation, problem.orientation)


def rms(res: np.ndarray) -> dict:
    """RMS per coordinate of residuals (N, m): position (m), orientation (rad, when measured)."""
    out = {"position_m": float(math.sqrt(np.mean(res[:, :3] ** 2)))}
    if res.shape[1] > 3:
        out["orientation_rad"] = float(math.sqrt(np.mean(res[:, 3:] ** 2)))
    return out
