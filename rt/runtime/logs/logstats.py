"""``pkrt log info | export | plot``: summaries, CSV export and plots of run logs.

Channel names are the runtime's (``pkrt.rt.runtime.record.logfile``): ``t``, ``ref_pos``, ``ref_vel``,
``ref_acc``, ``pos``, ``vel``, ``tau``, ``tau_model``, ``wake_us``, ``compute_us``, ``flags``;
and the tool channels ``tool_ref`` and ``tool`` (task coordinates, column labels in
``Log.labels``) when the CLI computed them after the run (``pkrt.rt.app.toolchannels``).
Every tool works on whatever subset a log holds.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from pkrt.rt.core.plan import state_columns
from pkrt.rt.runtime.cycle.flags import FLAG_BITS
from pkrt.rt.runtime.record.logfile import Log, LogFileError
from pkrt.rt.core.outputs import atomic_write



# -- statistics ------------------------------------------------------------------------------
def columns(a: np.ndarray) -> np.ndarray:
    """A channel as a 2-D array (n, columns): one column for a scalar channel."""
    return a[:, None] if a.ndim == 1 else a


def channel_units(log: Log, name: str) -> list[str]:
    """One unit per column of a channel: the channel's unit, or its comma-separated list."""
    w = log.widths[name]
    u = log.units.get(name, "")
    parts = [p.strip() for p in u.split(",")]
    return parts if len(parts) == w else [u] * w


def column_names(log: Log, name: str) -> list[str]:
    """CSV column names of a channel: ``name [unit]``, ``name_axis [unit]`` per axis, or
    ``name_label [unit]`` for a channel with column labels (``tool_x [m]``)."""
    w = log.widths[name]
    units = channel_units(log, name)
    axes = log.labels.get(name) or log.axes()
    if w == 1:
        labels = [name]
    else:
        labels = [f"{name}_{axes[i] if len(axes) == w else i}" for i in range(w)]
    return [f"{lab} [{u}]" if u else lab for lab, u in zip(labels, units)]


def measured_rate(log: Log) -> float | None:
    """Cycles per second between the first and last logged wake-ups (t plus the wake
    latency, when logged); below nominal when a real-time loop skipped periods."""
    t = log.get("t")
    if t is None or len(t) < 2:
        return None
    wake = log.get("wake_us")
    t0, t1 = float(t[0]), float(t[-1])
    if wake is not None and np.isfinite(wake[0]) and np.isfinite(wake[-1]):
        t0, t1 = t0 + 1e-6 * float(wake[0]), t1 + 1e-6 * float(wake[-1])
    if not t1 > t0:
        return None
    return float((log.cycles[-1] - log.cycles[0]) / (t1 - t0))


def tracking_stats(log: Log) -> dict:
    """Per axis RMS and max |ref_pos - pos| (the axis's unit)."""
    ref, pos = log.get("ref_pos"), log.get("pos")
    if ref is None or pos is None or len(pos) == 0:
        return {}
    e = columns(ref) - columns(pos)
    axes = log.axes()
    units = channel_units(log, "pos")
    out = {}
    for i in range(e.shape[1]):
        name = axes[i] if len(axes) == e.shape[1] else str(i)
        ei = e[:, i][np.isfinite(e[:, i])]  # a NaN reading (a fault) is reported, not averaged
        out[name] = {"rms": float(np.sqrt(np.mean(ei ** 2))) if len(ei) else None,
                     "max": float(np.max(np.abs(ei))) if len(ei) else None,
                     "unit": units[i], "non_finite": int(len(e) - len(ei))}
    return out


def timing_stats(log: Log) -> dict:
    """p50, p99 and max of ``wake_us`` and ``compute_us`` (microseconds)."""
    out = {}
    for name in ("wake_us", "compute_us"):
        a = log.get(name)
        a = a[np.isfinite(a)] if a is not None else None
        if a is not None and len(a):
            out[name] = {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
                         "max": float(np.max(a))}
    return out


def flag_counts(log: Log) -> dict:
    f = log.get("flags")
    if f is None:
        return {}
    bits = np.nan_to_num(f).astype(np.int64)
    return {k: int(np.count_nonzero(bits & b)) for k, b in FLAG_BITS.items()}


def _machine_name(h: dict) -> str | None:
    """The configuration's path, else its [machine] name."""
    if h.get("machine_path"):
        return str(h["machine_path"])
    m = h.get("machine")
    if isinstance(m, dict) and isinstance(m.get("machine"), dict):
        return m["machine"].get("name")
    return None


