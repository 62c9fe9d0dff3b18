"""The simulated plant: its dynamics, integrator and model sources (the ``sim`` drive backend's
machine, drivers/sim.py, and the HIL emulators' plant).

Plant: H(theta) thetadd = tau - h(theta, thetadot) + p_ext(theta) - friction(thetadot), with
H, D, p_ext from a reduced-dynamics tree finer than the controller's (the plant's physics; the
controller never sees it) or from the exact reduction (``plant = "exact"``: a callable built
outside the drivers, e.g. by ``pkrt run``, evaluated at every RK4 stage), all scaled by
``mass_scale`` (every mass and inertia times K). Friction per actuator: viscous b thetadot +
Coulomb Fc tanh(thetadot / v_eps); the applied force is clipped to +/- force_limit. RK4 with
``substeps`` steps per period.
Units: m or rad, N or N m, s.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from pkrt.rt.core.friction import V_EPS
from pkrt.rt.core.tree import CLAMPED, OUT_OF_DOMAIN, eval_model_w, quad_velocities, work_size

from .base import DriveConfigError


@njit(cache=True, inline="always")
def _solve_spd(A, b, x, L, y):
    """x = A^-1 b for a small symmetric positive definite A (Cholesky into the preallocated
    L (n, n); y (n,) scratch)."""
    n = b.shape[0]
    for i in range(n):
        for j in range(i + 1):
            acc = A[i, j]
            for k in range(j):
                acc -= L[i, k] * L[j, k]
            if i == j:
                if acc <= 0.0:
                    return False
                L[i, i] = np.sqrt(acc)
            else:
                L[i, j] = acc / L[j, j]
    for i in range(n):
        acc = b[i]
        for k in range(i):
            acc -= L[i, k] * y[k]
        y[i] = acc / L[i, i]
    for i in range(n - 1, -1, -1):
        acc = y[i]
        for k in range(i + 1, n):
            acc -= L[k, i] * x[k]
        x[i] = acc / L[i, i]
    return True


@njit(cache=True, inline="always")
def _forward(th, thd, tau, params, H, D, p, w, rhs, out, L, y):
    """thetadd into ``out`` from the model's H, D, p_ext at th (unscaled, filled by the tree or
    the exact model): mass_scale, friction and the clipped force tau applied; False when the
    scaled H is not SPD."""
    ms, visc, coul = params[0], params[1], params[2]
    quad_velocities(thd, w)
    s = th.shape[0]
    for i in range(s):
        acc = tau[i] + ms * p[i] - visc * thd[i] - coul * np.tanh(thd[i] / params[4])
        for c in range(w.shape[0]):
            acc -= ms * D[i, c] * w[c]
        rhs[i] = acc
        for j in range(s):
            H[i, j] *= ms
    return _solve_spd(H, rhs, out, L, y)


def plant_workspace(s: int) -> np.ndarray:
    """Scratch of ``plant_step`` for s axes (allocated once per plant): one flat array, so a
    call types one argument for it rather than a tuple of twelve."""
    m = s * (s + 1) // 2
    return np.zeros(2 * s * s + s * m + 3 * s + m + 2 * s + work_size(s) + 8 * s + 2 * s + s)


@njit(cache=True, inline="always")
def workspace_views(ws, s):
    """The arrays inside ``plant_workspace(s)``: H, L (Cholesky factor: its upper triangle stays
    0), D, p, rhs, tau (clipped force), w ([td td]), y, a (thetadd), work (the tree's), k (RK4
    slopes, (4, 2 s)), xs (the stage state)."""
    m = s * (s + 1) // 2
    H = ws[:s * s].reshape((s, s))
    L = ws[s * s:2 * s * s].reshape((s, s))
    o = 2 * s * s
    D = ws[o:o + s * m].reshape((s, m))
    o += s * m
    p, rhs, tau, w = ws[o:o + s], ws[o + s:o + 2 * s], ws[o + 2 * s:o + 3 * s], ws[o + 3 * s:o + 3 * s + m]
    o += 3 * s + m
    y, a = ws[o:o + s], ws[o + s:o + 2 * s]
    o += 2 * s
    nw = work_size(s)
    work = ws[o:o + nw]
    o += nw
    k = ws[o:o + 8 * s].reshape((4, 2 * s))
    xs = ws[o + 8 * s:o + 10 * s]
    return H, L, D, p, rhs, tau, w, y, a, work, k, xs


@njit(cache=True, inline="always")
def clip_force(tau_cmd, tau, limit):
    """tau = tau_cmd clipped to +/- limit (N or N m)."""
    for i in range(tau.shape[0]):
        tau[i] = min(max(tau_cmd[i], -limit), limit)


@njit(cache=True, inline="always")
def stage_state(x, k, stage, h, xs):
    """The state at RK4 stage ``stage`` (0..3) of a step h from x, into xs."""
    c = 0.0 if stage == 0 else (0.5 if stage < 3 else 1.0)
    for i in range(xs.shape[0]):
        xs[i] = x[i] if stage == 0 else x[i] + c * h * k[stage - 1, i]


@njit(cache=True, inline="always")
def stage_slope(k, stage, xs, a):
    """Slope of stage ``stage``: (thetadot, thetadd)."""
    s = a.shape[0]
    for i in range(s):
        k[stage, i] = xs[s + i]
        k[stage, s + i] = a[i]


@njit(cache=True, inline="always")
def rk4_advance(x, k, h):
    """x += h/6 (k0 + 2 k1 + 2 k2 + k3); 3 if the state is no longer finite, else 0."""
    st = 0
    for i in range(x.shape[0]):
        x[i] += h / 6.0 * (k[0, i] + 2.0 * k[1, i] + 2.0 * k[2, i] + k[3, i])
        if not np.isfinite(x[i]):
            st = 3
    return st


@njit(cache=True, _nrt=False)
def plant_step(T, x, tau_cmd, dt, n_sub, params, ws):
    """Advance x = (theta, thetadot) by dt with RK4 in n_sub steps, H, D, p_ext from the tree T;
    return the worst status (0 ok, 1 clamped to the tree's box, 2 out of domain, 3 singular or
    non-finite).

    params = (mass_scale, viscous, coulomb, force_limit, v_eps); ws = plant_workspace(s).
    Compiled without numba's runtime and with its helpers inlined (it allocates nothing; each
    view and call otherwise cost reference counting): 6.8 against 10.5 us a 4-substep step of
    the Orthoglide's plant tree, 5.0 of them its 16 model evaluations (best of 30, side by side).
    """
    s = tau_cmd.shape[0]
    H, L, D, p, rhs, tau, w, y, a, work, k, xs = workspace_views(ws, s)
    clip_force(tau_cmd, tau, params[3])
    h = dt / n_sub
    worst = 0
    for _ in range(n_sub):
        for stage in range(4):
            stage_state(x, k, stage, h, xs)
            st = eval_model_w(T, xs[:s], H, D, p, work)
            if not _forward(xs[:s], xs[s:], tau, params, H, D, p, w, rhs, a, L, y):
                st = 3
            worst = max(worst, st)
            stage_slope(k, stage, xs, a)
        worst = max(worst, rk4_advance(x, k, h))
    return worst


def plant_step_model(model, x, tau_cmd, dt, n_sub, params, views) -> int:
    """``plant_step`` with H, D, p_ext from ``model(theta, H, D, p) -> status`` (a Python
    callable: the exact reduction, ``pkrt.rt.app.reference.ExactInLoop``) at every RK4 stage;
    the same kernels for everything else. views = workspace_views(plant_workspace(s), s)."""
    s = tau_cmd.shape[0]
    H, L, D, p, rhs, tau, w, y, a, work, k, xs = views
    clip_force(tau_cmd, tau, params[3])
    h = dt / n_sub
    worst = 0
    th, thd = xs[:s], xs[s:]
    for _ in range(n_sub):
        for stage in range(4):
            stage_state(x, k, stage, h, xs)
            st = model(th, H, D, p)
            if st == OUT_OF_DOMAIN:  # H, D, p were not filled
                return st
            if not _forward(th, thd, tau, params, H, D, p, w, rhs, a, L, y):
                st = 3
            worst = max(worst, st)
            stage_slope(k, stage, xs, a)
        worst = max(worst, rk4_advance(x, k, h))
    return worst


def plant_left_its_model(plant: "Plant", status: int) -> str | None:
    """Why a plant step's ``status`` leaves the plant without physics (None if it does not):
    out of the model's domain, out of its tree's box (a region tree: clamping would integrate
    wrong dynamics), or a state that is not finite. The simulated drives stop on it, the
    emulated drives go to fault."""
    if status == OUT_OF_DOMAIN:
        return "simulated plant left its model's domain"
    if status == 3:
        return "simulated plant state is not finite"
    if status == CLAMPED:
        return (f"simulated plant left its tree's box at position {np.round(plant.theta, 6).tolist()} "
                f"(box {np.c_[plant.tree.lo, plant.tree.hi].tolist()})")
    return None


class Plant:
    """The simulated machine: state, parameters and one model source, the plant's tree or
    ``model`` (a callable (theta, H, D, p) -> status filling H, D, p_ext: the exact reduction,
    built outside the drivers; ``n_axes`` then gives s). ``source`` describes it (logs)."""

    def __init__(self, tree, viscous: float, coulomb: float, force_limit: float,
                 mass_scale: float = 1.0, substeps: int = 4, theta0=None, *, model=None,
                 n_axes: int | None = None, source: dict | None = None):
        if (tree is None) == (model is None):
            raise ValueError("Plant: give a tree or a model, not both")
        self.tree, self.model = tree, model
        self.s = tree.s if tree is not None else int(n_axes)
        self.source = source if source is not None else {"plant_tree": tree.header.get("path"),
                                                         "plant_tree_hash": tree.header.get("file_hash")}
        self.params = np.array([mass_scale, viscous, coulomb, force_limit, V_EPS], dtype=float)
        self.substeps = int(substeps)
        self.x = np.zeros(2 * self.s)
        self.ws = plant_workspace(self.s)
        self.views = workspace_views(self.ws, self.s)
        if theta0 is not None:
            self.x[: self.s] = theta0
        self.status = 0
        self.warm_up()

    @property
    def theta(self) -> np.ndarray:
        return self.x[: self.s]

    @property
    def theta_dot(self) -> np.ndarray:
        return self.x[self.s:]

    def reset(self, theta, theta_dot=None) -> None:
        self.x[: self.s] = theta
        self.x[self.s:] = 0.0 if theta_dot is None else theta_dot

    def step(self, tau: np.ndarray, dt: float, substeps: int | None = None) -> int:
        """Integrate over dt (s) with tau held (N or N m) in ``substeps`` RK4 steps (default: the
        plant's); returns the model's status."""
        if dt <= 0.0:
            return 0
        n = self.substeps if substeps is None else substeps
        if self.model is None:
            self.status = plant_step(self.tree.arrays, self.x, tau, dt, n, self.params, self.ws)
        else:
            self.status = plant_step_model(self.model, self.x, tau, dt, n, self.params, self.views)
        return self.status

    def warm_up(self) -> None:
        """Compile (or load) the kernels before the loop; the model is not called."""
        x = self.x.copy()
        if self.model is None:
            plant_step(self.tree.arrays, x, np.zeros(self.s), 1e-4, 1, self.params, self.ws)
            return
        H, L, D, p, rhs, tau, w, y, a, work, k, xs = self.views
        clip_force(np.zeros(self.s), tau, self.params[3])
        stage_state(x, k, 1, 1e-4, xs)
        H[...] = np.eye(self.s)
        _forward(xs[:self.s], xs[self.s:], tau, self.params, H, D, p, w, rhs, a, L, y)
        stage_slope(k, 0, xs, a)
        rk4_advance(x, k, 1e-4)

    @classmethod
    def from_config(cls, config, mass_scale: float | None = None, model=None) -> "Plant":
        """The plant of a machine configuration's ``[drives]`` table (``plant_tree``, or
        ``plant = "exact"`` with ``model``, the exact reduction built by the caller)."""
        from pkrt.rt.core.treefile import load_tree

        d = config.plant_table()  # [drives] of sim, else [emulator] (validated by the schema)
        table = "drives" if d is config.drives else "emulator"
        ms = d.mass_scale if mass_scale is None else float(mass_scale)
        if not ms > 0:
            raise DriveConfigError(f"{config.path}: mass scale must be positive, got {ms}")
        if d.plant == "exact":
            if model is None:
                raise DriveConfigError(f"{config.path}: [{table}], field 'plant': \"exact\" needs the exact model, "
                                       f"built from the machine's model by `pkrt run` (not available here)")
            path = config.plant_model_path
            source = {"plant": "exact", "plant_model": path, "plant_model_hash": _file_hash(path)}
            return cls(None, d.viscous, d.coulomb, d.force_limit, ms, d.substeps, model=model,
                       n_axes=config.limits.position.shape[0], source=source)
        path = config.resolve(d.plant_tree)
        if Path(path).resolve() == Path(config.tree).resolve():
            raise DriveConfigError(f"{config.path}: [{table}], field 'plant_tree': the plant must not use the "
                                   f"controller's own tree (give a finer tree)")
        tree = load_tree(path)
        n_axes = config.limits.position.shape[0]
        if tree.s != n_axes:  # another machine's tree: its model says nothing about this machine
            built = (tree.header.get("model") or {}).get("name", "?")
            raise DriveConfigError(f"{config.path}: [{table}], field 'plant_tree': {path} has {tree.s} axes "
                                   f"(built from model '{built}'), this machine has {n_axes}")
        tree.header["path"] = path
        tree.header["file_hash"] = _file_hash(path)
        return cls(tree, d.viscous, d.coulomb, d.force_limit, ms, d.substeps)


def _file_hash(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
