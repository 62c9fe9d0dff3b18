"""``pkrt replay LOG``: run a logged reference again and compare, or (``--offline``) judge the
model against the logged motion.

Replay: the log's reference (``ref_pos``, ``ref_vel``, ``ref_acc``, sample for sample when the
rates agree, periods a real-time run skipped filled by quintic Hermite segments; otherwise a
cubic spline of ``ref_pos``) runs through
``pkrt.rt.runtime.machine.run.run_session`` on the machine the log names (or ``--machine``), with the logged
sim plant settings unless overridden; the replay's log is compared cycle by cycle with the
original: per axis RMS and max of the position and commanded torque differences.

Offline: model torques tau_model = H(theta) theta_dd + D(theta) [td td] - p_ext(theta) from
the controller's tree (or ``--tree``) at the logged positions, with theta_dot and theta_dd from
a Savitzky-Golay derivative of the positions: a symmetric FIR, so zero phase (derived
accelerations line up in time with the logged torques, no lag to correct); a local cubic fit
over about 21 ms keeps the motion band (the -3 dB frequency, about 50 Hz at 1 kHz, is reported)
and rejects sensor noise above it. The commanded torque is compared through the same filter,
after averaging consecutive commands (tau_{k-1} + tau_k) / 2: a command is held over the period
after its sample (zero-order hold), so the motion around sample k reflects the command half a
period earlier. The residual per axis (RMS, max, mean), and a least-squares friction fit of it
(viscous, Coulomb, offset), tell how well the rigid-body model explains the machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.friction import V_EPS
from pkrt.rt.runtime.record.logfile import Log, LogFileError, read_log
from pkrt.rt.runtime.logs.logstats import columns, loop_cycles

SIM_PLANT_KEYS = ("mass_scale", "viscous", "coulomb", "force_limit", "substeps", "noise", "force_noise",
                  "quantization", "delay_cycles", "seed")


# -- shared ----------------------------------------------------------------------------------
def _need(log: Log, *names: str) -> None:
    missing = [n for n in names if n not in log.channels]
    if missing:
        raise LogFileError(f"{log.path}: the log has no {', '.join(repr(m) for m in missing)} channel")
    if log.n_cycles < 2:
        raise LogFileError(f"{log.path}: the log holds {log.n_cycles} cycle(s); nothing to replay")


def log_rate(log: Log) -> float:
    """The logged loop rate (Hz): the header's, else from the time channel."""
    r = log.header.get("rate_hz")
    if isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0:
        return float(r)
    t = log.channels["t"]
    return float((log.cycles[-1] - log.cycles[0]) / (t[-1] - t[0]))


def machine_for_log(log: Log, machine: str | None):
    """The machine configuration: ``--machine``, else the log's ``machine_path``, else the
    configuration named in the logged ``[machine]`` table."""
    from pkrt.rt.runtime.machine.config import load_machine

    if machine:
        return load_machine(machine)
    path = log.header.get("machine_path")
    if isinstance(path, str):  # as recorded, else relative to the log's folder
        for cand in (Path(path), Path(log.path).parent / path):
            if cand.is_file():
                return load_machine(str(cand))
    raw = log.header.get("machine")
    name = raw.get("machine", {}).get("name") if isinstance(raw, dict) else None
    if isinstance(name, str):
        try:
            return load_machine(name.removesuffix("-sim"))
        except UserError:
            pass
    raise UserError(f"{log.path}: the machine this log names ({path or name or 'none'}) cannot be "
                    f"found here; give --machine")


def _contiguous(log: Log) -> bool:
    """True when no loop period is missing between the rows (a real-time loop skips periods
    after an overrun; its rows then have gaps in loop time)."""
    k = loop_cycles(log)
    return len(k) > 0 and k[-1] - k[0] == len(k) - 1


