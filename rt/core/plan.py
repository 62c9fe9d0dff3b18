"""A reference sampled at the loop rate, and the pure path maths shared by the offline
planners (``pkrt.models.kinematics.taskspace``) and the runtime's trajectories (``pkrt.rt.runtime.machine.trajectory``).

Part of the core: imports nothing of pkrt but the errors and file kinds. Arrays ``pos``,
``vel``, ``acc`` have shape (n, s) in actuator units (m or rad and their derivatives).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.filekind import CSV, expect
from pkrt.rt.core.inputs import excerpt, shorten_tokens

MAX_SAMPLES = 10_000_000  # a plan longer than this (2.8 h at 1 kHz) is a unit mistake, not a run


def _check_length(n: int, rate_hz: float, what: str) -> None:
    if n > MAX_SAMPLES:
        raise UserError(f"{what}: {n / rate_hz:.6g} s at {rate_hz:g} Hz is {n} samples, more than the "
                        f"{MAX_SAMPLES} a run plans (are the times in seconds?)")


def sample_count(span: float, rate_hz: float, what: str) -> int:
    """Loop-rate samples from 0 to ``span`` s inclusive (a tolerance: 1.001 s * 1000 Hz is
    1000.9999999999999, still 1001 periods), refused past ``MAX_SAMPLES``."""
    n = int(np.floor(span * rate_hz + 1e-6)) + 1
    _check_length(n, rate_hz, what)
    return n


@dataclass
class Planned:
    """A reference sampled at ``rate_hz``: rows k at t = k / rate_hz. A G-code program's also
    has ``line`` (n,): the 1-based program line each sample's motion comes from (0: none),
    and ``events``: what the machine does at rest on the way (spindle, coolant, tool changes,
    program stops), each a dict with ``sample`` (the row it happens at), ``kind``, ``line``,
    ``text`` (one line for the log), ``hold`` (a served machine holds there until resumed)
    and the kind's values (``pkrt.models.planning.gcode``)."""
    rate_hz: float
    pos: np.ndarray
    vel: np.ndarray
    acc: np.ndarray
    description: dict = field(default_factory=dict)
    line: np.ndarray | None = None
    events: list = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.pos)

    @property
    def duration(self) -> float:
        return (self.n - 1) / self.rate_hz

    def extended(self, duration: float) -> "Planned":
        """Cut to ``duration`` s, or hold the last point (zero velocity) up to it."""
        n = int(round(duration * self.rate_hz)) + 1
        _check_length(n, self.rate_hz, "--duration")
        if n <= self.n:
            return Planned(self.rate_hz, self.pos[:n], self.vel[:n], self.acc[:n], self.description,
                           None if self.line is None else self.line[:n], [e for e in self.events if e["sample"] < n])
        extra = n - self.n
        hold = np.repeat(self.pos[-1:], extra, axis=0)
        z = np.zeros_like(hold)
        if np.any(np.abs(self.vel[-1]) > 1e-9):
            raise UserError(f"cannot extend the trajectory to {duration} s: it ends moving")
        line = None if self.line is None else np.concatenate([self.line, np.zeros(extra, self.line.dtype)])
        return Planned(self.rate_hz, np.vstack([self.pos, hold]), np.vstack([self.vel, z]),
                       np.vstack([self.acc, z]), self.description, line, list(self.events))


def quintic_profile(tau: np.ndarray):
    """Minimum-jerk profile s(tau) on [0, 1] with its first two derivatives."""
    t = np.clip(tau, 0.0, 1.0)
    s = 10 * t**3 - 15 * t**4 + 6 * t**5
    ds = 30 * t**2 - 60 * t**3 + 30 * t**4
    dds = 60 * t - 180 * t**2 + 120 * t**3
    return s, ds, dds


