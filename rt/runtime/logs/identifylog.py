"""Run logs as identification data: measured positions and commanded forces, filtered alike
and decimated (``pkrt identify``).

Per contiguous stretch of a log (split where rows or periods were skipped), the positions go
through the Savitzky-Golay smoothing filter of ``pkrt replay --offline``
(``pkrt.rt.runtime.logs.replay.derivatives``: zero phase, a local cubic over ``window`` samples), and
theta_dot, theta_ddot are central differences of the filtered positions, so that they carry
exactly the filter's response (the Savitzky-Golay derivative filters have another response:
their accelerations against filtered forces bias the masses by percents at a 51 ms window);
the commanded forces, first averaged over consecutive commands (zero-order hold: the motion
around sample k reflects the command half a period earlier), go through the very same filter.
Both are then decimated by the same factor (the filter's -3 dB frequency below a quarter of the
decimated rate), and half a window is dropped at each end of a stretch (one-sided there).
A drive that quantises its torque (HIL) only adds white noise, which the filter averages.

The logged reference (``ref_pos``, planned before the run, so free of the run's noise) goes
through the same filter, differences and decimation: the instruments of the fit
(``pkrt.models.identification.estimate.fit``). None when a log has no reference.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.friction import V_EPS
from pkrt.rt.runtime.record.logfile import Log, read_log
from pkrt.rt.runtime.logs.logstats import columns
from pkrt.rt.runtime.logs.replay import derivatives, log_rate, savgol_cutoff_hz


WINDOW_S = 0.031  # s: short enough that filtering the positions before the (nonlinear) regressor
# leaves no bias above the noise at the excitation's 3 Hz harmonics (51 ms: the masses 1.9 % off)


class IdentifyInputError(UserError):
    """A log that cannot be used for identification (one line, exit 2)."""


@dataclass
class Samples:
    """Filtered, decimated samples of one or more logs (SI, actuator units)."""
    theta: np.ndarray  # (n, s)
    theta_dot: np.ndarray
    theta_ddot: np.ndarray
    tau: np.ndarray  # commanded force, filtered alike
    steady: np.ndarray  # (n, s) bool: the axis's velocity keeps its sign over the whole filter window
    t: np.ndarray  # (n,) s, log time (each log's own)
    log_index: np.ndarray  # (n,) which log
    rate_hz: float  # decimated rate
    filter: dict
    sources: list[dict] = field(default_factory=list)
    # the reference at the same samples, filtered alike (None: a log without ``ref_pos``)
    ref: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def n(self) -> int:
        return len(self.t)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_log_machine(log: Log, axes: list[str], model_name: str, ranges: np.ndarray) -> None:
    """A log of another machine (other axes, another model, positions outside the ranges)."""
    for name in ("t", "pos", "tau"):
        if name not in log.channels:
            raise IdentifyInputError(f"{log.path}: the log has no '{name}' channel (not a run log of a machine)")
    got = log.axes()
    if log.widths.get("pos") != len(axes) or (got and got != list(axes)):
        raise IdentifyInputError(f"{log.path}: a log of another machine (axes {', '.join(got)}; "
                                 f"{model_name} has {', '.join(axes)})")
    name = log.header.get("model_name")
    if isinstance(name, str) and name != model_name:
        raise IdentifyInputError(f"{log.path}: a log of another machine (model '{name}', expected '{model_name}')")
    pos = columns(log.channels["pos"])
    tol = 0.02 * (ranges[:, 1] - ranges[:, 0])
    bad = np.flatnonzero((pos.min(axis=0) < ranges[:, 0] - tol) | (pos.max(axis=0) > ranges[:, 1] + tol))
    if len(bad):
        i = int(bad[0])
        raise IdentifyInputError(f"{log.path}: a log of another machine (axis {axes[i]} moves over "
                                 f"[{pos[:, i].min():.4g}, {pos[:, i].max():.4g}], outside its range "
                                 f"[{ranges[i, 0]:.4g}, {ranges[i, 1]:.4g}])")


def steady_sign(v: np.ndarray, window: int) -> np.ndarray:
    """(n, s) bool: the velocity has one sign, and |v| >= 5 V_EPS, over the ``window`` samples
    centred on each sample. Elsewhere the filtered force mixes both signs of the Coulomb
    friction (its step at a reversal is smeared over the window)."""
    from scipy.ndimage import maximum_filter1d, minimum_filter1d

    sg = np.where(v >= 5 * V_EPS, 1, np.where(v <= -5 * V_EPS, -1, 0)).astype(np.int8)
    lo = minimum_filter1d(sg, window, axis=0, mode="nearest")
    hi = maximum_filter1d(sg, window, axis=0, mode="nearest")
    return (lo == hi) & (sg != 0)


def load_samples(paths: list[str], axes: list[str], model_name: str, ranges: np.ndarray,
                 window_s: float = WINDOW_S, polyorder: int = 3, decimate: int | None = None) -> Samples:
    """Samples from run logs; one-line errors for a faulted run, a log of another machine,
    a log too short for the filter."""
    parts: list[dict] = []  # one per contiguous stretch of a log
    sources = []
    rate0 = None
    filt = {}
    for li, path in enumerate(paths):
        log, pos, tau = _checked_log(path, axes, model_name, ranges)
        rate = log_rate(log)
        if rate0 is not None and abs(rate - rate0) > 1e-9 * rate0:
            raise IdentifyInputError(f"{path}: logged at {rate:g} Hz, the first log at {rate0:g} Hz (give logs of one rate)")
        rate0 = rate
        filt = _filter_settings(rate, window_s, polyorder, decimate)
        window, k = filt["window"], filt["decimate"]
        ref = columns(log.channels["ref_pos"]) if "ref_pos" in log.channels else None
        ref = ref if ref is not None and ref.shape == pos.shape and np.all(np.isfinite(ref)) else None
        t = log.channels["t"]
        breaks = np.flatnonzero((np.diff(log.cycles) != 1) | (np.abs(np.diff(t) * rate - 1.0) > 1e-6)) + 1
        used = 0
        for a, b in zip(np.r_[0, breaks], np.r_[breaks, len(t)]):
            if b - a >= 3 * window:
                part = _stretch(pos[a:b], tau[a:b], None if ref is None else ref[a:b], t[a:b], rate, window,
                                polyorder, k)
                parts.append(part | {"log_index": np.full(len(part["t"]), li)})
                used += len(part["t"])
        duration = float(t[-1] - t[0]) if len(t) else 0.0
        if used == 0:
            raise IdentifyInputError(f"{path}: too short ({log.n_cycles} cycles, {duration:.3g} s; the filter "
                                     f"needs contiguous stretches of at least {3 * window} cycles)")
        sources.append({"log": str(path), "sha256": _sha256(path), "cycles": log.n_cycles, "duration_s": duration,
                        "rate_hz": rate, "samples": used, "created": log.header.get("created"),
                        "problems": log.problem_text()})
    cat = {name: np.concatenate([q[name] for q in parts]) for name in parts[0] if name != "ref"}
    ref = None
    if all(q["ref"] is not None for q in parts):
        ref = tuple(np.concatenate([q["ref"][i] for q in parts]) for i in range(3))
    return Samples(cat["theta"], cat["theta_dot"], cat["theta_ddot"], cat["tau"], cat["steady"], cat["t"],
                   cat["log_index"], rate0 / filt["decimate"], filt, sources, ref)


def _filter_settings(rate: float, window_s: float, polyorder: int, decimate: int | None) -> dict:
    """The filter of a log at ``rate`` Hz: its window in samples (odd, at least 7), cutoff and
    decimation (the cutoff below a quarter of the decimated rate, unless ``decimate`` given)."""
    window = max(7, int(round(window_s * rate)) | 1)
    cutoff = savgol_cutoff_hz(window, polyorder, rate)
    k = decimate or max(1, int(rate / (4.0 * cutoff)))
    return {"kind": "savitzky-golay (zero phase), positions and held forces alike", "window": window,
            "window_s": window / rate, "polyorder": polyorder, "cutoff_hz": cutoff, "rate_hz": rate,
            "decimate": k, "decimated_rate_hz": rate / k}


def _checked_log(path: str, axes: list[str], model_name: str, ranges: np.ndarray):
    """The log and its positions and forces (n, s), refused in one line when of another
    machine, faulted or not finite."""
    log = read_log(path)
    check_log_machine(log, axes, model_name, ranges)
    faults = [e for e in log.events if "fault" in str(e.get("kind"))]
    if faults:
        e = faults[0]
        raise IdentifyInputError(f"{path}: a faulted run (cycle {e.get('cycle')}: {e.get('message')}); "
                                 f"the forces after a fault are not the machine's, record another run")
    pos, tau = columns(log.channels["pos"]), columns(log.channels["tau"])
    if not (np.all(np.isfinite(pos)) and np.all(np.isfinite(tau))):
        raise IdentifyInputError(f"{path}: non-finite positions or forces in the log")
    return log, pos, tau


def _stretch(pos: np.ndarray, tau: np.ndarray, ref: np.ndarray | None, t: np.ndarray, rate: float, window: int,
             polyorder: int, k: int) -> dict:
    """The samples of one contiguous stretch: the same filter on positions and forces,
    derivatives of the filtered positions by central differences (the accelerations then carry
    the forces' filter response; the Savitzky-Golay derivative filters have another one, which
    biases the masses), every k-th sample but half a window at each end; the reference alike."""
    half = window // 2
    p, v, acc = _filtered(pos, rate, window, polyorder)
    held = tau.copy()
    held[1:] = 0.5 * (tau[1:] + tau[:-1])
    tf = derivatives(held, rate, window, polyorder)[0]
    sel = np.arange(half, len(t) - half, k)
    return {"theta": p[sel], "theta_dot": v[sel], "theta_ddot": acc[sel], "tau": tf[sel],
            "steady": steady_sign(v, window)[sel], "t": t[sel],
            "ref": None if ref is None else tuple(x[sel] for x in _filtered(ref, rate, window, polyorder))}


def _filtered(pos: np.ndarray, rate: float, window: int, polyorder: int):
    """Positions through the smoothing filter, velocities and accelerations by central
    differences of them."""
    p = derivatives(pos, rate, window, polyorder)[0]
    v = np.gradient(p, 1.0 / rate, axis=0)
    return p, v, np.gradient(v, 1.0 / rate, axis=0)


__all__ = ["IdentifyInputError", "Samples", "WINDOW_S", "check_log_machine", "load_samples"]