def reference_from_log(log: Log, rate_hz: float):
    """The logged reference as a ``Planned`` at rate_hz, and whether it is sample-exact."""
    from pkrt.rt.core.plan import Planned

    _need(log, "t", "ref_pos")
    desc = {"kind": "replay", "log": log.path, "original": log.header.get("trajectory")}
    have_all = "ref_vel" in log.channels and "ref_acc" in log.channels
    if have_all and _contiguous(log) and abs(log_rate(log) - rate_hz) < 1e-9:
        p, v, a = (np.ascontiguousarray(columns(log.channels[n])) for n in ("ref_pos", "ref_vel", "ref_acc"))
        return Planned(rate_hz, p.copy(), v.copy(), a.copy(), desc), True
    if have_all and abs(log_rate(log) - rate_hz) < 1e-9 and np.all(np.diff(loop_cycles(log)) >= 1):
        return _fill_gaps(log, rate_hz, desc), False
    from scipy.interpolate import CubicSpline

    t = log.channels["t"] - log.channels["t"][0]
    sp = CubicSpline(t, columns(log.channels["ref_pos"]), bc_type="not-a-knot" if len(t) > 3 else "natural")
    tt = np.arange(int(math.floor(t[-1] * rate_hz + 1e-9)) + 1) / rate_hz
    return Planned(rate_hz, sp(tt), sp(tt, 1), sp(tt, 2), desc), False


def _fill_gaps(log: Log, rate_hz: float, desc: dict):
    """The logged reference at every loop cycle from the first row to the last: logged rows
    as they are, skipped periods filled by quintic Hermite segments through the position,
    velocity and acceleration at both ends (continuous to the second derivative)."""
    from pkrt.rt.core.plan import Planned

    k = loop_cycles(log)
    k = k - k[0]
    p, v, a = (columns(log.channels[n]) for n in ("ref_pos", "ref_vel", "ref_acc"))
    n = int(k[-1]) + 1
    P, V, A = (np.empty((n, p.shape[1])) for _ in range(3))
    P[k], V[k], A[k] = p, v, a
    for i in np.flatnonzero(np.diff(k) > 1):
        k0, k1 = int(k[i]), int(k[i + 1])
        T = (k1 - k0) / rate_hz
        u = (np.arange(k0 + 1, k1) - k0)[:, None] / (k1 - k0)
        # quintic with p, v, a given at u = 0 and 1 (time scaled by T)
        p0, v0, a0, p1, v1, a1 = p[i], v[i] * T, a[i] * T * T, p[i + 1], v[i + 1] * T, a[i + 1] * T * T
        c0, c1, c2 = p0, v0, a0 / 2
        d = p1 - c0 - c1 - c2
        e = v1 - c1 - 2 * c2
        f = a1 - 2 * c2
        c3 = 10 * d - 4 * e + f / 2
        c4 = -15 * d + 7 * e - f
        c5 = 6 * d - 3 * e + f / 2
        P[k0 + 1:k1] = c0 + u * (c1 + u * (c2 + u * (c3 + u * (c4 + u * c5))))
        V[k0 + 1:k1] = (c1 + u * (2 * c2 + u * (3 * c3 + u * (4 * c4 + u * 5 * c5)))) / T
        A[k0 + 1:k1] = (2 * c2 + u * (6 * c3 + u * (12 * c4 + u * 20 * c5))) / (T * T)
    return Planned(rate_hz, P, V, A, {**desc, "skipped_periods_filled": int(n - len(k))})


def plant_overrides(log: Log, config, mass_scale: float | None) -> dict:
    """The logged sim plant's settings (so the replay runs on the same plant) and
    ``--mass-scale``; only for a ``sim`` backend."""
    out: dict = {}
    plant = log.header.get("plant")
    if config.backend == "sim" and isinstance(plant, dict) and plant.get("backend", "sim") == "sim":
        for k in SIM_PLANT_KEYS:
            v = plant.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = v
    if mass_scale is not None:
        if not (mass_scale > 0 and math.isfinite(mass_scale)):
            raise UserError(f"--mass-scale must be positive and finite, got {mass_scale}")
        if config.backend != "sim":
            raise UserError("--mass-scale applies to the simulated plant only (backend 'sim')")
        out["mass_scale"] = float(mass_scale)
    return out


