"""The geometric parameters of a machine description and their first-order effect on its
constraints and on its tool.

Every parameter is a change from the description's value (SI units; the vector ``delta``):

- per joint and per side (body 1, body 2): the joint's point on that body (3 coordinates, m,
  in the body's frame; on a body with an idle spin, a rod between two ball joints, only along
  the spin's axis: across it the point would move the rod's axis off its centre of mass and
  change nothing else) and, unless the joint is spherical, a turn of the joint's frame on that
  body (rad, in the body's frame): about the two directions perpendicular to the joint's axis
  on that body for revolute and universal joints (a turn about the axis itself changes nothing,
  or, for an actuated revolute, the actuator's offset), about x, y, z for prismatic and fixed
  joints (their frames lock the bodies' relative orientation);
- per actuator: its offset (m or rad) and its scale (1: joint value per unit of theta, a screw
  lead's or an encoder's error); the joint value is scale theta + offset;
- the tool: its point (3, m, in its body's frame) and, for a tool with orientation, a turn of
  its frame (3, rad, in its body's frame).

A turn by the rotation vector psi of a frame is exp([psi]x) applied to every vector of the
joint on that side (axis, reference, the directions derived from them); a point moves by its
change. The constraint rows are linear in their vectors and points, so their derivatives with
respect to every parameter are exact closed forms here (``row_gradients`` per pose times
``field_map`` per parameter change); a turn's derivative carries the left Jacobian of SO(3) at
the current turn, so it is exact away from the description too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..kinematics import constraints as C
from ..kinematics.description import rotation_from_vector
from ..kinematics.joints import perpendicular_pair
from ..kinematics.mechanism import Config, Mechanism, primitive_joints
from ..kinematics.taskspace import Tool, tool_of

# the prior size of each kind of parameter: the column scaling of the identification Jacobian
# (and, by default, the size of the random truths of the tests and the benchmark)
PRIOR = {"m": 0.5e-3, "rad": 2e-3, "1": 2e-3}
ROTATING = ("revolute", "universal")  # a turn about their own axis changes nothing


def skew(v) -> np.ndarray:
    return np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])


def left_jacobian(psi) -> np.ndarray:
    """J_l of SO(3): exp([psi + d]x) = exp([J_l(psi) d]x) exp([psi]x) to first order in d."""
    a = float(np.linalg.norm(psi))
    K = skew(psi)
    if a < 1e-6:
        return np.eye(3) + 0.5 * K + K @ K / 6.0
    return np.eye(3) + (1 - np.cos(a)) / a**2 * K + (a - np.sin(a)) / a**3 * K @ K


@dataclass(frozen=True)
class Group:
    """Parameters that act together: a joint's point or frame on one side, an actuator's
    offset or scale, the tool's point or frame. ``cols``: their indices; ``basis`` (3, k): the
    body-frame directions of a turn's k components."""
    kind: str  # point, turn, offset, scale, tool point, tool turn
    cols: np.ndarray
    joint: int = -1
    side: int = 0
    actuator: int = -1
    basis: np.ndarray | None = None  # points: the directions of its k coordinates (3, k)