def circle_basis(normal) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors e1, e2 spanning the plane normal to ``normal``; circles start at
    centre + r e1 and turn towards e2."""
    nrm = np.asarray(normal, float)
    nrm = nrm / np.linalg.norm(nrm)
    e1 = np.cross(nrm, [1.0, 0, 0] if abs(nrm[0]) < 0.9 else [0, 1.0, 0])
    e1 /= np.linalg.norm(e1)
    return e1, np.cross(nrm, e1)


def concatenate(parts: list[Planned], description: dict) -> Planned:
    """Join planned pieces; each piece's first row repeats the previous piece's last one.
    Program lines (0 where a piece has none) and events follow their samples."""
    pos = [parts[0].pos] + [p.pos[1:] for p in parts[1:]]
    vel = [parts[0].vel] + [p.vel[1:] for p in parts[1:]]
    acc = [parts[0].acc] + [p.acc[1:] for p in parts[1:]]
    line, events, k0 = None, [], 0
    if any(p.line is not None for p in parts):
        line = np.concatenate([(p.line if p.line is not None else np.zeros(p.n, np.int32))[1 if i else 0:]
                               for i, p in enumerate(parts)])
    for p in parts:
        events += [{**e, "sample": e["sample"] + k0} for e in p.events]
        k0 += p.n - 1
    return Planned(parts[0].rate_hz, np.vstack(pos), np.vstack(vel), np.vstack(acc), description, line, events)


def resample(t: np.ndarray, values: np.ndarray, rate_hz: float, what: str):
    """Samples (t increasing, s; values (n, k)) resampled at rate_hz from t[0] by a cubic
    spline with zero end velocities: positions, velocities and accelerations, each (m, k)."""
    from scipy.interpolate import CubicSpline

    sp = CubicSpline(t - t[0], values, bc_type="clamped")
    span = t[-1] - t[0]
    tt = np.minimum(np.arange(sample_count(span, rate_hz, what)) / rate_hz, span)
    return sp(tt), sp(tt, 1), sp(tt, 2)


def hermite_at(t: np.ndarray, pos: np.ndarray, vel: np.ndarray, acc: np.ndarray, tt: np.ndarray):
    """Quintic Hermite interpolation of samples with their velocities and accelerations (t
    increasing, s; each (n, k)) at times ``tt`` (m,) within [t[0], t[-1]]: each interval's
    quintic meets the position, velocity and acceleration at both ends. Returns positions,
    velocities, accelerations (m, k)."""
    i = np.clip(np.searchsorted(t, tt, side="right") - 1, 0, len(t) - 2)
    h = (t[i + 1] - t[i])[:, None]
    u = (tt - t[i])[:, None] / h
    p0, v0, a0 = pos[i], vel[i] * h, acc[i] * h**2
    d = pos[i + 1] - p0 - v0 - 0.5 * a0
    e = vel[i + 1] * h - v0 - a0
    f = acc[i + 1] * h**2 - a0
    # p(u) = p0 + v0 u + a0/2 u^2 + c3 u^3 + c4 u^4 + c5 u^5 on [0, 1] (derivatives scaled by h)
    c2, c3, c4, c5 = 0.5 * a0, 10 * d - 4 * e + 0.5 * f, -15 * d + 7 * e - f, 6 * d - 3 * e + 0.5 * f
    P = p0 + u * (v0 + u * (c2 + u * (c3 + u * (c4 + u * c5))))
    V = (v0 + u * (2 * c2 + u * (3 * c3 + u * (4 * c4 + u * 5 * c5)))) / h
    A = (2 * c2 + u * (6 * c3 + u * (12 * c4 + u * 20 * c5))) / h**2
    return P, V, A


def resample_hermite(t: np.ndarray, pos: np.ndarray, vel: np.ndarray, acc: np.ndarray, rate_hz: float,
                     what: str):
    """``hermite_at`` at rate_hz from t[0] to t[-1]: a reference written at the loop rate
    (``pkrt plan -o``) reads back exactly."""
    span = t[-1] - t[0]
    return hermite_at(t, pos, vel, acc, t[0] + np.minimum(np.arange(sample_count(span, rate_hz, what)) / rate_hz, span))


def state_columns(names: list[str]) -> list[str]:
    """The columns of a reference with its derivatives: the names, then ``<name>_vel``, then
    ``<name>_acc`` (units: the names' per second and per second squared)."""
    return [*names, *(f"{n}_vel" for n in names), *(f"{n}_acc" for n in names)]


def csv_columns(path: str) -> list[str] | None:
    """The header of a CSV file (first line that is not a comment), None if it cannot be read
    (``read_csv_samples`` then says why)."""
    try:
        with open(path, newline="") as f:
            for r in csv.reader(f):
                if r and not r[0].lstrip().startswith("#"):
                    return [h.strip().split(" ")[0] for h in r]
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


def read_csv_table(path: str, allowed: list[list[str]]):
    """A CSV with a header ``t`` then one of the ``allowed`` column lists, checked (finite
    numbers, increasing time). Returns (header, t (n,), values (n, columns)). Rows are parsed
    one at a time into flat float buffers (8 bytes a value, no list of rows in memory)."""
    import array

    expect(path, CSV)  # another kind of file: say what it is
    try:
        with open(path, newline="") as f:
            head, t, vals = None, array.array("d"), array.array("d")
            for i, r in enumerate(csv.reader(f)):
                if not r or r[0].lstrip().startswith("#"):
                    continue
                if head is None:
                    head = _csv_header(path, r, allowed)
                    continue
                if len(r) != len(head):
                    raise UserError(f"{path}: row {len(t) + 2} has {len(r)} columns, expected {len(head)}")
                try:
                    row = [float(x) for x in r]
                except ValueError:
                    bad = next(x for x in r if not _is_float(x))
                    raise UserError(f"{path}: row {len(t) + 2}: expected a number, got {excerpt(bad)}") from None
                t.append(row[0])
                vals.extend(row[1:])
    except csv.Error as e:  # a field beyond the csv module's limit (128 kB), a NUL byte, ...
        raise UserError(f"{path}: not a CSV file the reader accepts: {shorten_tokens(str(e))}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read trajectory: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text CSV file") from None
    if head is None or len(t) < 2:
        raise UserError(f"{path}: a trajectory needs a header and at least 2 rows")
    t = np.frombuffer(t, dtype=float)
    vals = np.frombuffer(vals, dtype=float).reshape(len(t), len(head) - 1)
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(vals))):
        raise UserError(f"{path}: values must be finite")
    if np.any(np.diff(t) <= 0):
        k = int(np.argmax(np.diff(t) <= 0))
        raise UserError(f"{path}: time must increase (row {k + 3}: t = {t[k + 1]})")
    return head, t, vals


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv_header(path: str, r: list[str], allowed: list[list[str]]) -> list[str]:
    head = [h.strip().split(" ")[0] for h in r]
    if head[0] != "t":
        raise UserError(f"{path}: the first column must be 't' (seconds), got {excerpt(head[0])}")
    if head[1:] not in allowed and head[1:] not in [state_columns(a) for a in allowed]:
        raise UserError(f"{path}: columns must be {' or '.join('t,' + ','.join(a) for a in allowed)} (optionally "
                        f"followed by <name>_vel and <name>_acc columns); got {excerpt(','.join(head))}")
    return head


