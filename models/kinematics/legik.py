"""Closed-form inverse kinematics of machines whose actuators each drive one leg to the tool
body, vectorised over all points of a path at once.

Two kinds of leg are recognised from the description (the reference assembly gives the
geometry; units m, rad, world frame):

- **arm + link** (the Delta, the Orthoglide): an actuated revolute or prismatic joint between
  the ground and a body M; a link body with exactly two joints, one on M (point E) and one on
  the tool body (point C), keeps |C - E| = L. The tool body only translates (task coordinates
  x, y, z), so C = x + c with c constant. A revolute arm turns E about the joint axis v through
  A by theta - theta_ref (right-handed): K cos(phi) + M sin(phi) = N, two closed-form roots;
  a prismatic one slides E along e: a quadratic in theta - theta_ref. The root holding the
  reference assembly is kept (the machine's branch).
- **prismatic leg** (the hexapod): a body jointed to the ground at G carries an actuated
  prismatic joint to a body jointed to the tool body at Q; theta = |Q - G| - |Q_ref - G_ref| +
  theta_ref. The tool body may rotate (roll, pitch, yaw coordinates).

Rates are exact: implicit differentiation of each leg's scalar closure g(x, theta) = 0 along
the path parameter (first and second derivatives of the task coordinates), no finite
differences. ``leg_kinematics`` returns None for a machine it does not recognise, or whose
closed form does not reproduce the model's Newton solution at the reference assembly and at
a few poses around it to 1e-9 (the planner then uses the Newton solution).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .taskspace import TaskKinematics, rpy_matrix, rpy_rates, tool_pose


@dataclass(frozen=True)
class LegKinematics:
    """Per-actuator leg geometry (world, reference assembly). kind[i]: 0 revolute arm, 1
    prismatic arm, 2 prismatic leg. Arm rows: A (joint point), v (unit axis), a0 = E_ref - A,
    c = C_ref - x_ref, L (link length). Leg rows: G (ground point), b = Q in the tool body's
    frame relative to the tool point, l0 = |Q_ref - G|."""
    kind: np.ndarray
    A: np.ndarray
    v: np.ndarray
    a0: np.ndarray
    c: np.ndarray
    L: np.ndarray
    branch: np.ndarray  # +1 / -1: the root of the reference assembly
    G: np.ndarray
    b: np.ndarray
    l0: np.ndarray
    theta_ref: np.ndarray
    R_tool_inv: np.ndarray  # tool frame to tool-body frame (R_local^T)
    orientation: bool

    def solve(self, P, P1, P2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """theta, theta_s, theta_ss (n, s) at task points P (n, m) with derivatives P1, P2
        along the path parameter; NaN rows where a point is outside the workspace."""
        P, P1, P2 = (np.atleast_2d(np.asarray(a, float)) for a in (P, P1, P2))
        n, s = len(P), len(self.kind)
        th, th1, th2 = np.full((n, s), np.nan), np.full((n, s), np.nan), np.full((n, s), np.nan)
        x, x1, x2 = P[:, :3], P1[:, :3], P2[:, :3]
        with np.errstate(invalid="ignore", divide="ignore"):  # outside the workspace: NaN rows
            for i in range(s):
                if self.kind[i] == 2:
                    th[:, i], th1[:, i], th2[:, i] = self._leg(i, P, P1, P2)
                else:
                    th[:, i], th1[:, i], th2[:, i] = self._arm(i, x, x1, x2)
        return th, th1, th2

    def _arm(self, i, x, x1, x2):
        A, v, a0, L = self.A[i], self.v[i], self.a0[i], self.L[i]
        d = x + self.c[i] - A  # from the joint point to the link's tool-side point
        if self.kind[i] == 0:
            va = v @ a0
            a_perp, vxa = a0 - va * v, np.cross(v, a0)
            K, M = d @ a_perp, d @ vxa
            N = 0.5 * (np.einsum("ij,ij->i", d, d) + a0 @ a0 - L * L) - va * (d @ v)
            phi = np.arctan2(M, K) + self.branch[i] * np.arccos(N / np.hypot(K, M))
            phi = (phi + np.pi) % (2 * np.pi) - np.pi
            cs, sn = np.cos(phi)[:, None], np.sin(phi)[:, None]
            r = cs * a_perp + sn * vxa + va * v  # E - A
            E1 = np.cross(v, r)  # dE / dtheta
            E2 = np.cross(v, E1)
        else:
            de = d @ v
            t = de + self.branch[i] * np.sqrt(de * de - np.einsum("ij,ij->i", d, d) + L * L)
            phi = t
            r = a0 + t[:, None] * v
            E1 = np.broadcast_to(v, r.shape)
            E2 = np.zeros_like(r)
        w = d - r  # C - E
        gt = -2 * np.einsum("ij,ij->i", w, E1)  # dg/dtheta; g = |C - E|^2 - L^2
        gx1 = 2 * np.einsum("ij,ij->i", w, x1)
        t1 = -gx1 / gt
        gtt = 2 * np.einsum("ij,ij->i", E1, E1) - 2 * np.einsum("ij,ij->i", w, E2)
        second = (2 * np.einsum("ij,ij->i", x1, x1) - 4 * np.einsum("ij,ij->i", E1, x1) * t1 + gtt * t1 * t1
                  + 2 * np.einsum("ij,ij->i", w, x2))
        return phi + self.theta_ref[i], t1, -second / gt

    def _leg(self, i, P, P1, P2):
        n = len(P)
        p, p1, p2 = P[:, :3], P1[:, :3], P2[:, :3]
        if self.orientation:
            rb = np.einsum("nij,jk,k->ni", rpy_matrix(P[:, 3:].T).transpose(2, 0, 1), self.R_tool_inv, self.b[i])
            w, w1 = np.empty((n, 3)), np.empty((n, 3))
            for k in range(n):
                w[k], w1[k] = rpy_rates(P[k, 3:], P1[k, 3:], P2[k, 3:])
            q1 = p1 + np.cross(w, rb)
            q2 = p2 + np.cross(w1, rb) + np.cross(w, np.cross(w, rb))
        else:
            rb = np.broadcast_to(self.b[i], p.shape)
            q1, q2 = p1, p2
        d = p + rb - self.G[i]
        ell = np.linalg.norm(d, axis=1)
        u = d / ell[:, None]
        l1 = np.einsum("ij,ij->i", u, q1)
        l2 = np.einsum("ij,ij->i", u, q2) + (np.einsum("ij,ij->i", q1, q1) - l1 * l1) / ell
        return ell - self.l0[i] + self.theta_ref[i], l1, l2


def _world_point(mech, cfg, body: str, point) -> np.ndarray:
    if body == "ground":
        return np.asarray(point, float)
    b = mech.body_names.index(body)
    return cfg.X[b] + cfg.R[b] @ (np.asarray(point, float) - mech.description.bodies[b].com)


def _joint_point(mech, cfg, j, on: str) -> np.ndarray:
    return _world_point(mech, cfg, on, j.point1 if j.body1 == on else j.point2)


def _leg_rows(mech, tool_body: str, x_ref: np.ndarray):
    """Geometry rows per actuator (see ``LegKinematics``), or None if a leg is not one of the
    two kinds."""
    desc, cfg = mech.description, mech.ref_config
    joints = {j.name: j for j in desc.joints}
    rows = []
    for act in desc.actuators:
        j = joints[act.joint]
        if j.type not in ("revolute", "prismatic"):
            return None
        if "ground" in (j.body1, j.body2):  # arm + link
            m = j.body2 if j.body1 == "ground" else j.body1
            link = None
            for k in desc.joints:
                other = k.body2 if k.body1 == m else k.body1 if k.body2 == m else None
                if other in (None, "ground") or k is j:
                    continue
                ends = [q for q in desc.joints if q is not k and other in (q.body1, q.body2)]
                if len(ends) == 1 and tool_body in (ends[0].body1, ends[0].body2):
                    link = (k, ends[0])
                    break
            if link is None:
                return None
            A = _joint_point(mech, cfg, j, "ground")
            v = j.axis1 if j.body1 == "ground" else -j.axis2
            v = v / np.linalg.norm(v)
            E, C = _joint_point(mech, cfg, link[0], m), _joint_point(mech, cfg, link[1], tool_body)
            rows.append(dict(kind=0 if j.type == "revolute" else 1, A=A, v=v, a0=E - A, c=C - x_ref,
                             L=np.linalg.norm(C - E)))
            continue
        # prismatic leg: ground - body 1 - (actuated prismatic) - body 2 - tool body
        ground_side = [q for q in desc.joints if "ground" in (q.body1, q.body2) and
                       {q.body1, q.body2} & {j.body1, j.body2}]
        tool_side = [q for q in desc.joints if tool_body in (q.body1, q.body2) and
                     {q.body1, q.body2} & {j.body1, j.body2}]
        if j.type != "prismatic" or len(ground_side) != 1 or len(tool_side) != 1:
            return None
        G = _joint_point(mech, cfg, ground_side[0], "ground")
        Q = _joint_point(mech, cfg, tool_side[0], tool_body)
        rows.append(dict(kind=2, G=G, Q=Q, l0=np.linalg.norm(Q - G)))
    return rows


def leg_kinematics(kin: TaskKinematics, check: int = 4) -> LegKinematics | None:
    """The closed form of ``kin``'s machine (see the module docstring), checked against the
    Newton solution at the reference assembly and ``check`` poses around it; None if the
    machine's legs are of another kind or the check fails."""
    mech, tool = kin.mech, kin.tool
    if tool.position != (0, 1, 2):
        return None
    tool_body = mech.body_names[tool.body]
    cfg = mech.ref_config
    x_ref = tool_pose(mech, cfg, tool)
    rows = _leg_rows(mech, tool_body, x_ref[:3])
    if rows is None or (any(r["kind"] != 2 for r in rows) and tool.orientation):
        return None
    s = len(rows)
    R_body = cfg.R[tool.body]
    z3, z = np.zeros((s, 3)), np.zeros(s)

    def col(key, zero):
        return np.array([r.get(key, zero[0]) for r in rows])

    b = np.array([R_body.T @ (r["Q"] - x_ref[:3]) if r["kind"] == 2 else np.zeros(3) for r in rows])
    legs = LegKinematics(np.array([r["kind"] for r in rows]), col("A", z3), col("v", z3), col("a0", z3),
                         col("c", z3), col("L", z), np.ones(s), col("G", z3), b, col("l0", z),
                         mech.theta_ref.copy(), tool.R_local.T.copy(), tool.orientation)
    zero = np.zeros((1, tool.m))
    th_p = legs.solve(x_ref[None], zero, zero)[0][0]
    th_m = LegKinematics(**{**legs.__dict__, "branch": -np.ones(s)}).solve(x_ref[None], zero, zero)[0][0]
    branch = np.where(np.abs(th_p - mech.theta_ref) <= np.abs(th_m - mech.theta_ref), 1.0, -1.0)
    legs = LegKinematics(**{**legs.__dict__, "branch": branch})
    return legs if _agrees(kin, legs, x_ref, check) else None


