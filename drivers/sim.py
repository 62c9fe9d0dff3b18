"""The simulated plant and the ``sim`` drive backend.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from pkrt.rt.core.friction import V_EPS
from pkrt.rt.core.tree import CLAMPED, OUT_OF_DOMAIN, eval_model_w, quad_velocities, work_size

from pkrt.rt.core.schema import INTEGER, NUMBER, STRING, BOOL, PlantTable, spec
from .base import DriveConfigError, DriveError, Drives


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

    def step(self, tau: np.ndarray, dt: float) -> int:
        """Integrate over dt (s) with tau held (N or N m); returns the model's status."""
        if dt <= 0.0:
            return 0
        if self.model is None:
            self.status = plant_step(self.tree.arrays, self.x, tau, dt, self.substeps, self.params, self.ws)
        else:
            self.status = plant_step_model(self.model, self.x, tau, dt, self.substeps, self.params, self.views)
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



@dataclass(frozen=True, kw_only=True)
class SimDrivesTable(PlantTable):
    """``[drives]`` with ``backend = "sim"``: the simulated plant and its sensors."""

    backend: str = spec(STRING, "drive backend", choices=("sim",))
    noise: float = spec(NUMBER, "position noise, standard deviation", 0.0, unit="m or rad", lo=0.0)
    quantization: float = spec(NUMBER, "position quantum (0: none)", 0.0, unit="m or rad", lo=0.0)
    force_noise: float = spec(NUMBER, "force disturbance, standard deviation per actuator and cycle, added to the "
                              "applied force (the logged command does not have it)", 0.0, unit="N or N m", lo=0.0)
    delay_cycles: int = spec(INTEGER, "transport delay of the feedback", 0, unit="cycles", lo=0, hi=10000)
    seed: int = spec(INTEGER, "noise generator seed", 0, lo=0)
    lockstep: bool = spec(BOOL, "runs are lockstep (virtual clock) even without --lockstep, said in the summary: "
                          "for a plant that cannot keep real time (plant = \"exact\")", False)