def log_summary(log: Log) -> dict:
    """Everything ``pkrt log info`` reports, as a dict."""
    h = log.header
    t = log.get("t")
    duration = float(t[-1] - t[0]) if t is not None and len(t) >= 2 else 0.0
    nominal = h.get("rate_hz")
    return {
        "path": log.path,
        "format": f"{h.get('format')} v{h.get('version')}",
        "created": h.get("created"),
        "software": h.get("software"),
        "machine": _machine_name(h),
        "model": {"name": h.get("model_name"), "hash": h.get("model_hash")},
        "tree": {"path": h.get("tree_path"), "hash": h.get("tree_hash")},
        "axes": log.axes(),
        "controller": h.get("controller"),
        "trajectory": h.get("trajectory"),
        "lockstep": h.get("lockstep"),
        "plant": h.get("plant"),
        "cycles": log.n_cycles,
        "duration_s": duration,
        "rate_hz": {"nominal": nominal, "measured": measured_rate(log)},
        "events": log.events,
        "faults": [e for e in log.events if "fault" in str(e.get("kind", "")).lower()],
        "tracking": tracking_stats(log),
        "timing_us": timing_stats(log),
        "flags": flag_counts(log),
        "complete": log.summary is not None and not log.truncated,
        "truncated": log.truncated,
        "bad_blocks": log.bad_blocks,
        "dropped_blocks": log.dropped_blocks,
        "problems": log.problems,
        "summary": log.summary,
    }


