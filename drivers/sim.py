"""The ``sim`` drive backend: the simulated plant (drivers/plant.py) read and driven as drives,
with sensor quantisation, noise and transport delay, and fault injection for tests.
Units: m or rad, N or N m, s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.schema import INTEGER, NUMBER, STRING, BOOL, PlantTable, spec
from pkrt.rt.core.tree import CLAMPED, OUT_OF_DOMAIN
from .base import DriveConfigError, DriveError, Drives
from .contact import Contact
# the plant's names, importable from here as before the plant had a module of its own
from .plant import (Plant, clip_force, plant_left_its_model, plant_step, plant_step_model,  # noqa: F401
                    plant_workspace, rk4_advance, stage_slope, stage_state, workspace_views)


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
        self.contacts: list[Contact] = []  # external forces at the tool (``inject_contact``)
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

    def inject_contact(self, contact: Contact) -> None:
        """An external force at the tool (``pkrt.drivers.contact``): a force step or a wall."""
        if contact.s != self.n_axes:
            raise DriveConfigError(f"contact for {contact.s} axes on a plant of {self.n_axes}")
        if self._ahead_t is not None:  # the step ahead did not know of it
            self._undo_ahead()
        self.contacts.append(contact)

    def contact_truth(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The external forces of the last period: actuator forces (s,) and the tool force (3,),
        summed over the contacts; None without contacts."""
        if not self.contacts:
            return None
        return (sum(c.tau for c in self.contacts), sum(c.force for c in self.contacts))

    def _active(self, kind: str, t: float):
        for k, at, v in self.injections:
            if k == kind and t >= at:
                return v
        return None

    def describe(self) -> dict:
        ms, visc, coul, flim, _ = self.plant.params.tolist()
        out = {"backend": self.backend, "mass_scale": ms, "viscous": visc, "coulomb": coul,
               "force_limit": flim, "substeps": self.plant.substeps, "noise": self.noise,
               "quantization": self.quantization, "force_noise": self.force_noise, "delay_cycles": len(self._hist) - 1,
               **self.plant.source}
        if self.contacts:
            out["contacts"] = [c.describe() for c in self.contacts]
        return out

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
        for j in range(n):  # skipped periods: the plant's step stays one period's
            if self.contacts:
                st = max(st, self._contact_step(tau, self._t + j * dt / n, dt / n))
            else:
                st = max(st, self.plant.step(tau, dt / n))
        return plant_left_its_model(self.plant, st)

    def _contact_step(self, tau: np.ndarray, t0: float, dt: float) -> int:
        """One period from t0 with the contacts' forces (one contact integrates; the others' forces
        of this period are added to the command, as their step would add them)."""
        first, *others = self.contacts
        extra = np.zeros(self.n_axes)
        for c in others:
            c.tau[:] = 0.0
            c.force[:] = 0.0
            if c.acts(t0):  # a second force step (a second wall is the first wall's job: not modelled)
                x, J = c.tool(self.plant.theta.copy())
                if c.kind == "force":
                    c.force[:] = c.f
                    c.tau[:] = np.asarray(J, float)[:3].T @ c.f
                    extra += c.tau
        return first.step(self.plant, tau + extra, t0, dt)

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

    # -- for a compiled loop stepping this plant itself (pkrt.rt.runtime.cycle.lockstep) -----------------
    @property
    def plain(self) -> bool:
        """The plant on its tree with no sensor noise or quantisation, no force noise, no
        transport delay and no fault injected: a read copies its state, a step is ``plant_step``."""
        return (self.plant.model is None and self.noise == 0.0 and self.quantization == 0.0
                and self.force_noise == 0.0 and len(self._hist) == 1 and not self.injections
                and not self.contacts and bool(self.period))

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
