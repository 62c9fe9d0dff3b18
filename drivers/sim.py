"""The simulated plant and the ``sim`` drive backend.

Plant: H(theta) thetadd = tau - h(theta, thetadot) + p_ext(theta) - friction(thetadot), with
H, D, p_ext from a reduced-dynamics tree finer than the controller's (the plant's physics; the
controller never sees it), all scaled by ``mass_scale`` (every mass and inertia times K).
Friction per actuator: viscous b thetadot + Coulomb Fc tanh(thetadot / v_eps); the applied
force is clipped to +/- force_limit. RK4 with ``substeps`` steps per period.
Units: m or rad, N or N m, s.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from pkrt.rt.friction import V_EPS
from pkrt.rt.tree import CLAMPED, OUT_OF_DOMAIN, eval_model_w, quad_velocities, work_size

from .base import DriveConfigError, DriveError, Drives


@njit(cache=True)
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


@njit(cache=True)
def _accel(T, th, thd, tau, params, H, D, p, w, rhs, out, work, L, y):
    """Forward dynamics acceleration; returns the tree status (or 3 if H is not SPD)."""
    ms, visc, coul = params[0], params[1], params[2]
    status = eval_model_w(T, th, H, D, p, work)
    quad_velocities(thd, w)
    s = th.shape[0]
    for i in range(s):
        acc = tau[i] + ms * p[i] - visc * thd[i] - coul * np.tanh(thd[i] / params[4])
        for c in range(w.shape[0]):
            acc -= ms * D[i, c] * w[c]
        rhs[i] = acc
        for j in range(s):
            H[i, j] *= ms
    if not _solve_spd(H, rhs, out, L, y):
        return 3
    return status


def plant_workspace(s: int) -> np.ndarray:
    """Scratch of ``plant_step`` for s axes (allocated once per plant): one flat array, so a
    call types one argument for it rather than a tuple of twelve."""
    m = s * (s + 1) // 2
    return np.zeros(2 * s * s + s * m + 3 * s + m + 2 * s + work_size(s) + 8 * s + 2 * s + s)


@njit(cache=True)
def plant_step(T, x, tau_cmd, dt, n_sub, params, ws):
    """Advance x = (theta, thetadot) by dt with RK4 in n_sub steps; return the worst status
    (0 ok, 1 clamped to the tree's box, 2 out of domain, 3 singular or non-finite).

    params = (mass_scale, viscous, coulomb, force_limit, v_eps); ws = plant_workspace(s).
    """
    s = tau_cmd.shape[0]
    m = s * (s + 1) // 2
    H = ws[:s * s].reshape((s, s))
    L = ws[s * s:2 * s * s].reshape((s, s))  # Cholesky factor: its upper triangle stays 0
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
    for i in range(s):
        tau[i] = min(max(tau_cmd[i], -params[3]), params[3])
    h = dt / n_sub
    worst = 0
    for _ in range(n_sub):
        for stage in range(4):
            c = 0.0 if stage == 0 else (0.5 if stage < 3 else 1.0)
            for i in range(2 * s):
                xs[i] = x[i] if stage == 0 else x[i] + c * h * k[stage - 1, i]
            st = _accel(T, xs[:s], xs[s:], tau, params, H, D, p, w, rhs, a, work, L, y)
            worst = max(worst, st)
            for i in range(s):
                k[stage, i] = xs[s + i]
                k[stage, s + i] = a[i]
        for i in range(2 * s):
            x[i] += h / 6.0 * (k[0, i] + 2.0 * k[1, i] + 2.0 * k[2, i] + k[3, i])
            if not np.isfinite(x[i]):
                worst = 3
    return worst


class Plant:
    """The simulated machine (state, parameters, one tree)."""

    def __init__(self, tree, viscous: float, coulomb: float, force_limit: float,
                 mass_scale: float = 1.0, substeps: int = 4, theta0=None):
        self.tree = tree
        self.s = tree.s
        self.params = np.array([mass_scale, viscous, coulomb, force_limit, V_EPS], dtype=float)
        self.substeps = int(substeps)
        self.x = np.zeros(2 * self.s)
        self.ws = plant_workspace(self.s)
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
        """Integrate over dt (s) with tau held (N or N m); returns the tree status."""
        if dt <= 0.0:
            return 0
        self.status = plant_step(self.tree.arrays, self.x, tau, dt, self.substeps, self.params, self.ws)
        return self.status

    def warm_up(self) -> None:
        x = self.x.copy()
        plant_step(self.tree.arrays, x, np.zeros(self.s), 1e-4, 1, self.params, self.ws)

    @classmethod
    def from_config(cls, config, mass_scale: float | None = None) -> "Plant":
        """The plant of a machine configuration's ``[drives]`` table (``plant_tree`` ...)."""
        from pkrt.rt.treefile import load_tree

        d = config.plant_table()  # [drives] of sim, else [emulator] (validated by the schema)
        table = "drives" if d is config.drives else "emulator"
        path = config.resolve(d.plant_tree)
        if Path(path).resolve() == Path(config.tree).resolve():
            raise DriveConfigError(f"{config.path}: [{table}], field 'plant_tree': the plant must not use the "
                                   f"controller's own tree (give a finer tree)")
        tree = load_tree(path)
        tree.header["path"] = path
        tree.header["file_hash"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        ms = d.mass_scale if mass_scale is None else float(mass_scale)
        if not ms > 0:
            raise DriveConfigError(f"{config.path}: mass scale must be positive, got {ms}")
        return cls(tree, d.viscous, d.coulomb, d.force_limit, ms, d.substeps)


class SimDrives(Drives):
    """Drive backend on the simulated plant, with sensor quantisation, noise and transport
    delay, and fault injection for tests (``inject``)."""

    backend = "sim"

    def __init__(self, plant: Plant, noise: float = 0.0, quantization: float = 0.0,
                 delay_cycles: int = 0, seed: int = 0):
        super().__init__(plant.s)
        self.plant = plant
        self.noise = noise
        self.quantization = quantization
        self.rng = np.random.default_rng(seed)
        self._t = None
        self._tau = np.zeros(plant.s)
        self._hist = np.zeros((delay_cycles + 1, 2 * plant.s))
        self._hist_n = 0
        self.injections: list[tuple[str, float, float]] = []  # (kind, at time s, value)
        self.period: float | None = None  # the loop period (s): a longer gap is stepped period by period

    @classmethod
    def from_config(cls, config, overrides: dict) -> "SimDrives":
        config = config.with_drives(overrides) if overrides else config
        d = config.drives
        plant = Plant.from_config(config)
        drives = cls(plant, d.noise, d.quantization, d.delay_cycles, d.seed)
        drives.period = 1.0 / float(config.rate_hz)
        return drives

    def inject(self, kind: str, at: float, value: float = 0.0) -> None:
        """Fault injection: ``nan`` (feedback NaN from time ``at``), ``stale`` (no fresh
        feedback), ``push`` (an external force ``value`` N on every axis), ``freeze`` (the
        plant stops: feedback no longer changes)."""
        if kind not in ("nan", "stale", "push", "freeze"):
            raise DriveConfigError(f"unknown sim fault '{kind}' (nan, stale, push, freeze)")
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
                "quantization": self.quantization, "delay_cycles": len(self._hist) - 1,
                "plant_tree": self.plant.tree.header.get("path"),
                "plant_tree_hash": self.plant.tree.header.get("file_hash")}

    def prepare(self, theta0: np.ndarray) -> None:
        self.plant.reset(theta0)
        self._t = None
        self._hist_n = 0

    def _do_configure(self) -> None:
        self._t = None
        self._hist_n = 0

    def _do_disable(self) -> None:
        self._tau[:] = 0.0

    def read(self, t: float):
        fb = self.feedback
        inj = bool(self.injections)
        if self._t is not None and not (inj and self._active("freeze", t) is not None):
            push = self._active("push", t) if inj else None
            tau = self._tau if push is None else self._tau + push
            dt = t - self._t
            n = int(round(dt / self.period)) if self.period and dt > 1.5 * self.period else 1
            st = 0
            for _ in range(n):  # skipped periods: the plant's step stays one period's
                st = max(st, self.plant.step(tau, dt / n))
            if st == OUT_OF_DOMAIN:
                raise DriveError("simulated plant left its model's domain")
            if st == 3:
                raise DriveError("simulated plant state is not finite")
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


__all__ = ["Plant", "SimDrives", "plant_step", "plant_workspace", "CLAMPED", "OUT_OF_DOMAIN"]