class GeometricParameters:
    """The geometric parameters of ``mech`` (its description and tool): names, units, priors,
    the description's values, and the model at any ``delta`` with the derivatives there."""

    def __init__(self, mech: Mechanism):
        self.mech = mech
        self.tool0 = tool_of(mech)
        self.owner = primitive_joints(mech)
        desc = mech.description
        names, units, kinds, nominal, groups = [], [], [], [], []

        def add(kind, labels, unit, values, **kw):
            cols = np.arange(len(names), len(names) + len(labels))
            names.extend(labels)
            units.extend([unit] * len(labels))
            kinds.extend([kind] * len(labels))
            nominal.extend(values)
            groups.append(Group(kind, cols, **kw))

        spin = {f.body: f.axis for f in mech.idle}  # bodies with an idle spin: its axis (body frame)
        for j, js in enumerate(desc.joints):
            for side, point, axis in ((1, js.point1, js.axis1), (2, js.point2, js.axis2)):
                body = js.body1 if side == 1 else js.body2
                if body in spin:
                    e = spin[body][:, None]
                    add("point", [f"{js.name}.point{side}.axial"], "m", [float(point @ e[:, 0])], joint=j, side=side,
                        basis=e)
                else:
                    add("point", [f"{js.name}.point{side}.{c}" for c in "xyz"], "m", point.tolist(), joint=j, side=side,
                        basis=np.eye(3))
                if js.type == "spherical":
                    continue
                if js.type in ROTATING:
                    basis = np.column_stack(perpendicular_pair(axis))
                    labels = [f"{js.name}.frame{side}.u", f"{js.name}.frame{side}.v"]
                else:
                    basis, labels = np.eye(3), [f"{js.name}.frame{side}.r{c}" for c in "xyz"]
                add("turn", labels, "rad", [0.0] * len(labels), joint=j, side=side, basis=basis)
        for a, spec in enumerate(desc.actuators):
            add("offset", [f"{spec.name}.offset"], spec.unit, [spec.offset], actuator=a)
            add("scale", [f"{spec.name}.scale"], "1", [spec.scale], actuator=a)
        add("tool point", [f"tool.point.{c}" for c in "xyz"], "m", desc.tool.point.tolist())
        if self.tool0.orientation:
            add("tool turn", [f"tool.frame.r{c}" for c in "xyz"], "rad", [0.0] * 3, basis=np.eye(3))
        self.names, self.units, self.kinds = names, units, kinds
        self.nominal = np.array(nominal)
        self.groups = groups
        self.prior = np.array([PRIOR["m" if u == "m" else u] for u in units])
        self.n = len(names)
        # primitives of each joint; the actuator row (primitive index) of each actuator
        self.joint_prims = [np.flatnonzero(self.owner == j) for j in range(len(desc.joints))]
        self.act_prim = np.full(mech.n_act, -1)
        for k, a in enumerate(mech.prim_i[:, 3]):
            if a >= 0:
                self.act_prim[a] = k
        self.row0 = np.concatenate([[0], np.cumsum([C.ROWS[t] for t in mech.prim_i[:, 0]])])
        self.row_prim = np.repeat(np.arange(len(mech.prim_i)), [C.ROWS[t] for t in mech.prim_i[:, 0]])
        self.by_type = {t: np.flatnonzero(mech.prim_i[:, 0] == t) for t in (C.POINT, C.PERP, C.DIST, C.ANGLE)}

    # -- the model at delta ----------------------------------------------------------------
    def apply(self, delta) -> tuple[Mechanism, Tool]:
        """The mechanism (its constraint primitives) and the tool with the parameters changed
        by ``delta``; everything else (branch, rows, reference assembly) is the description's."""
        delta = np.asarray(delta, float)
        f = self.mech.prim_f.copy()
        tool = self.tool0
        for g in self.groups:
            d = delta[g.cols]
            if not np.any(d):
                continue
            if g.kind == "point":
                c = C.P1 if g.side == 1 else C.P2
                f[self.joint_prims[g.joint], c:c + 3] += g.basis @ d
            elif g.kind == "turn":
                Rm = rotation_from_vector(g.basis @ d)
                ks = self.joint_prims[g.joint]
                for field in ((C.A1, C.U1, C.V1) if g.side == 1 else (C.B2,)):
                    f[ks, field:field + 3] = f[ks, field:field + 3] @ Rm.T
            elif g.kind == "offset":
                f[self.act_prim[g.actuator], C.C0] += d[0]
            elif g.kind == "scale":
                f[self.act_prim[g.actuator], C.SC] += d[0]
            elif g.kind == "tool point":
                tool = dataclasses.replace(tool, r_local=tool.r_local + d)
            else:
                tool = dataclasses.replace(tool, R_local=rotation_from_vector(d) @ self.tool0.R_local)
        return dataclasses.replace(self.mech, prim_f=f), tool

    # -- derivatives -----------------------------------------------------------------------
    # d phi / d delta = (d phi / d prim_f) (d prim_f / d delta): the first factor per pose
    # (``row_gradients``), the second per delta (``field_map``), both exact.
    def field_map(self, prim_f: np.ndarray, delta) -> np.ndarray:
        """d prim_f / d delta at ``delta`` (whose primitives are ``prim_f``), gathered per
        constraint row: (rows, NF, n). Points move with their coordinates; a turn's component i
        turns every vector v of its side by (J_l(psi) basis e_i) x v; offsets and scales are
        their primitive's c0 and sc."""
        delta = np.asarray(delta, float)
        M = np.zeros((len(prim_f), C.NF, self.n))
        for g in self.groups:
            if g.kind == "point":
                c = C.P1 if g.side == 1 else C.P2
                for k in self.joint_prims[g.joint]:
                    M[k, c:c + 3, g.cols] = g.basis.T
            elif g.kind == "turn":
                Jb = left_jacobian(g.basis @ delta[g.cols]) @ g.basis
                for k in self.joint_prims[g.joint]:
                    for c in ((C.A1, C.U1, C.V1) if g.side == 1 else (C.B2,)):
                        M[k, c:c + 3, g.cols] = (-skew(prim_f[k, c:c + 3]) @ Jb).T
            elif g.kind in ("offset", "scale"):
                M[self.act_prim[g.actuator], C.C0 if g.kind == "offset" else C.SC, g.cols[0]] = 1.0
        return M[self.row_prim]

    def row_gradients(self, prim_f: np.ndarray, cfg: Config, theta) -> np.ndarray:
        """d phi / d prim_f of every constraint row at a configuration: (rows, NF), each row
        with respect to its own primitive's floats (``constraints``: POINT, PERP, DIST, ANGLE)."""
        pi = self.mech.prim_i
        R = np.concatenate([cfg.R, np.eye(3)[None]])  # body -1 (ground): the last
        X = np.concatenate([cfg.X, np.zeros((1, 3))])
        G = np.zeros((self.row0[-1], C.NF))
        th = np.asarray(theta, float)

        def vec(k, c):
            return prim_f[k, c:c + 3]

        def mul(A, v):  # A v per row
            return np.einsum("kij,kj->ki", A, v)

        def tmul(A, v):  # A^T v per row
            return np.einsum("kji,kj->ki", A, v)

        for kind, k in self.by_type.items():
            if not len(k):
                continue
            r, R1, R2 = self.row0[k], R[pi[k, 1]], R[pi[k, 2]]
            if kind == C.POINT:
                for i in range(3):
                    G[r + i, C.P1:C.P1 + 3] = R1[:, i, :]
                    G[r + i, C.P2:C.P2 + 3] = -R2[:, i, :]
            elif kind == C.PERP:
                G[r, C.A1:C.A1 + 3] = tmul(R1, mul(R2, vec(k, C.B2)))
                G[r, C.B2:C.B2 + 3] = tmul(R2, mul(R1, vec(k, C.A1)))
            elif kind == C.DIST:
                a = mul(R1, vec(k, C.A1))
                d = X[pi[k, 2]] + mul(R2, vec(k, C.P2)) - X[pi[k, 1]] - mul(R1, vec(k, C.P1))
                G[r, C.P1:C.P1 + 3] = -vec(k, C.A1)
                G[r, C.P2:C.P2 + 3] = tmul(R2, a)
                G[r, C.A1:C.A1 + 3] = tmul(R1, d)
                act = pi[k, 3] >= 0
                G[r[act], C.C0] = -1.0
                G[r[act], C.SC] = -th[pi[k[act], 3]]
            else:  # ANGLE: (R2 b2) . R1 (-sin(ang) u1 + cos(ang) v1), ang = sc theta + c0
                ang = prim_f[k, C.SC] * th[pi[k, 3]] + prim_f[k, C.C0]
                sn, cs = np.sin(ang)[:, None], np.cos(ang)[:, None]
                u1, v1 = vec(k, C.U1), vec(k, C.V1)
                t = tmul(R1, mul(R2, vec(k, C.B2)))
                G[r, C.B2:C.B2 + 3] = tmul(R2, mul(R1, -sn * u1 + cs * v1))
                G[r, C.U1:C.U1 + 3] = -sn * t
                G[r, C.V1:C.V1 + 3] = cs * t
                gc0 = np.sum(t * (-cs * u1 - sn * v1), axis=1)
                G[r, C.C0] = gc0
                G[r, C.SC] = gc0 * th[pi[k, 3]]
        return G

    def constraint_gradient(self, row_grad: np.ndarray, fields: np.ndarray) -> np.ndarray:
        """d phi / d delta (rows, n) from ``row_gradients`` and ``field_map``."""
        return np.einsum("rf,rfn->rn", row_grad, fields)

    def tool_gradient(self, cfg: Config, tool: Tool, delta) -> np.ndarray:
        """The direct effect of the tool's parameters on the tool (6 x n: world position rows,
        then world rotation rows), the configuration held."""
        Rb = cfg.R[tool.body]
        T = np.zeros((6, self.n))
        for g in self.groups:
            if g.kind == "tool point":
                T[:3, g.cols] = Rb
            elif g.kind == "tool turn":
                T[3:, g.cols] = Rb @ left_jacobian(delta[g.cols])
        return T

    # -- reading -----------------------------------------------------------------------------
    def values(self, delta) -> np.ndarray:
        """Each parameter's value: the description's plus ``delta`` (turns: the turn itself)."""
        return self.nominal + np.asarray(delta, float)

    def by_kind(self, *kinds: str) -> np.ndarray:
        return np.array([i for i, k in enumerate(self.kinds) if k in kinds], dtype=int)
