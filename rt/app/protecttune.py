"""Thresholds of contact detection from logs of normal runs (``pkrt protect tune``).

The logs record the observer's residual every cycle (``[protect] enabled = true``; without
thresholds it only observes). Per actuator the residual's maxima over blocks of ``BLOCK_S``
(0.1 s: 25 time constants of the observer at its default gain, so the blocks' maxima are nearly
independent) are fitted by a Gumbel distribution (moments: beta = sd sqrt(6) / pi, mu = mean -
0.5772 beta), the law of the maximum of many weakly dependent values. A false-alarm rate R (per
hour) is a block exceeding the threshold with probability p = R BLOCK_S / 3600, so the threshold
is mu - beta ln(-ln(1 - p)); never below ``MARGIN`` times the largest residual seen. The rows of a
log from its first contact or fault event on are not normal motion and are left out.

A threshold is as valid as its logs: record them on the machine, with the model and friction
the controller uses, over the motions it will make (speed, payload). The detectable force: a
force step F at an actuator reaches the threshold within t when F (1 - exp(-K_O t)) > threshold.
Units: N or N m per actuator, s.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.schema import ProtectTable

BLOCK_S = 0.1  # s
MIN_BLOCKS = 20  # 2 s of normal motion at least
MARGIN = 1.2  # a threshold is at least this times the largest residual seen
EULER = 0.5772156649015329
DETECT_S = 0.01  # the detectable force is given for detection within this time


def normal_residuals(paths: list[str]) -> dict:
    """The residuals of normal motion in the logs: ``rows`` (n, s) stacked, ``blocks`` their
    per-actuator block maxima (m, s), the axes, the force unit, the observer's gain, the rate
    and per log what was used."""
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.logs.logstats import columns

    axes = gain = rate = unit = None
    rows, blocks, used = [], [], []
    for p in paths:
        log = read_log(p)
        if "residual" not in log.channels:
            raise UserError(f"{p}: no 'residual' channel: record the logs with [protect] enabled = true (without "
                            f"thresholds the observer only observes)")
        g = ((log.header.get("machine") or {}).get("protect") or {}).get("gain", ProtectTable().gain)
        r_hz = log.header.get("rate_hz")
        if not (isinstance(r_hz, (int, float)) and r_hz > 0):
            raise UserError(f"{p}: the log records no loop rate (rate_hz): not a run log of pkrt run or pkrt serve")
        if axes is None:
            axes, gain, rate, unit = log.axes(), float(g), float(r_hz), log.units.get("residual", "")
        elif log.axes() != axes or float(g) != gain or float(r_hz) != rate:
            raise UserError(f"{p}: another machine, observer gain or loop rate than {paths[0]} (axes "
                            f"{', '.join(log.axes())}, gain {g}, {r_hz} Hz)")
        r = columns(log.channels["residual"])
        end = len(r)
        cut = [e for e in log.events if e.get("kind") in ("contact", "fault")]
        if cut:
            end = min(end, log.row_of_cycle(int(cut[0]["cycle"])))
        r = r[:end]
        r = r[np.all(np.isfinite(r), axis=1)]
        b = int(round(BLOCK_S * rate))
        m = len(r) // b
        if m:
            blocks.append(np.abs(r[:m * b]).reshape(m, b, -1).max(axis=1))
        rows.append(r)
        used.append({"log": p, "rows": int(len(r)), "blocks": m,
                     "cut_at": (f"cycle {cut[0]['cycle']}: {cut[0]['kind']}" if cut else None)})
    blocks_all = np.vstack(blocks) if blocks else np.zeros((0, len(axes)))
    if len(blocks_all) < MIN_BLOCKS:
        raise UserError(f"{len(blocks_all)} blocks of {BLOCK_S:g} s of normal motion in the logs: give at least "
                        f"{MIN_BLOCKS} ({MIN_BLOCKS * BLOCK_S:g} s)")
    return {"rows": np.vstack(rows), "blocks": blocks_all, "axes": axes, "unit": unit, "gain": gain,
            "rate_hz": rate, "logs": used}


def tune(paths: list[str], false_alarm_rate: float) -> dict:
    """Per-actuator thresholds for ``false_alarm_rate`` false alarms per hour of such motion."""
    if not (math.isfinite(false_alarm_rate) and false_alarm_rate > 0):
        raise UserError(f"--false-alarm-rate must be a positive number per hour, got {false_alarm_rate}")
    n = normal_residuals(paths)
    b, rows = n["blocks"], n["rows"]
    p = min(false_alarm_rate * BLOCK_S / 3600.0, 0.5)
    beta = b.std(axis=0) * math.sqrt(6.0) / math.pi
    mu = b.mean(axis=0) - EULER * beta
    gumbel = mu - beta * math.log(-math.log1p(-p))
    seen = np.abs(rows).max(axis=0)
    th = np.maximum(np.maximum(gumbel, MARGIN * seen), 1e-9)
    rate_at = 3600.0 / BLOCK_S * -np.expm1(-np.exp(-(th - mu) / np.maximum(beta, 1e-300)))
    reach = 1.0 - math.exp(-n["gain"] * DETECT_S)
    hours = len(rows) / n["rate_hz"] / 3600.0
    return {"axes": n["axes"], "unit": n["unit"], "gain": n["gain"], "false_alarm_rate_per_hour": false_alarm_rate,
            "block_s": BLOCK_S, "blocks": int(len(b)), "normal_s": hours * 3600.0, "logs": n["logs"],
            "thresholds": th.tolist(), "gumbel_mu": mu.tolist(), "gumbel_beta": beta.tolist(),
            "max_seen": seen.tolist(), "rms": np.sqrt((rows ** 2).mean(axis=0)).tolist(),
            "p999": np.percentile(np.abs(rows), 99.9, axis=0).tolist(),
            "expected_false_alarms_per_hour": rate_at.tolist(),
            "detectable_in_10ms": (th / reach).tolist()}


def protect_table(result: dict, reaction: str = "stop") -> dict:
    """The ``[protect]`` table of a tuning result."""
    return {"enabled": True, "gain": result["gain"], "thresholds": [float(f"{x:.4g}") for x in result["thresholds"]],
            "reaction": reaction}


def write(result: dict, out: str, machine=None) -> None:
    """``out``: the ``[protect]`` table alone, or with ``machine`` (a ``MachineConfig``) a copy of
    its configuration (paths made absolute) with that table, other ``[protect]`` fields kept."""
    import tomllib

    from pkrt.models.identification.estimate import dump_toml
    from pkrt.rt.app.machinefile import absolute_paths
    from pkrt.rt.core.outputs import atomic_write

    note = (f"[protect] from pkrt protect tune: {result['false_alarm_rate_per_hour']:g} false alarms per hour, "
            f"{result['normal_s']:.1f} s of normal motion in {len(result['logs'])} log(s)")
    if machine is None:
        doc = {"protect": protect_table(result)}
    else:
        src = Path(machine.path)
        doc = absolute_paths(tomllib.loads(src.read_text(encoding="utf-8")), src.parent)
        table = doc.get("protect", {})
        table.update(protect_table(result, table.get("reaction", "stop")))
        doc["protect"] = table
        note = f"{src.name} with {note}"
    with atomic_write(out, "-o") as f:
        f.write(dump_toml(doc, note))


__all__ = ["BLOCK_S", "normal_residuals", "tune", "protect_table", "write"]
