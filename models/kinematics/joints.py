"""Joint types: each is one small class that stacks constraint primitives.

A joint connects body 1 and body 2 (either may be ground, index -1). Points and vectors are
given in each body's frame centred on its centre of mass (the loader converts from the
file's body frames). Axes must be unit vectors; the loader normalises them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .constraints import ANGLE, DIST, PERP, POINT, primitive


def perpendicular_pair(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two unit vectors u, v with (u, v, a) a right-handed orthonormal triad."""
    a = a / np.linalg.norm(a)
    helper = np.array([1.0, 0.0, 0.0]) if abs(a[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    u = np.cross(helper, a)
    u /= np.linalg.norm(u)
    return u, np.cross(a, u)


def _lock(b1, b2, e, f):
    """Three PERP rows that hold two triads e (body 1) and f (body 2) together."""
    return [primitive(PERP, b1, b2, a1=e[0], b2v=f[1]),
            primitive(PERP, b1, b2, a1=e[1], b2v=f[2]),
            primitive(PERP, b1, b2, a1=e[2], b2v=f[0])]


@dataclass(frozen=True)
class Joint:
    name: str
    body1: int
    body2: int
    point1: np.ndarray
    point2: np.ndarray
    axis1: np.ndarray
    axis2: np.ndarray
    ref1: np.ndarray
    ref2: np.ndarray
    offset: float = 0.0
    scale: float = 1.0  # actuated: joint value = scale theta + offset

    dof = 0
    type_name = "joint"

    def primitives(self, actuator: int = -1) -> list:
        raise NotImplementedError

    def _point(self):
        return [primitive(POINT, self.body1, self.body2, p1=self.point1, p2=self.point2)]


class Spherical(Joint):
    dof = 3
    type_name = "spherical"

    def primitives(self, actuator=-1):
        return self._point()


class Universal(Joint):
    """Point coincidence, axis1 (on body 1) perpendicular to axis2 (on body 2)."""
    dof = 2
    type_name = "universal"

    def primitives(self, actuator=-1):
        return self._point() + [primitive(PERP, self.body1, self.body2, a1=self.axis1, b2v=self.axis2)]


class Revolute(Joint):
    """Point coincidence and axis2 parallel to axis1. Actuated: the angle from ref1 to ref2
    about axis1 (rad) equals scale theta + offset."""
    dof = 1
    type_name = "revolute"

    def primitives(self, actuator=-1):
        u, v = perpendicular_pair(self.axis1)
        rows = self._point() + [primitive(PERP, self.body1, self.body2, a1=u, b2v=self.axis2),
                                primitive(PERP, self.body1, self.body2, a1=v, b2v=self.axis2)]
        if actuator >= 0:
            r1 = self.ref1 - (self.ref1 @ self.axis1) * self.axis1
            r1 /= np.linalg.norm(r1)
            rows.append(primitive(ANGLE, self.body1, self.body2, act=actuator, b2v=self.ref2,
                                  u1=r1, v1=np.cross(self.axis1, r1), c0=self.offset, sc=self.scale))
        return rows


class Prismatic(Joint):
    """Body 2 slides along axis1 of body 1 without rotating; ref1/ref2 fix the relative
    orientation. Actuated: (point2 - point1) . axis1 (m) equals scale theta + offset."""
    dof = 1
    type_name = "prismatic"

    def primitives(self, actuator=-1):
        e = _triad(self.axis1, self.ref1)
        f = _triad(self.axis2, self.ref2)
        rows = _lock(self.body1, self.body2, e, f)
        for d in (e[1], e[2]):
            rows.append(primitive(DIST, self.body1, self.body2, p1=self.point1, p2=self.point2, a1=d))
        if actuator >= 0:
            rows.append(primitive(DIST, self.body1, self.body2, act=actuator, p1=self.point1,
                                  p2=self.point2, a1=self.axis1, c0=self.offset, sc=self.scale))
        return rows


class Fixed(Joint):
    dof = 0
    type_name = "fixed"

    def primitives(self, actuator=-1):
        return self._point() + _lock(self.body1, self.body2, _triad(self.axis1, self.ref1),
                                     _triad(self.axis2, self.ref2))


def _triad(axis: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = ref - (ref @ axis) * axis
    if np.linalg.norm(r) < 1e-9:
        r, _ = perpendicular_pair(axis)
    r = r / np.linalg.norm(r)
    return axis, r, np.cross(axis, r)


JOINT_TYPES: dict[str, type[Joint]] = {
    cls.type_name: cls for cls in (Revolute, Prismatic, Spherical, Universal, Fixed)
}
ACTUATABLE = ("revolute", "prismatic")
