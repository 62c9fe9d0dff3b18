"""A compiled mechanism: immutable arrays, the reference assembly, redundancy and mobility.

``load_mechanism(path_or_name)`` reads a description, stacks the joints' constraint
primitives, assembles the guess (Gauss-Newton on all rows), finds the redundant constraints
by a rank-revealing QR of the constraint Jacobian, detects idle freedoms (motions with the
actuators locked, e.g. a rod spinning about its own axis between two ball joints), locks
those that carry no kinetic energy, and checks the mobility.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg

from pkrt.rt.core.errors import ModelFailure

from . import constraints as C
from .description import GROUND, Description, ModelError, load_description
from .joints import JOINT_TYPES, perpendicular_pair


class AssemblyError(ModelFailure, ModelError):
    """A configuration cannot be assembled (message gives residual and conditioning): a model
    failure; a ModelError too, since a description whose reference configuration cannot be
    assembled is a bad description."""


def rotvec_to_matrix(rv: np.ndarray) -> np.ndarray:
    a = float(np.sqrt(rv @ rv))
    if a < 1e-14:
        K = np.array([[0, -rv[2], rv[1]], [rv[2], 0, -rv[0]], [-rv[1], rv[0], 0]])
        return np.eye(3) + K + 0.5 * K @ K
    k = rv / a
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(a) * K + (1 - np.cos(a)) * (K @ K)


@dataclass
class Config:
    """Body positions X (nb x 3, centres of mass, m) and rotations R (nb x 3 x 3)."""
    X: np.ndarray
    R: np.ndarray

    def copy(self) -> "Config":
        return Config(self.X.copy(), self.R.copy())

    def step(self, dq: np.ndarray) -> "Config":
        """Move by dq = (dx_b, dpsi_b) per body; rotations on SO(3)."""
        X, R = np.empty_like(self.X), np.empty_like(self.R)
        C.step_config(self.X, self.R, np.ascontiguousarray(dq, dtype=float), X, R)
        return Config(X, R)


@dataclass(frozen=True)
class IdleFreedom:
    """A motion with the actuators locked: body ``body`` turning about ``axis`` (unit, body
    frame as in the file) through its centre of mass. Its inertia about that axis is zero, so
    the motion carries no kinetic energy; it is locked by one constraint row (the body's
    spin held fixed in the world frame), which leaves the dynamics unchanged."""
    body: str
    axis: np.ndarray


@dataclass(frozen=True)
class Mechanism:
    """Immutable compiled model (Pinocchio-style): arrays only, no per-call state."""
    description: Description
    body_names: tuple[str, ...]
    masses: np.ndarray  # (nb,) kg
    inertias: np.ndarray  # (nb, 3, 3) about the centre of mass, body frame, kg m^2
    gravity: np.ndarray  # (3,) m/s^2
    prim_i: np.ndarray  # all primitives: passive first, then actuator rows
    prim_f: np.ndarray
    n_rows: int  # all scalar constraint rows (passive + actuator)
    n_passive: int
    independent: np.ndarray  # passive rows kept after eliminating redundant ones
    square_rows: np.ndarray  # independent passive rows + actuator rows (n of them)
    ref_config: Config  # assembled at theta_ref
    theta_ref: np.ndarray
    mass_diag: np.ndarray = field(repr=False)  # (nb, 3) diag of the translational mass blocks
    idle: tuple[IdleFreedom, ...] = ()  # locked idle freedoms (one passive row each, after the joints')

    @property
    def name(self) -> str:
        return self.description.name

    @property
    def n_bodies(self) -> int:
        return len(self.body_names)

    @property
    def n_coords(self) -> int:
        return 6 * self.n_bodies

    @property
    def n_act(self) -> int:
        return len(self.description.actuators)

    @property
    def n_redundant(self) -> int:
        return self.n_passive - len(self.independent)

    @property
    def n_joint_rows(self) -> int:
        """Passive rows from the joints (without the idle-freedom locks)."""
        return self.n_passive - len(self.idle)

    @property
    def ranges(self) -> np.ndarray:
        return np.array([a.range for a in self.description.actuators], dtype=float)

    @property
    def actuator_names(self) -> list[str]:
        return [a.name for a in self.description.actuators]

    @property
    def actuator_units(self) -> list[str]:
        return [a.unit for a in self.description.actuators]

    @property
    def content_hash(self) -> str:
        return self.description.content_hash

    # -- constraint evaluation ------------------------------------------------------------
    def evaluate(self, cfg: Config, theta: np.ndarray):
        """phi (all rows), Phi_q (rows x n), Phi_theta (rows x s)."""
        phi = np.empty(self.n_rows)
        jac = np.empty((self.n_rows, self.n_coords))
        jt = np.empty((self.n_rows, self.n_act))
        C.evaluate(self.prim_i, self.prim_f, cfg.X, cfg.R, np.asarray(theta, float), phi, jac, jt)
        return phi, jac, jt

    def drift(self, cfg: Config, qdot: np.ndarray, theta: np.ndarray, theta_dot: np.ndarray):
        gamma = np.empty(self.n_rows)
        v = qdot.reshape(-1, 6)
        C.drift(self.prim_i, self.prim_f, cfg.X, cfg.R, np.ascontiguousarray(v[:, :3]),
                np.ascontiguousarray(v[:, 3:]), np.asarray(theta, float),
                np.asarray(theta_dot, float), gamma)
        return gamma

    def world_inertias(self, cfg: Config) -> np.ndarray:
        return cfg.R @ self.inertias @ cfg.R.transpose(0, 2, 1)

    def mass_matrix(self, cfg: Config) -> np.ndarray:
        """Block-diagonal M (n x n): m I on translations, R I R^T on rotations (world)."""
        n = self.n_coords
        M = np.zeros((n, n))
        Iw = self.world_inertias(cfg)
        for b in range(self.n_bodies):
            i = 6 * b
            M[i:i + 3, i:i + 3] = np.diag(self.mass_diag[b])
            M[i + 3:i + 6, i + 3:i + 6] = Iw[b]
        return M

    def gyroscopic(self, cfg: Config, qdot: np.ndarray) -> np.ndarray:
        """Complementary inertia forces g_iner = (0, w x I w) per body (N, N m)."""
        v = qdot.reshape(-1, 6)
        w = v[:, 3:]
        Iw = self.world_inertias(cfg)
        g = np.zeros_like(v)
        g[:, 3:] = np.cross(w, np.einsum("bij,bj->bi", Iw, w))
        return g.ravel()

    def external_forces(self) -> np.ndarray:
        """Gravity forces g_ext at the centres of mass (N), zero moments."""
        g = np.zeros((self.n_bodies, 6))
        g[:, :3] = self.masses[:, None] * self.gravity[None, :]
        return g.ravel()

    def energy(self, cfg: Config, qdot: np.ndarray) -> float:
        """Kinetic plus gravitational potential energy (J)."""
        M = self.mass_matrix(cfg)
        return float(0.5 * qdot @ M @ qdot - np.sum(self.masses * (cfg.X @ self.gravity)))

    def singularity_measure(self, cfg: Config, theta: np.ndarray) -> float:
        """Smallest singular value of the square constraint Jacobian (with actuator rows)."""
        _, jac, _ = self.evaluate(cfg, theta)
        return float(np.linalg.svd(jac[self.square_rows], compute_uv=False)[-1])

    def platform_point(self, cfg: Config, body: str, point=(0.0, 0.0, 0.0)) -> np.ndarray:
        """World position of a point given in a body's centre-of-mass frame (m)."""
        b = self.body_names.index(body)
        return cfg.X[b] + cfg.R[b] @ np.asarray(point, float)