def _short(v) -> str:
    """A value for text output: numbers to 4 significant digits, lists of them compactly."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
        return ("[" + ", ".join(_short(x) for x in v) + "]") if len(set(v)) > 1 else f"{_short(v[0])} x{len(v)}"
    return str(v)


def _info_text(s: dict, brief: bool = False) -> str:
    """The text of ``pkrt log info``; ``brief`` (the plot's panel) leaves out versions and the
    run's own summary, and shortens hashes."""
    return "\n".join(_run_lines(s, brief) + _file_lines(s) + _stats_lines(s) + _event_lines(s, brief))


def _hash(x, brief: bool) -> str:
    """A content hash for text output: shortened to 12 characters when ``brief``."""
    return (x[:12] + "...") if brief and isinstance(x, str) and len(x) > 15 else (x or "")


def _run_lines(s: dict, brief: bool) -> list[str]:
    """The log file, software, machine, model, tree, controller and the run's cycles and rate."""
    L = [f"log        {s['path']} ({s['format']}, created {s['created']})"]
    sw = s.get("software") or {}
    if sw and not brief and isinstance(sw, dict):
        L.append("software   " + ", ".join(f"{k} {v}" for k, v in sw.items()))
    L.append(f"machine    {s['machine'] or '-'}   model {s['model']['name'] or '-'} "
             f"{_hash(s['model']['hash'], brief)}".rstrip())
    if s["tree"]["path"] or s["tree"]["hash"]:
        L.append(f"tree       {s['tree']['path']} {_hash(s['tree']['hash'], brief)}".rstrip())
    if s["controller"]:
        c = s["controller"]
        L.append("controller " + (", ".join(f"{k}={_short(v)}" for k, v in c.items()) if isinstance(c, dict) else str(c)))
    r = s["rate_hz"]
    meas = f"{r['measured']:.3f}" if r["measured"] else "-"
    L.append(f"run        {s['cycles']} cycles, {s['duration_s']:.3f} s, rate nominal {r['nominal']} Hz, "
             f"measured {meas} Hz{', lockstep' if s['lockstep'] else ''}")
    return L


def _file_lines(s: dict) -> list[str]:
    """Whether the file is complete, its bad and dropped blocks and what was dropped."""
    state = "complete" if s["complete"] else "TRUNCATED (no valid end record: run cut off or damaged)"
    return ([f"file       {state}; bad blocks {s['bad_blocks']}, dropped blocks {s['dropped_blocks']}"]
            + [f"  dropped: {p}" for p in s.get("problems") or []])


def _stats_lines(s: dict) -> list[str]:
    """Tracking error per axis, timing quantiles and flagged cycles."""
    L = []
    if s["tracking"]:
        L.append("tracking error (ref_pos - pos):")
        for ax, v in s["tracking"].items():
            if v["rms"] is None:
                L.append(f"  {ax:<8} no finite samples")
                continue
            bad = f"   ({v['non_finite']} non-finite samples left out)" if v["non_finite"] else ""
            L.append(f"  {ax:<8} rms {v['rms']:.4g} {v['unit']}   max {v['max']:.4g} {v['unit']}{bad}")
    if s["timing_us"]:
        L.append("timing (us):")
        for k, v in s["timing_us"].items():
            L.append(f"  {k:<11} p50 {v['p50']:8.1f}   p99 {v['p99']:8.1f}   max {v['max']:8.1f}")
    if s["flags"]:
        L.append("flagged cycles: " + ", ".join(f"{k} {v}" for k, v in s["flags"].items()))
    return L


def _event_lines(s: dict, brief: bool) -> list[str]:
    """The run's events and (unless ``brief``) its own summary's scalar entries."""
    L = [f"events     {len(s['events'])}" + ("" if s["events"] else " (none)")]
    L += [f"  cycle {e['cycle']}: {e['kind']}: {e['message']}" for e in s["events"]]
    if s["summary"] and not brief:
        L.append("summary    " + ", ".join(f"{k}={_short(v)}" for k, v in s["summary"].items()
                                         if not isinstance(v, (dict, list))))
    return L


# -- export ----------------------------------------------------------------------------------
def loop_cycles(log: Log) -> np.ndarray:
    """The loop's cycle index of each row (int64), round(t * rate_hz), as the events number
    them (a real-time loop that overran skips periods, so rows and loop cycles differ); the
    row's index when the log has no usable time or rate."""
    rate, t = log.header.get("rate_hz"), log.get("t")
    if (isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0
            and t is not None and np.all(np.isfinite(t)) and (not len(t) or np.abs(t).max() * rate < 2.0 ** 62)):
        return np.rint(t * rate).astype(np.int64)
    return np.asarray(log.cycles, dtype=np.int64)


def export_csv(log: Log, out: str) -> list[str]:
    """One row per logged cycle: ``cycle`` (the loop's, as in the events), then every channel
    in log order. Returns the column names."""
    names = ["cycle"]
    cols = [loop_cycles(log)[:, None].astype(float)]
    for name in log.channels:
        names += column_names(log, name)
        cols.append(columns(log.channels[name]))
    data = np.hstack(cols) if log.n_cycles else np.zeros((0, len(names)))
    int_cols = {0} | {i for i, n in enumerate(names) if n.split(" ")[0] == "flags"}
    with atomic_write(out, "CSV", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for r in data:
            w.writerow([str(int(v)) if i in int_cols and np.isfinite(v) else repr(float(v))
                        for i, v in enumerate(r)])
    return names


def export_trajectory(log: Log, out: str, measured: bool = False) -> list[str]:
    """A ``--traj`` CSV: header ``t`` and the actuator names; t (s) from 0, positions from the
    logged reference (``ref_pos``, with its velocities and accelerations ``ref_vel``, ``ref_acc``
    as ``<name>_vel``, ``<name>_acc`` columns when logged: replayed exactly) or, with
    ``measured``, the measured ``pos`` (positions only: a spline joins them)."""
    name = "pos" if measured else "ref_pos"
    t, p = log.get("t"), log.get(name)
    if t is None or p is None:
        raise LogFileError(f"{log.path}: the log has no '{'t' if t is None else name}' channel")
    p = columns(p)
    s = p.shape[1]
    ders = [log.get(c) for c in ("ref_vel", "ref_acc")] if not measured else [None]
    if all(d is not None for d in ders):
        p = np.hstack([p, *(columns(d) for d in ders)])
    bad = ~(np.isfinite(t) & np.all(np.isfinite(p), axis=1))
    if bad.any():  # a faulted run's last row holds the bad reading: the trajectory ends before it
        n = int(np.argmax(bad))
        t, p = t[:n], p[:n]
    if len(t) < 2:
        raise LogFileError(f"{log.path}: the log holds {len(t)} cycle(s) with finite values, too few "
                           f"for a trajectory")
    axes = log.axes()
    if len(axes) != s:
        axes = [f"q{i + 1}" for i in range(s)]
    head = ["t"] + (state_columns(axes) if p.shape[1] == 3 * s else axes)
    with atomic_write(out, "trajectory", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for ti, row in zip(t - t[0], p):
            w.writerow([repr(float(ti))] + [repr(float(v)) for v in row])
    return head


# -- plot ------------------------------------------------------------------------------------
PLOT_SIZE_PX = (1600, 1000)
PLOT_DPI = 100
TIMING_FLOOR_US = 0.1  # lockstep wake latency is exactly 0; a log axis needs a floor


def plot_log(log: Log, out_path) -> str:
    """Write a 1600 x 1000 px PNG: tracking error per axis, commanded and model torques,
    histogram of wake latency and compute time, and a text summary; with the tool channels
    (``tool_ref``, ``tool``: ``pkrt.rt.app.toolchannels``) also the tool's path, reference
    against actual, and the tool error over time (mm). Returns the path."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    s = log_summary(log)
    t = log.get("t")
    x = t - t[0] if t is not None and len(t) else log.cycles.astype(float)
    xlabel = "t [s]" if t is not None else "cycle"
    with_tool = log.get("tool_ref") is not None and log.get("tool") is not None and len(x) > 0
    fig, grid = plt.subplots(2, 3 if with_tool else 2, figsize=(PLOT_SIZE_PX[0] / PLOT_DPI,
                                                                 PLOT_SIZE_PX[1] / PLOT_DPI), dpi=PLOT_DPI)
    ax = grid
    if with_tool:  # top: errors, torques, tool path; bottom: timing, tool error, summary
        ax = np.array([[grid[0, 0], grid[0, 1]], [grid[1, 0], grid[1, 2]]], dtype=object)
        _tool_panels(fig, grid[0, 2], grid[1, 1], log, x, xlabel)
    _tracking_panel(ax[0, 0], log, x, xlabel)
    _torque_panel(ax[0, 1], log, x, xlabel)
    _mark_events(((ax[0, 0], ax[0, 1]) + ((grid[1, 1],) if with_tool else ())), log, x)
    _timing_panel(ax[1, 0], log)
    _summary_panel(ax[1, 1], s)
    fig.suptitle(f"{Path(log.path).name}: {s['model']['name'] or ''} {s['cycles']} cycles, "
                 f"{s['duration_s']:.3f} s", fontsize=13)
    fig.tight_layout()
    try:
        with atomic_write(out_path, "plot", "wb") as f:
            fig.savefig(f, dpi=PLOT_DPI, format="png")
    finally:
        plt.close(fig)
    return str(out_path)


def _axis_name(axes: list[str], i: int):
    """Axis ``i``'s actuator name, or its index when the log names fewer axes."""
    return axes[i] if i < len(axes) else i


def _tracking_panel(a, log: Log, x: np.ndarray, xlabel: str) -> None:
    """ref_pos - pos per axis over time (mm or mrad for axes in m or rad)."""
    ref, pos = log.get("ref_pos"), log.get("pos")
    if ref is not None and pos is not None and len(x):
        e = columns(ref) - columns(pos)
        u, axes = channel_units(log, "pos"), log.axes()
        for i in range(e.shape[1]):
            k, unit = (1e3, "m" + u[i]) if u[i] in ("m", "rad") else (1.0, u[i])  # mm, mrad
            a.plot(x, k * e[:, i], lw=1, label=f"{_axis_name(axes, i)} [{unit}]")
        a.legend(loc="upper right")
    a.set_title("tracking error ref_pos - pos")
    a.set_xlabel(xlabel)
    a.grid(alpha=0.3)


def _torque_panel(a, log: Log, x: np.ndarray, xlabel: str) -> None:
    """Commanded torques (solid) and the model's (dashed, same colour) over time."""
    tau, tau_m = log.get("tau"), log.get("tau_model")
    if tau is not None and len(x):
        u, axes = channel_units(log, "tau"), log.axes()
        for i in range(columns(tau).shape[1]):
            line, = a.plot(x, columns(tau)[:, i], lw=1, label=f"tau {_axis_name(axes, i)} [{u[i]}]")
            if tau_m is not None:
                a.plot(x, columns(tau_m)[:, i], lw=1, ls="--", color=line.get_color(), alpha=0.7)
        a.legend(loc="upper right", title="solid: commanded, dashed: model" if tau_m is not None else None)
    a.set_title("actuator torques / forces")
    a.set_xlabel(xlabel)
    a.grid(alpha=0.3)


def _mark_events(panels, log: Log, x: np.ndarray) -> None:
    """Faults (red) and state changes (gray) as vertical lines on the time panels."""
    for e in log.events:
        if isinstance(e.get("cycle"), int) and len(x):
            k = min(log.row_of_cycle(e["cycle"]), len(x) - 1)
            for a in panels:
                a.axvline(x[k], color="red" if "fault" in str(e.get("kind")) else "gray", lw=1, ls=":")


def _timing_panel(a, log: Log) -> None:
    """Histograms of wake latency and compute time: heavy-tailed, so log-spaced bins on a log
    axis, with their p99 dashed."""
    series = {n: v[np.isfinite(v)] for n in ("wake_us", "compute_us") if (v := log.get(n)) is not None}
    allv = np.concatenate(list(series.values())) if series else np.zeros(0)
    lo_us = TIMING_FLOOR_US
    hi_us = max(float(allv.max()) if len(allv) else 1.0, 10 * lo_us) * 1.05
    bins = np.geomspace(lo_us, hi_us, 90)
    for (name, v), color in zip(series.items(), ("tab:blue", "tab:orange")):
        if len(v):
            p99 = np.percentile(v, 99)
            a.hist(np.clip(v, lo_us, None), bins=bins, alpha=0.6, color=color, log=True,
                   label=f"{name}: p50 {np.median(v):.1f}, p99 {p99:.1f}, max {v.max():.1f}")
            a.axvline(max(p99, lo_us), color=color, lw=1, ls="--")
    if series:
        a.legend(loc="upper right", title=f"us (values below {lo_us:g} us drawn at {lo_us:g})")
    a.set_xscale("log")
    a.set_title("cycle timing histogram (dashed: p99)")
    a.set_xlabel("microseconds")
    a.set_ylabel("cycles")
    a.grid(alpha=0.3)


def _summary_panel(a, s: dict) -> None:
    """The brief ``pkrt log info`` text."""
    a.axis("off")
    a.text(0.0, 1.0, _info_text(s, brief=True), va="top", ha="left", family="monospace", fontsize=9,
           transform=a.transAxes, wrap=True)


ANGLES = ("roll", "pitch", "yaw")


def _tool_panels(fig, path_ax, err_ax, log: Log, x: np.ndarray, xlabel: str) -> None:
    """The tool's path (position coordinates, reference dashed against actual; 3-D for x, y,
    z) on ``path_ax`` and the tool error over time on ``err_ax``: the distance of the tool point
    (mm) and, for 6-DOF, the roll, pitch, yaw differences (mrad, right axis)."""
    labels = log.labels.get("tool") or [str(i) for i in range(log.widths["tool"])]
    ref, act = columns(log.get("tool_ref")), columns(log.get("tool"))
    ip = [i for i, c in enumerate(labels) if c not in ANGLES]
    ia = [i for i, c in enumerate(labels) if c in ANGLES]
    if len(ip) == 3:  # replace the 2-D axes by a 3-D one in the same place
        spec = path_ax.get_subplotspec()
        path_ax.remove()
        path_ax = fig.add_subplot(spec, projection="3d")
    for data, style, name in ((ref, "--", "reference"), (act, "-", "actual")):
        path_ax.plot(*(1e3 * data[:, i] for i in ip[:3]), ls=style, lw=1, label=name)
    for setter, i in zip((path_ax.set_xlabel, path_ax.set_ylabel, getattr(path_ax, "set_zlabel", None)), ip[:3]):
        setter(f"{labels[i]} [mm]")
    P = 1e3 * np.vstack([ref[:, ip[:3]], act[:, ip[:3]]])
    P = P[np.all(np.isfinite(P), axis=1)]
    if len(P):  # the same span on every axis: the path's true shape
        c, h = 0.5 * (P.max(0) + P.min(0)), 0.55 * max(float((P.max(0) - P.min(0)).max()), 1e-3)
        for setter, ci in zip((path_ax.set_xlim, path_ax.set_ylim, getattr(path_ax, "set_zlim", None)), c):
            setter(ci - h, ci + h)
        path_ax.set_box_aspect((1, 1, 1) if len(ip) >= 3 else 1)
    path_ax.legend(loc="upper right")
    path_ax.set_title("tool path (forward kinematics of ref_pos, pos)")

    e = np.linalg.norm(ref[:, ip] - act[:, ip], axis=1) * 1e3
    ok = np.isfinite(e)
    rms = f"rms {np.sqrt(np.mean(e[ok] ** 2)):.4g}, max {e[ok].max():.4g} mm" if ok.any() else "no finite rows"
    err_ax.plot(x, e, lw=1, color="black", label=f"|p_ref - p| [mm] ({rms})")
    if ia:
        d = np.angle(np.exp(1j * (ref[:, ia] - act[:, ia])))  # wrapped to (-pi, pi]
        twin = err_ax.twinx()
        for k, i in enumerate(ia):
            twin.plot(x, 1e3 * d[:, k], lw=1, alpha=0.7, label=f"{labels[i]} [mrad]")
        twin.set_ylabel("orientation difference [mrad]")
        twin.legend(loc="lower right")
    err_ax.legend(loc="upper left")
    err_ax.set_title("tool error (reference - actual)")
    err_ax.set_xlabel(xlabel)
    err_ax.set_ylabel("mm")
    err_ax.grid(alpha=0.3)