class SimDrives(Drives):
    """Drive backend on the simulated plant, with sensor quantisation, noise and transport
    delay, and fault injection for tests (``inject``)."""

    DRIVES_TABLE = SimDrivesTable  # the [drives] table of this family
    EMULATOR_TABLE = None  # the [emulator] table of its HIL bus


    backend = "sim"

    def __init__(self, plant: Plant, noise: float = 0.0, quantization: float = 0.0,
                 delay_cycles: int = 0, seed: int = 0, force_noise: float = 0.0):
        super().__init__(plant.s)
        self.plant = plant
        self.noise = noise
        self.force_noise = force_noise
        self.quantization = quantization
        self.rng = np.random.default_rng(seed)
        self._t = None
        self._tau = np.zeros(plant.s)
        self._hist = np.zeros((delay_cycles + 1, 2 * plant.s))
        self._hist_n = 0
        self.injections: list[tuple[str, float, float]] = []  # (kind, at time s, value)
        self.period: float | None = None  # the loop period (s): a longer gap is stepped period by period
        # ``advance``: the loop time the plant was stepped to ahead of its read (None: not ahead),
        # why it left its model on the way, the state before, the force noise drawn for it
        self._ahead_t: float | None = None
        self._ahead_reason: str | None = None
        self._x_before = np.zeros(2 * plant.s)
        self._drawn = self._redraw = None

    @classmethod
    def from_config(cls, config, overrides: dict, plant_model=None) -> "SimDrives":
        """``plant_model``: the exact reduction for ``plant = "exact"`` (``Plant.from_config``)."""
        config = config.with_drives(overrides) if overrides else config
        d = config.drives
        plant = Plant.from_config(config, model=plant_model)
        drives = cls(plant, d.noise, d.quantization, d.delay_cycles, d.seed, d.force_noise)
        drives.period = 1.0 / float(config.rate_hz)
        return drives

    def inject(self, kind: str, at: float, value: float = 0.0) -> None:
        """Fault injection: ``nan`` (feedback NaN from time ``at``), ``stale`` (no fresh
        feedback), ``push`` (an external force ``value`` N on every axis), ``freeze`` (the
        plant stops: feedback no longer changes)."""
        if kind not in ("nan", "stale", "push", "freeze"):
            raise DriveConfigError(f"unknown sim fault '{kind}' (nan, stale, push, freeze)")
        if self._ahead_t is not None:  # the step ahead did not know of it
            self._undo_ahead()
        self.injections.append((kind, float(at), float(value)))

    def _active(self, kind: str, t: float):
        for k, at, v in self.injections:
            if k == kind and t >= at:
                return v
        return None

    def describe(self) -> dict:
        ms, visc, coul, flim, _ = self.plant.params.tolist()
        return {"backend": self.backend, "mass_scale": ms, "viscous": visc, "coulomb": coul,
                "force_limit": flim, "substeps": self.plant.substeps, "noise": self.noise,
                "quantization": self.quantization, "force_noise": self.force_noise, "delay_cycles": len(self._hist) - 1, **self.plant.source}

    def prepare(self, theta0: np.ndarray) -> None:
        self.plant.reset(theta0)
        self._t = self._ahead_t = self._redraw = None
        self._hist_n = 0

    def _do_configure(self) -> None:
        self._t = self._ahead_t = self._redraw = None
        self._hist_n = 0

    def _do_disable(self) -> None:
        self._tau[:] = 0.0
        if self._ahead_t is not None:  # stepped with the torque on: the next read steps without
            self._undo_ahead()

    def read(self, t: float):
        fb = self.feedback
        inj = bool(self.injections)
        ahead, self._ahead_t = self._ahead_t, None
        if ahead is not None and ahead == t:  # stepped ahead to this read by ``advance``
            if self._ahead_reason is not None:
                raise DriveError(self._ahead_reason)
        else:
            if ahead is not None:  # stepped towards another time: undone, stepped again below
                self._undo_ahead()
            reason = self._step_to(t)
            if reason is not None:
                raise DriveError(reason)
        self._t = t
        s = self.n_axes
        x = self.plant.x
        if len(self._hist) > 1:  # transport delay: a ring of past states
            n = len(self._hist)
            self._hist[self._hist_n % n] = x
            x = self._hist[max(self._hist_n - (n - 1), 0) % n]
            self._hist_n += 1
        fb.position[:] = x[:s]
        fb.velocity[:] = x[s:]
        if self.noise > 0.0:
            fb.position += self.rng.normal(0.0, self.noise, s)
        if self.quantization > 0.0:
            np.round(fb.position / self.quantization, out=fb.position)
            fb.position *= self.quantization
        fb.fresh = True
        if inj:
            if self._active("nan", t) is not None:
                fb.position[0] = np.nan
            fb.fresh = self._active("stale", t) is None
        fb.stamp = t
        return fb

    def write(self, tau: np.ndarray) -> None:
        if self.torque_on:
            self._tau[:] = tau
        else:
            self._tau[:] = 0.0

    def _step_to(self, t: float) -> str | None:
        """Integrate the plant from the last read's time to t with the command held (the push
        and force noise of time t applied); why the plant left its model, or None. The force
        noise drawn for a step that was undone is used again, so the draws keep their order."""
        if self._t is None or (self.injections and self._active("freeze", t) is not None):
            return None
        push = self._active("push", t) if self.injections else None
        tau = self._tau if push is None else self._tau + push
        if self.force_noise > 0.0 and self.torque_on:  # the drive's force is not the command
            draw = self._redraw if self._redraw is not None else self.rng.normal(0.0, self.force_noise, self.n_axes)
            self._redraw, self._drawn = None, draw
            tau = tau + draw
        dt = t - self._t
        n = int(round(dt / self.period)) if self.period and dt > 1.5 * self.period else 1
        st = 0
        for _ in range(n):  # skipped periods: the plant's step stays one period's
            st = max(st, self.plant.step(tau, dt / n))
        return plant_left_its_model(self.plant, st)

    def advance(self, t_next: float) -> None:
        """Step the plant now to the next read at ``t_next`` (the same step that read would
        take, so the same feedback); that read then only copies the state. A read at another
        time, an injection or a disable in between undoes the step (``_undo_ahead``)."""
        if self._t is None or self._ahead_t is not None:
            return
        self._x_before[:] = self.plant.x
        self._drawn = None
        self._ahead_reason = self._step_to(t_next)
        self._ahead_t = t_next

    # -- for a compiled loop stepping this plant itself (pkrt.rt.runtime.lockstep) -----------------
    @property
    def plain(self) -> bool:
        """The plant on its tree with no sensor noise or quantisation, no force noise, no
        transport delay and no fault injected: a read copies its state, a step is ``plant_step``."""
        return (self.plant.model is None and self.noise == 0.0 and self.quantization == 0.0
                and self.force_noise == 0.0 and len(self._hist) == 1 and not self.injections
                and bool(self.period))

    def step_arrays(self) -> tuple:
        """What ``plant_step`` takes and ``advance`` keeps: (plant tree arrays, state x, the held
        command, substeps, parameters, workspace, the state before the last step)."""
        p = self.plant
        return (p.tree.arrays, p.x, self._tau, p.substeps, p.params, p.ws, self._x_before)

    def ahead_to(self, t: float) -> bool:
        """Whether the plant was stepped ahead to a read at ``t`` (``advance``) and that step
        left it on its model: the read would only copy the state."""
        return self._ahead_t == t and self._ahead_reason is None

    def stepped(self, t_read: float, t_next: float | None, status: int) -> None:
        """After a compiled loop read the plant at ``t_read`` and (unless ``t_next`` is None)
        stepped it ahead to ``t_next`` with the step's ``status``, as ``read`` then ``advance``
        would leave these drives (the state before that step is in ``step_arrays``)."""
        self._t = self.feedback.stamp = t_read
        self.feedback.fresh = True
        self._ahead_t, self._ahead_reason, self._drawn = None, None, None
        if t_next is not None:
            self._ahead_t = t_next
            self.plant.status = status
            self._ahead_reason = plant_left_its_model(self.plant, status)

    def _undo_ahead(self) -> None:
        """Back to the state before ``advance``'s step (its force noise draw kept for the redo)."""
        self.plant.x[:] = self._x_before
        self._redraw, self._ahead_t, self._ahead_reason = self._drawn, None, None


__all__ = ["Plant", "SimDrives", "plant_left_its_model", "plant_step", "plant_step_model", "plant_workspace", "workspace_views",
           "CLAMPED", "OUT_OF_DOMAIN"]