def gauss_newton(mech_rows, evaluate, cfg: Config, theta, tol=1e-12, max_iter=60,
                 max_step=0.2) -> tuple[Config, float, int]:
    """Damped Gauss-Newton on the rows ``mech_rows`` with a step cap (m or rad) and
    backtracking. Returns the configuration, final residual norm and iterations."""
    phi, jac, _ = evaluate(cfg, theta)
    res = float(np.linalg.norm(phi[mech_rows]))
    it = 0
    while res > tol and it < max_iter:
        it += 1
        J = jac[mech_rows]
        if J.shape[0] == J.shape[1]:
            try:
                dq = -np.linalg.solve(J, phi[mech_rows])
            except np.linalg.LinAlgError:
                dq = -np.linalg.lstsq(J, phi[mech_rows], rcond=1e-12)[0]
        else:
            dq = -np.linalg.lstsq(J, phi[mech_rows], rcond=1e-12)[0]
        big = np.abs(dq).max()
        if big > max_step:
            dq *= max_step / big
        lam = 1.0
        while True:
            trial = cfg.step(lam * dq)
            p2, j2, _ = evaluate(trial, theta)
            r2 = float(np.linalg.norm(p2[mech_rows]))
            if r2 < res or lam < 1e-3:
                break
            lam *= 0.5
        cfg, phi, jac, res = trial, p2, j2, r2
        if lam < 1e-3 and r2 >= res:
            break
    return cfg, res, it


