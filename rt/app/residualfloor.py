"""The contact observer's noise floor on a machine's own logs with a model (``pkrt identify``
reports it with the identified model): the observer of ``[protect]`` (``pkrt.rt.runtime.cycle.observer``)
replayed offline over each log's cycles, with H, D, p_ext from the exact reduction of the model
and its friction. The exact model is evaluated every ``EVERY`` cycles and linearly interpolated
between (H, D and p_ext are smooth in theta; at 1 kHz theta moves little in 5 ms), the logged
velocity used as measured (a log without velocities, all zero while the positions move, gets the
positions' central differences). Units: N or N m per actuator."""

from __future__ import annotations

import numpy as np

EVERY = 5  # cycles between exact evaluations


def _interp_rows(x: np.ndarray, idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Rows at every cycle of ``x`` (cycle positions) from ``vals`` at ``idx``, linearly."""
    flat = vals.reshape(len(idx), -1)
    out = np.empty((len(x), flat.shape[1]))
    for j in range(flat.shape[1]):
        out[:, j] = np.interp(x, idx, flat[:, j])
    return out.reshape((len(x),) + vals.shape[1:])


def log_residual(mech, log, viscous, coulomb, gain: float) -> np.ndarray:
    """The residual (n, s) of the observer with ``mech``'s exact model and this friction over a
    read log's rows (positions, velocities, commanded forces)."""
    from pkrt.models.kinematics.mechanism import AssemblyError
    from pkrt.models.reduction.exact import ExactModel
    from pkrt.rt.core.friction import V_EPS
    from pkrt.rt.runtime.cycle.controller import make_gains
    from pkrt.rt.runtime.logs.logstats import columns
    from pkrt.rt.runtime.cycle.observer import observer_state, replay

    pos, tau = columns(log.channels["pos"]), columns(log.channels["tau"])
    vel = columns(log.channels["vel"]) if "vel" in log.channels else np.zeros_like(pos)
    rate = float(log.header.get("rate_hz") or 1000.0)
    if not np.any(vel) and np.any(np.ptp(pos, axis=0) > 0):
        vel = np.gradient(pos, 1.0 / rate, axis=0)
    s, n = pos.shape[1], len(pos)
    idx = np.unique(np.r_[np.arange(0, n, EVERY), n - 1])
    exact = ExactModel(mech)
    H, D, p = np.zeros((len(idx), s, s)), np.zeros((len(idx), s, s * (s + 1) // 2)), np.zeros((len(idx), s))
    ok = np.ones(len(idx), dtype=bool)
    for j, k in enumerate(idx):
        try:
            r = exact(pos[k])
            H[j], D[j], p[j] = r.H, r.D, r.p_ext
        except (AssemblyError, ValueError):
            ok[j] = False
    idx, H, D, p = idx[ok], H[ok], D[ok], p[ok]
    x = np.arange(n, dtype=float)
    gains = make_gains(s, 1.0, 1.0, 1.0, 1.0, viscous, coulomb, V_EPS)
    out = np.zeros((n, s))
    replay(observer_state(s, gain, 1.0 / rate, enabled=True), log.cycles.astype(np.int64),
           np.ascontiguousarray(vel), _interp_rows(x, idx, H), _interp_rows(x, idx, D), _interp_rows(x, idx, p),
           gains, np.ascontiguousarray(tau), out)
    return out


def noise_floor(mech, logs: list[str], viscous, coulomb, gain: float) -> dict:
    """Per actuator over the logs: RMS, p99.9 and max |residual| (the first 10 cycles of each log
    left out: the observer starting), with the gain used."""
    from pkrt.rt.runtime.record.logfile import read_log

    res = np.vstack([log_residual(mech, read_log(p), viscous, coulomb, gain)[10:] for p in logs])
    a = np.abs(res)
    return {"gain": gain, "rms": np.sqrt((res ** 2).mean(axis=0)).tolist(),
            "p999": np.percentile(a, 99.9, axis=0).tolist(), "max": a.max(axis=0).tolist(), "cycles": len(res)}


__all__ = ["EVERY", "log_residual", "noise_floor"]