def read_csv_samples(path: str, rate_hz: float, allowed: list[list[str]]):
    """A CSV with a header ``t`` then one of the ``allowed`` column lists, resampled to the
    loop rate by a clamped cubic spline; or the list followed by its velocities and
    accelerations (``state_columns``), resampled by quintic Hermite interpolation (read back
    exactly at the loop rate). Returns (header: t and the positions' names, P, Pd, Pdd), each
    (n, columns)."""
    head, t, vals = read_csv_table(path, allowed)
    k = len(head) - 1
    if k % 3 == 0 and head[1:] == state_columns(head[1:1 + k // 3]):  # positions with their derivatives
        c = k // 3
        return (head[:1 + c], *resample_hermite(t, vals[:, :c], vals[:, c:2 * c], vals[:, 2 * c:], rate_hz, str(path)))
    return (head, *resample(t, vals, rate_hz, str(path)))


def plan_moves(points: np.ndarray, durations, rate_hz: float, dwell: float = 0.0, what: str = "moves") -> Planned:
    """Quintic point-to-point moves through ``points`` (k, s) with given durations (s), refused
    (``what`` named) beyond ``MAX_SAMPLES``."""
    _check_length(int(sum(max(round(T * rate_hz), 1) + round(dwell * rate_hz) for T in durations)), rate_hz, what)
    pos, vel, acc = [points[:1]], [np.zeros((1, points.shape[1]))], [np.zeros((1, points.shape[1]))]
    for a, b, T in zip(points[:-1], points[1:], durations):
        n = max(int(round(T * rate_hz)), 1)
        tau = np.arange(1, n + 1) / n
        s, ds, dds = quintic_profile(tau)
        d = b - a
        pos.append(a + s[:, None] * d)
        vel.append(ds[:, None] * d / T)
        acc.append(dds[:, None] * d / T**2)
        if dwell > 0:
            m = int(round(dwell * rate_hz))
            pos.append(np.repeat(b[None], m, 0))
            vel.append(np.zeros((m, len(b))))
            acc.append(np.zeros((m, len(b))))
    return Planned(rate_hz, np.vstack(pos), np.vstack(vel), np.vstack(acc),
                   {"kind": "moves", "points": points.tolist()})


def cartesian_path(kind: str, rate_hz: float, **kw):
    """Platform path samples (P, Pd, Pdd), each (n, 3).

    ``line``: from ``start`` to ``end`` (m) in ``duration`` s with a quintic profile.
    ``circle``: ``centre`` (m), ``diameter`` (m), ``normal`` (unit), ``speed`` peak (m/s),
    ``laps``; speed ramps up and down with quintic profiles over ``ramp`` s.
    """
    if kind == "line":
        a, b, T = np.asarray(kw["start"], float), np.asarray(kw["end"], float), float(kw["duration"])
        n = max(int(round(T * rate_hz)), 1)
        s, ds, dds = quintic_profile(np.arange(0, n + 1) / n)
        d = b - a
        return a + s[:, None] * d, ds[:, None] * d / T, dds[:, None] * d / T**2
    if kind == "circle":
        c = np.asarray(kw["centre"], float)
        r = 0.5 * float(kw["diameter"])
        e1, e2 = circle_basis(kw.get("normal", (0, 0, 1)))
        v, ramp, laps = float(kw["speed"]), float(kw.get("ramp", 0.3)), float(kw.get("laps", 1.0))
        L_arc = 2 * np.pi * r * laps
        # arc length: quintic ramp to v over `ramp` s (distance v ramp / 2 each), cruise, ramp down
        cruise = (L_arc - v * ramp) / v
        if cruise < 0:
            raise UserError("circle too short for its speed ramp")
        T = 2 * ramp + cruise
        t = np.arange(0, int(round(T * rate_hz)) + 1) / rate_hz
        sd = np.empty_like(t)
        sdd = np.empty_like(t)
        sarc = np.empty_like(t)
        for k, tk in enumerate(t):
            if tk < ramp:
                p, dp, ddp = quintic_profile(np.array([tk / ramp]))
                sarc[k] = v * ramp * _quintic_integral(tk / ramp)
                sd[k], sdd[k] = v * p[0], v * dp[0] / ramp
            elif tk < ramp + cruise:
                sarc[k] = v * ramp / 2 + v * (tk - ramp)
                sd[k], sdd[k] = v, 0.0
            else:
                u = min((tk - ramp - cruise) / ramp, 1.0)
                p, dp, ddp = quintic_profile(np.array([u]))
                sarc[k] = v * ramp / 2 + v * cruise + v * ramp * (u - _quintic_integral(u))
                sd[k], sdd[k] = v * (1 - p[0]), -v * dp[0] / ramp
        phi = sarc / r
        cs, sn = np.cos(phi), np.sin(phi)
        # start on the circle at c + r e1 (phi = 0)
        P = c + r * (cs[:, None] * e1 + sn[:, None] * e2)
        dP = (-sn[:, None] * e1 + cs[:, None] * e2)
        Pd = dP * sd[:, None]
        Pdd = dP * sdd[:, None] - (cs[:, None] * e1 + sn[:, None] * e2) * (sd**2 / r)[:, None]
        return P, Pd, Pdd
    raise UserError(f"unknown Cartesian path kind '{kind}'")


def _quintic_integral(u: float) -> float:
    """Integral of the quintic profile s(x) from 0 to u."""
    return 2.5 * u**4 - 3 * u**5 + u**6
