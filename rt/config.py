"""Machine configuration files (TOML): model, tree, rate, controller gains, limits, drives.

Paths inside a configuration are relative to the configuration file. A machine argument is a
path or a built-in name (``orthoglide`` means ``models/machines/orthoglide-sim.toml``).
Units: SI at the actuators (m or rad, N or N m), Hz, s.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError
from .filekind import MACHINE, expect

MACHINES_DIR = Path(__file__).resolve().parent.parent / "models" / "machines"


@dataclass(frozen=True)
class ControllerConfig:
    kind: str  # "ct" (computed torque) or "pd" (PD plus gravity)
    kp: np.ndarray  # 1/s^2, per axis
    kd: np.ndarray  # 1/s, per axis
    tau_max: np.ndarray  # N or N m, per axis


@dataclass(frozen=True)
class Limits:
    position: np.ndarray  # (s, 2) m or rad
    velocity: np.ndarray  # (s,) m/s or rad/s
    acceleration: np.ndarray  # (s,) for trajectories
    following_error: np.ndarray  # (s,)
    stale_cycles: int  # feedback not fresh this many cycles in a row -> fault
    watchdog_cycles: int  # this many consecutive overruns -> fault


@dataclass(frozen=True)
class RealtimeConfig:
    priority: int = 0  # SCHED_FIFO priority, 0 = do not ask
    cpu: int = -1  # CPU affinity, -1 = do not pin
    mlockall: bool = False
    gc_freeze: bool = True


@dataclass(frozen=True)
class MachineConfig:
    path: str
    name: str
    model: str  # model file path or built-in name
    tree: str  # controller tree file path
    rate_hz: float
    controller: ControllerConfig
    limits: Limits
    drives: dict  # the [drives] table, passed to the backend as is
    realtime: RealtimeConfig
    raw: dict = field(repr=False, default_factory=dict)

    @property
    def directory(self) -> Path:
        return Path(self.path).parent

    @property
    def model_path(self) -> str:
        """The model file (a built-in name, one word without a suffix, maps to
        models/machines/NAME.toml)."""
        p = Path(self.model)
        return str(p if p.suffix or len(p.parts) > 1 else MACHINES_DIR / f"{self.model}.toml")

    def resolve(self, p: str) -> str:
        """A path from the configuration, relative to the configuration file."""
        q = Path(p)
        return str(q if q.is_absolute() else self.directory / q)


def resolve_machine_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.exists():
        return p
    for cand in (MACHINES_DIR / f"{name_or_path}-sim.toml", MACHINES_DIR / f"{name_or_path}.toml"):
        if cand.exists() and "[machine]" in cand.read_text(errors="replace"):
            return cand
    raise UserError(f"{name_or_path}: no such machine configuration file or built-in machine")


def _vec(tbl, key, s, where, path, default=None, positive=True) -> np.ndarray:
    if key not in tbl:
        if default is None:
            raise UserError(f"{path}: [{where}], field '{key}': missing")
        v = default
    else:
        v = tbl[key]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * s
    try:
        a = np.asarray(v, dtype=float)
    except (TypeError, ValueError):
        a = np.zeros(0)
    if a.shape != (s,) or not np.all(np.isfinite(a)) or (positive and np.any(a <= 0)):
        raise UserError(f"{path}: [{where}], field '{key}': expected {'a positive number' if positive else 'a number'}"
                        f" or a list of {s}, got {v!r}")
    return a


def _int(tbl, key, default, where, path, lowest) -> int:
    v = tbl.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
        raise UserError(f"{path}: [{where}], field '{key}': expected a whole number >= {lowest}, got {v!r}")
    return v


def load_machine(name_or_path: str, n_axes: int | None = None, ranges: np.ndarray | None = None) -> MachineConfig:
    """Read a machine configuration. ``n_axes`` and ``ranges`` (from the model) size the
    per-axis values and default the position limits; without them they come from the
    machine's tree (its header records the actuators' ranges), so the runtime never loads
    the model."""
    path = resolve_machine_path(name_or_path)
    expect(path, MACHINE)  # another kind of file: say what it is
    try:
        doc = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a valid TOML file: {e}") from None
    m = doc.get("machine")
    if not isinstance(m, dict):
        raise UserError(f"{path}: [machine] table missing")
    for key in ("name", "model", "tree"):
        if not isinstance(m.get(key), str):
            raise UserError(f"{path}: [machine], field '{key}': missing or not a string")
    model = m["model"]
    if "/" in model or Path(model).suffix:  # a file (any extension), relative to this one
        model = str(path.parent / model) if not Path(model).is_absolute() else model
    if n_axes is None or ranges is None:  # the runtime's view of the model: its tree's header
        from .treefile import load_tree
        ranges = np.array(load_tree(path.parent / m["tree"]).header["actuators"]["ranges"], float)
        n_axes = len(ranges)
    s = n_axes
    rate = m.get("rate_hz", 1000.0)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 1 <= rate <= 100000:
        raise UserError(f"{path}: [machine], field 'rate_hz': expected a number in [1, 100000], got {rate!r}")

    c = doc.get("controller", {})
    kind = c.get("kind", "ct")
    if kind not in ("ct", "pd"):
        raise UserError(f"{path}: [controller], field 'kind': expected 'ct' or 'pd', got {kind!r}")
    bw = _vec(c, "bandwidth_hz", s, "controller", path, default=10.0)
    w = 2 * np.pi * bw
    kp = _vec(c, "kp", s, "controller", path, default=list(w * w))
    kd = _vec(c, "kd", s, "controller", path, default=list(2.0 * w))  # critically damped
    tau_max = _vec(c, "tau_max", s, "controller", path)
    ctrl = ControllerConfig(kind, kp, kd, tau_max)

    lim = doc.get("limits", {})
    try:
        pos = np.asarray(lim.get("position", ranges), dtype=float)
    except (TypeError, ValueError):
        pos = np.zeros(0)
    if pos.shape != (s, 2) or not np.all(np.isfinite(pos)) or np.any(pos[:, 0] >= pos[:, 1]):
        raise UserError(f"{path}: [limits], field 'position': expected {s} [low, high] pairs")
    limits = Limits(pos, _vec(lim, "velocity", s, "limits", path),
                    _vec(lim, "acceleration", s, "limits", path),
                    _vec(lim, "following_error", s, "limits", path),
                    _int(lim, "stale_cycles", 3, "limits", path, 1),
                    _int(lim, "watchdog_cycles", 5, "limits", path, 1))
    drives = doc.get("drives")
    if not isinstance(drives, dict) or not isinstance(drives.get("backend"), str):
        raise UserError(f"{path}: [drives], field 'backend': missing")
    rt = doc.get("realtime", {})
    for key in ("mlockall", "gc_freeze"):
        if not isinstance(rt.get(key, False), bool):
            raise UserError(f"{path}: [realtime], field '{key}': expected true or false")
    realtime = RealtimeConfig(_int(rt, "priority", 0, "realtime", path, 0),
                              _int(rt, "cpu", -1, "realtime", path, -1),
                              rt.get("mlockall", False), rt.get("gc_freeze", True))
    return MachineConfig(str(path), m["name"], model, str(path.parent / m["tree"]), float(rate),
                         ctrl, limits, drives, realtime, doc)