def first_fault_cycle(log: Log) -> int | None:
    """The loop cycle of the log's first fault event, or None."""
    ks = [e["cycle"] for e in log.events if "fault" in str(e.get("kind")) and isinstance(e.get("cycle"), int)]
    return min(ks) if ks else None


def compare_logs(orig: Log, new: Log, offset: int = 0) -> dict:
    """Per axis RMS and max |difference| of ``pos`` and ``tau`` (and ``tau_model``) over the
    loop cycles both logs hold, before the first fault of either (a fault row holds the bad
    reading and a torque of 0). ``offset``: the original's loop cycle of the new log's cycle 0
    (a replay starts at the original's first logged row)."""
    ko, kn = loop_cycles(orig), loop_cycles(new) + offset
    fn = first_fault_cycle(new)
    stops = [c for c in (first_fault_cycle(orig), None if fn is None else fn + offset) if c is not None]
    if stops:
        ko, kn = np.where(ko < min(stops), ko, -1), np.where(kn < min(stops), kn, -2)
    common, i, j = np.intersect1d(ko, kn, return_indices=True)
    keep = common >= 0
    common, i, j = common[keep], i[keep], j[keep]
    axes = orig.axes()
    out: dict = {"cycles_compared": int(len(common)), "axes": {}}
    if not len(common):
        return out
    diffs = {}
    for name in ("pos", "tau", "tau_model"):
        if name in orig.channels and name in new.channels:
            diffs[name] = columns(new.channels[name])[j] - columns(orig.channels[name])[i]
    s = next(iter(diffs.values())).shape[1] if diffs else 0
    for k in range(s):
        ax = axes[k] if len(axes) == s else str(k)
        row = {}
        for name, d in diffs.items():
            row[f"{name}_rms"] = float(np.sqrt(np.mean(d[:, k] ** 2)))
            row[f"{name}_max"] = float(np.max(np.abs(d[:, k])))
        row["pos_unit"] = orig.units.get("pos", "")
        row["tau_unit"] = orig.units.get("tau", "")
        out["axes"][ax] = row
    if "tau" in diffs:
        out["identical_torques"] = bool(np.array_equal(diffs["tau"], np.zeros_like(diffs["tau"])))
    return out


def replay(log: Log, *, machine: str | None = None, lockstep: bool | None = None,
           mass_scale: float | None = None, controller: str | None = None,
           out_log: str | None = None) -> dict:
    """Run the log's reference again and compare with the log (see the module docstring)."""
    from pkrt.drivers import open_drives

    from pkrt.rt.runtime.machine.runsetup import load_controller_tree

    from pkrt.rt.runtime.machine.run import run_session

    config = machine_for_log(log, machine)
    rate = log_rate(log)  # the run's own rate (pkrt run --rate), not the configuration's
    if abs(rate - config.rate_hz) > 1e-9:
        if not 1 <= rate <= 100000:
            raise LogFileError(f"{log.path}: logged rate {rate} Hz is not in [1, 100000]")
        config = dataclasses.replace(config, rate_hz=rate)
    tree = load_controller_tree(config)
    lockstep = bool(log.header.get("lockstep", True)) if lockstep is None else lockstep
    plan, exact = reference_from_log(log, config.rate_hz)
    if plan.pos.shape[1] != tree.s:
        raise UserError(f"{log.path}: the log has {plan.pos.shape[1]} axes, machine {config.path} has {tree.s}")
    overrides = plant_overrides(log, config, mass_scale)
    ctrl = controller or (log.header.get("controller") or {}).get("kind")
    tmp = None
    if out_log is None:
        fd, tmp = tempfile.mkstemp(prefix="pkrt-replay-", suffix=".pkl")
        os.close(fd)
    path = out_log or tmp
    drives = open_drives(config, overrides)
    try:
        summary = run_session(config, drives, trajectory=plan, lockstep=lockstep, log_path=path,
                              controller=ctrl, tree=tree)
        if summary.get("log_error"):  # disk full: the comparison would be on part of the run
            raise UserError(f"the replay's log is incomplete: {summary['log_error']}")
        new = read_log(path)
    finally:
        drives.close()
        if tmp:
            Path(tmp).unlink(missing_ok=True)
    orig_sum = log.summary or {}
    tree_hash = new.header.get("tree_hash")
    return {
        "log": log.path,
        "mode": "lockstep" if lockstep else "realtime",
        "machine": config.path,
        "controller": ctrl,
        "reference": {"cycles": plan.n, "sample_exact": exact,
                      "source": ("logged ref_pos/ref_vel/ref_acc" if exact else
                                "logged ref_pos/ref_vel/ref_acc, skipped periods filled (quintic)"
                                if "skipped_periods_filled" in plan.description else "cubic spline of logged ref_pos")},
        "plant_overrides": overrides,
        "same_tree": (tree_hash == log.header.get("tree_hash")) if tree_hash and log.header.get("tree_hash") else None,
        "original": {k: orig_sum.get(k) for k in ("cycles", "rms_error", "max_error", "fault")},
        "replay": {k: summary.get(k) for k in ("cycles", "rms_error", "max_error", "fault", "overruns")},
        "difference": compare_logs(log, new, int(loop_cycles(log)[0])),
        "replay_log": out_log,
    }


