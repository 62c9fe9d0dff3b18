"""Identification data without a run: a truth model's Fourier motion through its exact inverse
dynamics plus friction, force noise and position quantisation, written by the real log writer as
a run log of the machine (the tests' identification data, and the contact detection benchmark's
identified model: ``pkrt.rt.bench.protectcases``)."""

from __future__ import annotations

import numpy as np

from pkrt.models.kinematics.mechanism import Mechanism
from pkrt.models.reduction.exact import ExactModel
from pkrt.rt.core.friction import V_EPS
from pkrt.rt.runtime.record.logfile import LogWriter
from pkrt.rt.runtime.machine.runsetup import channel_list


def fourier_motion(mech: Mechanism, duration: float, rate: float, seed: int = 0, harmonics: int = 5,
                   f0: float = 0.4, fill: float = 0.7, shift: float = 0.0):
    """theta, theta_dot, theta_ddot (n, s): a random finite Fourier series per axis about the
    middle of the ranges, its amplitude ``fill`` of the half-width."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(duration * rate))) / rate + shift
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    c, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    s = mech.n_act
    th, td, tdd = np.tile(c, (len(t), 1)), np.zeros((len(t), s)), np.zeros((len(t), s))
    for i in range(s):
        a = rng.normal(size=harmonics) / np.arange(1, harmonics + 1)
        b = rng.normal(size=harmonics) / np.arange(1, harmonics + 1)
        k = fill * half[i] / (np.abs(a).sum() + np.abs(b).sum())
        for h in range(harmonics):
            w = 2 * np.pi * f0 * (h + 1)
            sn, cs = np.sin(w * t), np.cos(w * t)
            th[:, i] += k * (a[h] * sn + b[h] * cs)
            td[:, i] += k * w * (a[h] * cs - b[h] * sn)
            tdd[:, i] += -k * w * w * (a[h] * sn + b[h] * cs)
    return t, th, td, tdd


def write_log(path, mech: Mechanism, truth: Mechanism, duration: float = 8.0, rate: float = 1000.0,
              viscous=15.0, coulomb=4.0, noise: float = 1.0, quantum: float = 1e-6, seed: int = 0,
              fault_at: int | None = None, motion_seed: int = 0, reference: bool = True) -> dict:
    """A run log of ``mech``'s machine whose physics is ``truth``; returns the truth. The
    reference is the motion itself (perfect tracking), or with ``reference=False`` the first
    position held (a log whose reference the machine did not follow)."""
    t, th, _, _ = fourier_motion(mech, duration, rate, motion_seed)
    # a drive holds command k over the period after sample k: the force that made the motion
    # is the truth's at mid-period (what pkrt replay and identify assume of a run log)
    _, thm, td, tdd = fourier_motion(mech, duration, rate, motion_seed, shift=0.5 / rate)
    exact = ExactModel(truth)
    s = mech.n_act
    visc, coul = np.broadcast_to(viscous, s), np.broadcast_to(coulomb, s)
    rng = np.random.default_rng(seed)
    tau = np.array([exact(a).tau(b, c) for a, b, c in zip(thm, td, tdd)])
    tau += visc * td + coul * np.tanh(td / V_EPS) + noise * rng.normal(size=tau.shape)
    pos = np.round(th / quantum) * quantum if quantum else th
    unit = mech.actuator_units[0]
    header = {"model_name": mech.name, "axes": mech.actuator_names, "units": mech.actuator_units,
              "rate_hz": rate, "lockstep": True}
    w = LogWriter(str(path), header, channel_list(s, unit))
    for k in range(len(t)):
        w.row[:] = 0.0
        w.views["t"][:] = k / rate
        w.views["pos"][:] = pos[k]
        w.views["ref_pos"][:] = th[k] if reference else th[0]
        w.views["tau"][:] = tau[k]
        w.commit()
        if fault_at is not None and k == fault_at:
            w.event(k, "fault", "following error 0.0123 m > 0.01 on q1")
    w.close({})
    return {"viscous": visc, "coulomb": coul, "noise": noise}