def _body_index(desc: Description, name: str) -> int:
    return -1 if name == GROUND else [b.name for b in desc.bodies].index(name)


def _check_actuated_angles(desc: Description, prim_i, prim_f, cfg: Config, theta) -> None:
    """The ANGLE row sin(alpha - sc theta - c0) = 0 also holds at alpha = sc theta + c0 + pi: refuse
    an assembly whose actuated angle is half a turn from the guess (cos(...) < 0)."""
    for k in range(len(prim_i)):
        if prim_i[k, 0] != C.ANGLE or prim_i[k, 3] < 0:
            continue
        b1, b2, a = int(prim_i[k, 1]), int(prim_i[k, 2]), int(prim_i[k, 3])
        R1 = np.eye(3) if b1 < 0 else cfg.R[b1]
        R2 = np.eye(3) if b2 < 0 else cfg.R[b2]
        f = prim_f[k]
        ang = f[C.SC] * theta[a] + f[C.C0]
        c = (R2 @ f[C.B2:C.B2 + 3]) @ (R1 @ (np.cos(ang) * f[C.U1:C.U1 + 3] + np.sin(ang) * f[C.V1:C.V1 + 3]))
        if not c > 0:
            name = desc.actuators[a].name
            raise AssemblyError(
                f"{desc.path}: [assembly]: actuator '{name}' assembled half a turn away from the "
                f"guess theta = {float(theta[a]):g} (the body poses are far from it); pose the "
                f"bodies near the guess")


def _stack_primitives(desc: Description, owners: list | None = None):
    """(passive, active) primitive lists of the joints, body frames centred on the centres of
    mass. ``owners``, if given, receives (passive owners, active owners): the index of the joint
    each primitive comes from."""
    com = {b.name: b.com for b in desc.bodies}
    com[GROUND] = np.zeros(3)
    act_of = {a.joint: k for k, a in enumerate(desc.actuators)}
    passive, active = [], []
    own_p, own_a = [], []
    for ji, j in enumerate(desc.joints):
        cls = JOINT_TYPES[j.type]
        a = act_of.get(j.name, -1)
        off, sc = (desc.actuators[a].offset, desc.actuators[a].scale) if a >= 0 else (0.0, 1.0)
        joint = cls(j.name, _body_index(desc, j.body1), _body_index(desc, j.body2),
                    j.point1 - com[j.body1], j.point2 - com[j.body2], j.axis1, j.axis2,
                    j.ref1, j.ref2, off, sc)
        rows = joint.primitives()
        passive += rows
        own_p += [ji] * len(rows)
        if a >= 0:
            extra = joint.primitives(a)[len(rows):]
            active += extra
            own_a += [ji] * len(extra)
    if owners is not None:
        owners += [own_p, own_a]
    return passive, active


def primitive_joints(mech: "Mechanism") -> np.ndarray:
    """The index (in the description's ``joints``) of the joint each of ``mech``'s primitives
    comes from, in the order of ``prim_i``; -1 for the rows that lock idle freedoms."""
    owners: list = []
    _stack_primitives(mech.description, owners)
    own_p, own_a = owners
    return np.array(own_p + [-1] * len(mech.idle) + own_a, dtype=np.int64)