# -- offline ---------------------------------------------------------------------------------
def savgol_cutoff_hz(window: int, polyorder: int, rate_hz: float) -> float:
    """-3 dB frequency (Hz) of the Savitzky-Golay smoothing filter (window samples, order)."""
    from scipy.signal import freqz, savgol_coeffs

    w, h = freqz(savgol_coeffs(window, polyorder), worN=8192, fs=rate_hz)
    below = np.flatnonzero(np.abs(h) < 10 ** (-3 / 20))
    return float(w[below[0]]) if len(below) else float(rate_hz / 2)


def default_window(rate_hz: float) -> int:
    """About 21 ms of samples, odd, at least 7."""
    n = int(round(0.021 * rate_hz))
    return max(7, n | 1)


def derivatives(pos: np.ndarray, rate_hz: float, window: int, polyorder: int):
    """Smoothed signal and its first two time derivatives (Savitzky-Golay, zero phase)."""
    from scipy.signal import savgol_filter

    dt = 1.0 / rate_hz
    kw = dict(window_length=window, polyorder=polyorder, delta=dt, axis=0, mode="interp")
    return (savgol_filter(pos, deriv=0, **kw), savgol_filter(pos, deriv=1, **kw),
            savgol_filter(pos, deriv=2, **kw))


def model_torques(tree, pos: np.ndarray, vel: np.ndarray, acc: np.ndarray):
    """tau = H acc + D [vel vel] - p_ext per row from the tree; and the tree status per row."""
    from pkrt.rt.core.tree import eval_tau

    n, s = pos.shape
    H, D, p = np.zeros((s, s)), np.zeros((s, s * (s + 1) // 2)), np.zeros(s)
    tau = np.zeros((n, s))
    status = np.zeros(n, dtype=np.int64)
    T = tree.arrays
    for k in range(n):
        status[k] = eval_tau(T, pos[k], vel[k], acc[k], H, D, p, tau[k])
    return tau, status


def offline(log: Log, *, machine: str | None = None, tree_path: str | None = None,
            window: int | None = None, polyorder: int = 3) -> dict:
    """Residual between the logged commanded torques and the model's at the logged states."""
    from pkrt.rt.core.tree import OUT_OF_DOMAIN
    from pkrt.rt.core.treefile import load_tree

    _need(log, "t", "pos", "tau")
    rate = log_rate(log)
    if tree_path is None:
        tree_path = machine_for_log(log, machine).tree
    tree = load_tree(tree_path)
    same_tree = None
    if isinstance(log.header.get("tree_hash"), str):
        same_tree = hashlib.sha256(Path(tree_path).read_bytes()).hexdigest() == log.header["tree_hash"]
    pos, tau = columns(log.channels["pos"]), columns(log.channels["tau"])
    if pos.shape[1] != tree.s:
        raise UserError(f"{tree_path}: the tree has {tree.s} actuators, the log {pos.shape[1]}")
    window = default_window(rate) if window is None else window
    if window % 2 == 0 or window <= polyorder + 2:
        raise UserError(f"--window must be odd and larger than {polyorder + 2}, got {window}")
    half = window // 2
    # cycles up to the first fault (torque off afterwards)
    stop = log.n_cycles
    faults = [e["cycle"] for e in log.events if "fault" in str(e.get("kind")) and isinstance(e.get("cycle"), int)]
    if faults:
        stop = log.row_of_cycle(min(faults))
    # uniform sampling is what the filter assumes: split where rows or periods were skipped
    t = log.channels["t"][:stop]
    breaks = np.flatnonzero((np.diff(log.cycles[:stop]) != 1)
                            | (np.abs(np.diff(t) * rate - 1.0) > 1e-6)) + 1
    tau_m = np.full_like(pos, np.nan)
    vel_f = np.full_like(pos, np.nan)
    tau_f = np.full_like(pos, np.nan)
    used = np.zeros(log.n_cycles, dtype=bool)
    out_of_domain = 0
    for a, b in zip(np.r_[0, breaks], np.r_[breaks, stop]):
        if b - a < window + 2 * half:
            continue
        _, v, acc = derivatives(pos[a:b], rate, window, polyorder)
        tm, st = model_torques(tree, np.ascontiguousarray(pos[a:b]), v, acc)
        tau_m[a:b], vel_f[a:b] = tm, v
        held = tau[a:b].copy()
        held[1:] = 0.5 * (tau[a + 1:b] + tau[a:b - 1])  # zero-order hold: half a period back
        tau_f[a:b] = derivatives(held, rate, window, polyorder)[0]
        ok = st != OUT_OF_DOMAIN
        ok[:half] = False  # the filter's end windows are one-sided: leave them out
        ok[-half:] = False
        out_of_domain += int(np.count_nonzero(st == OUT_OF_DOMAIN))
        used[a:b] = ok
    if not used.any():
        raise LogFileError(f"{log.path}: too few contiguous cycles for a {window}-sample filter")
    r = (tau_f - tau_m)[used]
    v = vel_f[used]
    axes = log.axes()
    s = tree.s
    per_axis = {}
    for i in range(s):
        ax = axes[i] if len(axes) == s else str(i)
        # residual ~ b v + Fc tanh(v / v_eps) + c (viscous, Coulomb, offset), least squares
        A = np.c_[v[:, i], np.tanh(v[:, i] / V_EPS), np.ones(len(v))]
        coef, *_ = np.linalg.lstsq(A, r[:, i], rcond=None)
        left = r[:, i] - A @ coef
        scale = float(np.max(np.abs(tau[used][:, i])))
        per_axis[ax] = {"rms": float(np.sqrt(np.mean(r[:, i] ** 2))), "max": float(np.max(np.abs(r[:, i]))),
                        "mean": float(np.mean(r[:, i])), "max_abs_tau": scale,
                        "friction_fit": {"viscous": float(coef[0]), "coulomb": float(coef[1]),
                                         "offset": float(coef[2]),
                                         "rms_after": float(np.sqrt(np.mean(left ** 2))),
                                         "max_after": float(np.max(np.abs(left)))},
                        "unit": log.units.get("tau", "")}
    ver = tree.header.get("verification") or {}
    return {
        "log": log.path, "mode": "offline", "tree": str(tree_path), "same_tree_as_run": same_tree,
        "filter": {"kind": "savitzky-golay (zero phase)", "window": window,
                   "torque": "(tau[k-1] + tau[k]) / 2 (zero-order hold), same filter",
                   "window_s": window / rate, "polyorder": polyorder,
                   "cutoff_hz": savgol_cutoff_hz(window, polyorder, rate), "rate_hz": rate},
        "cycles_used": int(used.sum()), "cycles_out_of_domain": out_of_domain,
        "tree_stated_error": {"max_rel_tau_error": ver.get("max_rel_tau_error"),
                              "max_rel_coef_error": ver.get("max_rel_coef_error")},
        "residual": per_axis,
    }
