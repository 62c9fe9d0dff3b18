"""A calibration problem: a machine's geometric parameters, the instrument's pose, what the
instrument reads (the tool's position, and its orientation when it measures one) and its noise.
Its identification Jacobian is whitened (rows divided by the instrument's standard deviation)
and scaled (columns times each parameter's prior size: 0.5 mm, 2 mrad, 2e-3 of scale; the
instrument's pose 1 mm and 1 mrad), so that every entry is "standard deviations of the reading
per typical error": the matrix the base set, the observability index and the pose selection
judge. Units: m, rad."""

from __future__ import annotations

import numpy as np

from ..kinematics.mechanism import Mechanism
from .identifiability import BaseSet, base_set
from .jacobian import Frame, PoseModel, residual_jacobian
from .parameters import GeometricParameters

TRACKER = ("tracker.rx", "tracker.ry", "tracker.rz", "tracker.x", "tracker.y", "tracker.z")
TRACKER_PRIOR = np.array([1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3])
TRACKER_UNITS = ("rad", "rad", "rad", "m", "m", "m")


class Problem:
    """``mech``'s geometry and an instrument reading positions (and orientations when
    ``orientation``) with standard deviations ``sigma_position`` (m) and ``sigma_orientation``
    (rad) per coordinate. Parameters: the geometric ones (``GeometricParameters``), then the
    instrument's pose increments (``TRACKER``: turn, then shift)."""

    def __init__(self, mech: Mechanism, orientation: bool, sigma_position: float, sigma_orientation: float):
        self.params = GeometricParameters(mech)
        self.mech = mech
        self.orientation = orientation
        self.m = 6 if orientation else 3
        self.sigma = np.r_[np.full(3, sigma_position), np.full(3, sigma_orientation)][:self.m]
        self.names = self.params.names + list(TRACKER)
        self.units = self.params.units + list(TRACKER_UNITS)
        self.scale = np.r_[self.params.prior, TRACKER_PRIOR]
        self.n_geo = self.params.n
        self.tracker = np.arange(self.n_geo, self.n_geo + 6)

    @property
    def n(self) -> int:
        return len(self.names)

    def classes(self) -> list[np.ndarray]:
        """The parameters in the base set's order of preference (``identifiability``)."""
        p = self.params
        return [self.tracker, p.by_kind("offset"), p.by_kind("scale"), p.by_kind("tool point", "tool turn"),
                p.by_kind("point"), p.by_kind("turn")]

    def scaled_jacobian(self, model: PoseModel, delta=None, frame: Frame | None = None) -> np.ndarray:
        """(N, m, n): the whitened, scaled Jacobian of the readings at ``model``'s poses."""
        delta = np.zeros(self.n_geo) if delta is None else delta
        P, Rt, J = model.jacobian(delta)
        Jg, Jf = residual_jacobian(P, Rt, J, frame or Frame.identity(), Rt, self.orientation)
        return np.concatenate([Jg, Jf], axis=2) * self.scale[None, None, :] / self.sigma[None, :, None]

    def base_set(self, model: PoseModel) -> BaseSet:
        """The identifiable parameters over ``model``'s poses (many, spread over the workspace)."""
        A = self.scaled_jacobian(model)
        return base_set(A.reshape(-1, self.n), self.names, self.classes(), instrument=set(self.tracker.tolist()))