def _independent_rows(Jp: np.ndarray) -> np.ndarray:
    """Indices of independent rows of Jp (rank-revealing QR of Jp^T), sorted."""
    _, Rq, piv = scipy.linalg.qr(Jp.T, mode="economic", pivoting=True)
    d = np.abs(np.diag(Rq))
    tol = max(Jp.shape) * np.finfo(float).eps * 1e4 * (d[0] if len(d) else 1.0)
    return np.sort(piv[:int(np.sum(d > tol))])


def _null_space(A: np.ndarray, rtol: float = 1e-9) -> np.ndarray:
    """Orthonormal basis (columns) of the null space of A."""
    _, sv, Vt = np.linalg.svd(A)
    big = sv[0] if len(sv) else 1.0
    rank = int(np.sum(sv > rtol * max(big, 1e-300)))
    return Vt[rank:].T


def find_idle_motions(mech: "Mechanism", cfg: Config, jac: np.ndarray, independent: np.ndarray
                      ) -> tuple[list[tuple[int, np.ndarray]], np.ndarray]:
    """Motions with the actuators locked: the null space N of the independent passive rows
    and the actuator rows, and its part made of single-body motions, as (body index, 6-vector
    (dx, dpsi) of that body, world frame). Motions that move several bodies together are in
    N but not in the list."""
    n = mech.n_coords
    square = np.concatenate([independent, np.arange(mech.n_passive, mech.n_rows)])
    N = _null_space(jac[square])
    local = []
    for b in range(mech.n_bodies):
        cols = np.arange(6 * b, 6 * b + 6)
        others = np.setdiff1d(np.arange(n), cols)
        Z = _null_space(N[others]) if N.shape[1] else np.zeros((0, 0))
        for z in Z.T:
            m = N @ z
            local.append((b, m[cols] / np.linalg.norm(m[cols])))
    return local, N