def _agrees(kin: TaskKinematics, legs: LegKinematics, x_ref: np.ndarray, check: int) -> bool:
    """The closed form matches the Newton solution (positions and rates, 1e-9) at the
    reference and at ``check`` poses within 2 cm (0.05 rad) of it."""
    rng = np.random.default_rng(0)
    m = kin.tool.m
    step = np.where(np.arange(m) < 3, 0.02, 0.05)
    saved = kin.cfg, kin.theta
    try:
        for k in range(check + 1):
            x = x_ref + (0 if k == 0 else rng.uniform(-1, 1, m) * step)
            xd, xdd = rng.normal(size=m), rng.normal(size=m)
            cfg, theta, res = kin.solve_pose(x, kin.mech.ref_config, kin.mech.theta_ref)
            if not res < kin.tol:
                return False
            _, thd, _, thdd = kin.rates(cfg, theta, x, xd, xdd)
            th, th1, th2 = legs.solve(x[None], xd[None], xdd[None])
            scale = 1 + np.abs(np.concatenate([thd, thdd])).max()
            if not (np.abs(th[0] - theta).max() < 1e-9 and
                    np.abs(np.concatenate([th1[0] - thd, th2[0] - thdd])).max() < 1e-9 * scale):
                return False
        return True
    finally:
        kin.cfg, kin.theta = saved