def _idle_locks(desc: Description, mech: "Mechanism", cfg: Config, local, N, mobility: int, s: int,
                rank_text: str):
    """One lock row per idle motion, or the mobility error saying why they cannot be locked."""
    names = [b.name for b in desc.bodies]
    head = (f"{desc.path}: [[actuators]]: mobility is {mobility} but {s} actuator(s) are declared "
            f"({rank_text})")
    if len(local) != N.shape[1]:
        moving = sorted({names[i // 6] for i in np.nonzero(np.abs(N).max(axis=1) > 1e-9)[0]})
        raise ModelError(f"{head}; with the actuators locked {N.shape[1]} motion(s) remain, moving "
                         f"{', '.join(moving)}")
    Iw = mech.world_inertias(cfg)
    locks, idle = [], []
    for b, m in local:
        v, w = m[:3], m[3:]
        body = desc.bodies[b]
        axis = w / np.linalg.norm(w) if np.linalg.norm(w) > 1e-12 else np.zeros(3)
        energy = body.mass * (v @ v) + w @ Iw[b] @ w
        if np.linalg.norm(v) > 1e-9 or energy > 1e-9 * max(np.trace(body.inertia), 1e-300):
            what = (f"a rotation about {np.round(axis, 6).tolist()}" if np.linalg.norm(v) <= 1e-9
                    else "a motion of its centre of mass")
            raise ModelError(
                f"{head}; the remaining motion of body '{body.name}' ({what}) has inertia, so it is "
                f"not an idle freedom that can be locked (needs zero inertia about its axis)")
        u, _ = perpendicular_pair(axis)
        # the spin held fixed in the world: (a x u) . (R_b u_b) = 0, derivative 1 along the spin
        locks.append(C.primitive(C.PERP, -1, b, a1=np.cross(axis, u), b2v=cfg.R[b].T @ u))
        idle.append(IdleFreedom(body.name, _file_axis(cfg.R[b], axis)))
    return locks, tuple(idle)


def _file_axis(R_b: np.ndarray, axis_world: np.ndarray) -> np.ndarray:
    """A world axis at the body rotation R_b, in the body frame (sign: the largest component
    positive)."""
    a = R_b.T @ axis_world
    a = a if a[np.argmax(np.abs(a))] > 0 else -a
    return np.where(np.abs(a) < 1e-12, 0.0, a)


def _build(desc: Description, prims, n_passive_prims: int, cfg: Config, independent=None,
           square=None, idle=()) -> Mechanism:
    prim_i = np.array([p[0] for p in prims], dtype=np.int64)
    prim_f = np.array([p[1] for p in prims], dtype=np.float64)
    n_passive = C.count_rows(prim_i[:n_passive_prims])
    n_rows = C.count_rows(prim_i)
    masses = np.array([b.mass for b in desc.bodies])
    return Mechanism(desc, tuple(b.name for b in desc.bodies), masses,
                     np.array([b.inertia for b in desc.bodies]), desc.gravity, prim_i, prim_f,
                     n_rows, n_passive,
                     np.arange(n_passive) if independent is None else independent,
                     np.arange(n_rows) if square is None else square,
                     cfg, desc.theta_guess.copy(), np.repeat(masses[:, None], 3, 1), idle)


def compile_mechanism(desc: Description) -> Mechanism:
    """Stack primitives, assemble the guess, eliminate redundant rows, lock idle freedoms,
    check mobility."""
    bodies = desc.bodies
    passive, active = _stack_primitives(desc)
    X = np.array([b.position + b.rotation @ b.com for b in bodies])
    R = np.array([b.rotation for b in bodies])
    mech = _build(desc, passive + active, len(passive), Config(X, R))
    n_rows = mech.n_rows

    all_rows = np.arange(n_rows)
    with np.errstate(all="ignore"):  # absurd poses overflow: reported below, not warned
        cfg, res, _ = gauss_newton(all_rows, mech.evaluate, Config(X, R), desc.theta_guess,
                                   max_iter=100)
        _, jac, _ = mech.evaluate(cfg, desc.theta_guess)
    if not res <= 1e-9:  # NaN too
        sv = np.linalg.svd(np.nan_to_num(jac), compute_uv=False)
        raise AssemblyError(
            f"{desc.path}: [assembly]: the guess cannot be assembled at theta = "
            f"{desc.theta_guess.tolist()} (residual {res:.3g}, smallest singular value "
            f"{sv[min(len(sv), jac.shape[1]) - 1]:.3g}); check body poses and joint frames")
    _check_actuated_angles(desc, mech.prim_i, mech.prim_f, cfg, desc.theta_guess)

    n_passive = mech.n_passive
    independent = _independent_rows(jac[:n_passive])
    rank = len(independent)
    n = mech.n_coords
    mobility = n - rank
    s = len(desc.actuators)
    rank_text = (f"rank analysis: {n} coordinates, {n_passive} constraint rows of rank {rank}, "
                 f"{n_passive - rank} redundant")
    idle: tuple[IdleFreedom, ...] = ()
    if mobility > s:
        local, N = find_idle_motions(mech, cfg, jac, independent)
        if N.shape[1] == mobility - s:  # else the actuators are not independent: error below
            locks, idle = _idle_locks(desc, mech, cfg, local, N, mobility, s, rank_text)
            mech = _build(desc, passive + locks + active, len(passive) + len(locks), cfg)
            _, jac, _ = mech.evaluate(cfg, desc.theta_guess)
            n_passive = mech.n_passive
            independent = _independent_rows(jac[:n_passive])
            if len(independent) - rank != len(locks):
                raise ModelError(f"{desc.path}: [[actuators]]: mobility is {mobility} but {s} "
                                 f"actuator(s) are declared ({rank_text}); locking the "
                                 f"{len(locks)} idle freedom(s) did not remove them")
            mobility = n - len(independent)
    if mobility != s:
        raise ModelError(
            f"{desc.path}: [[actuators]]: mobility is {mobility} but {s} actuator(s) are declared "
            f"({rank_text})")
    square = np.concatenate([independent, np.arange(n_passive, mech.n_rows)])
    if np.linalg.matrix_rank(jac[square]) < n:
        raise ModelError(
            f"{desc.path}: [[actuators]]: the actuators do not determine the configuration at "
            f"the guess (singular with the actuators locked)")
    return _build(desc, [(a, b) for a, b in zip(mech.prim_i, mech.prim_f)],
                  len(passive) + len(idle), cfg, independent, square, idle)


def load_mechanism(name_or_path: str) -> Mechanism:
    return compile_mechanism(load_description(name_or_path))
