"""The schema of machine configuration files: one dataclass per table, one validator.

Every field of every table is declared here once, with its default, unit, constraints and
documentation (``spec``); ``validate`` checks a TOML table against its class and returns the
typed instance. Every bad value is one ``ConfigError`` line naming the file, the table and the
field (exit 2). Per-axis fields ("axes") take one number for every axis or a list of s numbers
and become float arrays of shape (s,). Units: SI at the actuators (m or rad, N or N m), Hz, s.

This module holds the machinery and the tables every machine has; a drive family's ``[drives]``
and ``[emulator]`` tables live with its driver (``pkrt.drivers``: ``DRIVES_TABLE`` and
``EMULATOR_TABLE`` of the backend's class), built from ``spec`` and ``PlantTable`` here. It
imports only numpy and ``pkrt.rt.core.errors`` (the core).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.inputs import excerpt


def field_message(path, where: str, name: str | None, what: str) -> str:
    """The one-line form of every configuration error: ``{file}: {where}, field '{name}': {what}``
    (``where``: the table, e.g. ``[controller]``); machine descriptions use it too."""
    return f"{path}: {where}" + (f", field '{key_text(name)}'" if name else "") + f": {what}"


def key_text(key: str) -> str:
    """A key of the user's file (a table or field name) as a message shows it: at most 40
    characters."""
    return key if len(key) <= 40 else excerpt(key, 40).strip("'\"")


class ConfigError(UserError):
    """A bad value in a machine configuration (exit 2), one line:
    ``{file}: [{table}], field '{name}': {what}`` (``at``); drivers raise it for relations only
    they can check (``pkrt.drivers.base.DriveConfigError`` is this class)."""

    def __init__(self, message: str, path: str | None = None, table: str | None = None, name: str | None = None):
        super().__init__(message)
        self.path, self.table, self.field = path, table, name

    @classmethod
    def at(cls, path, table: str, name: str | None, what: str) -> "ConfigError":
        return cls(field_message(path, f"[{key_text(table)}]", name, what), str(path), table, name)


@dataclass(frozen=True, kw_only=True)
class Context:
    """What a table's validation needs from outside it: the file, the number of axes s, the
    loop rate (Hz), the actuator ranges ((s, 2), for the default position limits) and the
    tables validated before (``tables``: name -> instance)."""

    path: str
    table: str
    s: int
    rate_hz: float = 1000.0
    ranges: np.ndarray | None = None
    tables: dict = dataclasses.field(default_factory=dict)

    def error(self, name: str | None, what: str) -> ConfigError:
        return ConfigError.at(self.path, self.table, name, what)


REQUIRED = dataclasses.MISSING

# field kinds
NUMBER, INTEGER, BOOL, STRING, AXES, IDS, PAIRS, TABLE, CHANNEL, NUMBERS, POINTS = (
    "number", "integer", "bool", "string", "axes", "ids", "pairs", "table", "channel", "numbers", "points")


def spec(kind: str, doc: str, default: Any = REQUIRED, *, unit: str = "", lo: float | None = None,
         hi: float | None = None, lo_open: bool = False, choices: tuple | None = None, integer: bool = False,
         derive: Callable[[dict, Context], Any] | None = None) -> Any:
    """A schema field. ``kind``: number, integer, bool, string, axes (a number or a list of s
    numbers), ids (a list of s distinct integers), pairs (s [low, high] pairs), table (a table of
    plain values), channel (a string or an integer >= 0). ``lo``/``hi``: inclusive bounds (``lo_open``:
    > lo); ``integer``: axes of whole numbers; ``derive(values, ctx)``: the default computed from
    the fields before this one (the field may then be missing); ``default=None``: optional."""
    meta = dict(kind=kind, doc=doc, unit=unit, lo=lo, hi=hi, lo_open=lo_open, choices=choices,
                integer=integer, derive=derive)
    if derive is not None:
        default = None
    if default is REQUIRED:
        return dataclasses.field(metadata=meta)
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def describe_constraint(meta: dict, s: int | str = "s") -> str:
    """The expected value of a field in words (the error message and the README)."""
    kind, lo, hi = meta["kind"], meta["lo"], meta["hi"]
    if meta["choices"]:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    base = {NUMBER: "a number", INTEGER: "an integer", BOOL: "true or false", STRING: "a string",
            AXES: "a whole number" if meta["integer"] else "a number", IDS: f"a list of {s} distinct integers",
            PAIRS: f"a list of {s} [low, high] pairs (low < high)", TABLE: "a table of plain values",
            CHANNEL: "a string or an integer >= 0", NUMBERS: "a list of numbers",
            POINTS: "a list of at least 2 lists of numbers, all of one length"}[kind]
    if lo is not None and hi is not None:
        base += f" in {'(' if meta['lo_open'] else '['}{lo:g}, {hi:g}]"
    elif lo is not None:
        base += f" {'>' if meta['lo_open'] else '>='} {lo:g}"
    elif hi is not None:
        base += f" <= {hi:g}"
    if kind == AXES:
        base += f" (or a list of {s})"
    return base


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


INT64 = 2 ** 63  # integers of a configuration must fit a signed 64-bit integer
LARGEST = 1e12  # magnitude of any number of a configuration or description (SI units)


def finite_real(v) -> bool:
    """``v`` is a TOML number (not a bool) of magnitude at most ``LARGEST``: no inf or nan, no
    integer beyond it (TOML integers are unbounded). Every quantity of a machine is far
    below (the largest default, a plant's force limit, is 1e9 N), and the computations on
    such numbers (squares, products of a few) stay far from the float range: a value of
    1e300 is refused here rather than overflowing later (a numpy warning, a NaN)."""
    if not _real(v):
        return False
    if isinstance(v, int):
        return abs(v) <= LARGEST
    return math.isfinite(v) and abs(v) <= LARGEST


def too_large(v) -> str:
    """The error message's hint when ``v`` (or an item of the list ``v``) is a finite number
    beyond ``LARGEST``: " (magnitude beyond 1e+12)"; else an empty string."""
    items = v if isinstance(v, list) else [v]
    big = any(_real(x) and (isinstance(x, int) or math.isfinite(x)) and abs(x) > LARGEST for x in items)
    return f" (magnitude beyond {LARGEST:g})" if big else ""


def unknown_key(table: dict, known) -> str | None:
    """The first key of ``table`` not in ``known`` (a typo in an optional field), or None."""
    return next((k for k in table if k not in known), None)


def unknown_what(known) -> str:
    """The message for an unknown key: ``unknown field (known: ...)``."""
    return f"unknown field (known: {', '.join(sorted(known))})"


def _in_bounds(x: float, meta: dict) -> bool:
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None and (x <= lo if meta["lo_open"] else x < lo):
        return False
    return hi is None or x <= hi


def _check_value(v, meta: dict, ctx: Context):
    """The typed value, or None when ``v`` is not acceptable."""
    check = _CHECKERS.get(meta["kind"])
    if check is None:
        raise AssertionError(meta["kind"])
    return check(v, meta, ctx.s)


# Each checker: (value, field metadata, number of axes s) -> the typed value, or None.

def _int_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_number(v, meta: dict, s: int):
    if not finite_real(v) or not _in_bounds(v, meta):
        return None
    return float(v)


def _check_integer(v, meta: dict, s: int):
    if not (_int_id(v) and -INT64 <= v < INT64) or not _in_bounds(v, meta):
        return None
    return int(v)


def _check_bool(v, meta: dict, s: int):
    return v if isinstance(v, bool) else None


def _check_string(v, meta: dict, s: int):
    if not isinstance(v, str) or not v or (meta["choices"] and v not in meta["choices"]):
        return None
    return v


def _check_channel(v, meta: dict, s: int):
    return v if (isinstance(v, str) and v) or (_int_id(v) and 0 <= v < INT64) else None


def _check_axes(v, meta: dict, s: int):
    vals = v if isinstance(v, list) else [v] * s
    if len(vals) != s or not all(finite_real(x) and _in_bounds(x, meta) for x in vals):
        return None
    if meta["integer"] and any(x != int(x) for x in vals):
        return None
    return np.array(vals, dtype=float)


def _check_ids(v, meta: dict, s: int):
    if (not isinstance(v, list) or len(v) != s or not all(_int_id(x) and _in_bounds(x, meta) for x in v)
            or len(set(v)) != s):  # integers first: a nested list is not hashable
        return None
    return tuple(v)


def _is_pair(p) -> bool:
    return isinstance(p, list) and len(p) == 2 and all(finite_real(x) for x in p) and p[0] < p[1]


def _check_pairs(v, meta: dict, s: int):
    if not isinstance(v, list) or len(v) != s or not all(_is_pair(p) for p in v):
        return None
    return np.array(v, dtype=float)


def _check_numbers(v, meta: dict, s: int):
    if not isinstance(v, (list, tuple)) or not v or not all(finite_real(x) for x in v):
        return None
    return np.array(v, dtype=float)


def _check_points(v, meta: dict, s: int):
    """The width is checked against the model's actuators where it is used."""
    if not isinstance(v, list) or len(v) < 2 or not all(
            isinstance(p, list) and p and len(p) == len(v[0]) and all(finite_real(x) for x in p)
            for p in v):
        return None
    return np.array(v, dtype=float)


def _check_table(v, meta: dict, s: int):
    if not isinstance(v, dict) or not all(isinstance(x, (str, int, float, bool)) for x in v.values()):
        return None
    return dict(v)


_CHECKERS = {
    NUMBER: _check_number, INTEGER: _check_integer, BOOL: _check_bool, STRING: _check_string,
    CHANNEL: _check_channel, AXES: _check_axes, IDS: _check_ids, PAIRS: _check_pairs,
    NUMBERS: _check_numbers, POINTS: _check_points, TABLE: _check_table,
}


def default_of(f: dataclasses.Field) -> Any:
    """A field's default (``REQUIRED`` when it has none; derived fields: None)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def fields(cls) -> list[dataclasses.Field]:
    """The schema fields of a table class, in declaration order."""
    return [f for f in dataclasses.fields(cls) if "kind" in f.metadata]


def validate(cls, table: Any, ctx: Context):
    """The instance of table class ``cls`` for the TOML table ``table`` (a dict; None: absent).
    Unknown fields, missing required fields and bad values raise ``ConfigError``; then the
    class's ``check(ctx)`` (relations between fields) runs."""
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ctx.error(None, f"expected a table, got {excerpt(table)}")
    known = {f.name for f in fields(cls)}
    key = unknown_key(table, known)
    if key is not None:
        raise ctx.error(key, unknown_what(known))
    values: dict[str, Any] = {}
    for f in fields(cls):
        meta = f.metadata
        if f.name not in table:
            if meta["derive"] is not None:
                values[f.name] = meta["derive"](values, ctx)
                continue
            if default_of(f) is REQUIRED:
                raise ctx.error(f.name, f"missing (expected {describe_constraint(meta, ctx.s)})")
            d = default_of(f)
            values[f.name] = d if d is None else _check_value(d, meta, ctx)  # e.g. one number -> s axes
            continue
        v = table[f.name]
        typed = _check_value(v, meta, ctx)
        if typed is None:
            raise ctx.error(f.name, f"expected {describe_constraint(meta, ctx.s)}, got {excerpt(v)}{too_large(v)}")
        values[f.name] = typed
    inst = cls(**values)
    check = getattr(inst, "check", None)
    if check is not None:
        check(ctx)
    return inst


def _ranges(values: dict, ctx: Context) -> np.ndarray:
    if ctx.ranges is None:
        raise ctx.error("position", "missing (and no actuator ranges to default to)")
    return np.array(ctx.ranges, dtype=float)


def _bandwidth_kp(values: dict, ctx: Context) -> np.ndarray:
    w = 2 * np.pi * values["bandwidth_hz"]
    return w * w


def _bandwidth_kd(values: dict, ctx: Context) -> np.ndarray:
    return 2.0 * (2 * np.pi * values["bandwidth_hz"])  # critically damped


# -- the tables --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class MachineTable:
    """``[machine]``: what the machine is and how fast its loop runs."""

    name: str = spec(STRING, "the machine's name (logs, summaries)")
    model: str = spec(STRING, "model file (relative to this file) or built-in model name")
    tree: str = spec(STRING, "the controller's reduced-dynamics tree file (relative to this file)")
    rate_hz: float = spec(NUMBER, "control loop rate", 1000.0, unit="Hz", lo=1.0, hi=100000.0)


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    """``[controller]``: the controller and its per-axis gains."""

    kind: str = spec(STRING, "ct: computed torque; pd: PD plus gravity", "ct", choices=("ct", "pd"))
    model: str = spec(STRING, "the model in the loop: tree (the machine's tree) or exact (the exact reduction, "
                      "warm-started from the last cycle; refused in real time when its p99 exceeds the period)",
                      "tree", choices=("tree", "exact"))
    bandwidth_hz: np.ndarray = spec(AXES, "closed-loop bandwidth: the default kp = (2 pi f)^2, kd = 2 (2 pi f)",
                                    10.0, unit="Hz", lo=0.0, lo_open=True)
    kp: np.ndarray = spec(AXES, "position gain", unit="1/s^2", lo=0.0, lo_open=True, derive=_bandwidth_kp)
    kd: np.ndarray = spec(AXES, "velocity gain", unit="1/s", lo=0.0, lo_open=True, derive=_bandwidth_kd)
    tau_max: np.ndarray = spec(AXES, "saturation of the commanded force or torque", unit="N or N m",
                               lo=0.0, lo_open=True)
    viscous: np.ndarray = spec(AXES, "viscous friction feedforward", 0.0, unit="N s/m or N m s/rad", lo=0.0)
    coulomb: np.ndarray = spec(AXES, "Coulomb friction feedforward", 0.0, unit="N or N m", lo=0.0)


@dataclass(frozen=True, kw_only=True)
class Limits:
    """``[limits]``: what the safety supervisor and the trajectory check enforce."""

    position: np.ndarray = spec(PAIRS, "[low, high] per axis (default: the model's actuator ranges)",
                                unit="m or rad", derive=_ranges)
    velocity: np.ndarray = spec(AXES, "velocity limit", unit="m/s or rad/s", lo=0.0, lo_open=True)
    acceleration: np.ndarray = spec(AXES, "acceleration limit (trajectories beyond it are refused)",
                                    unit="m/s^2 or rad/s^2", lo=0.0, lo_open=True)
    following_error: np.ndarray = spec(AXES, "following error limit", unit="m or rad", lo=0.0, lo_open=True)
    stale_cycles: int = spec(INTEGER, "feedback not fresh this many cycles in a row: fault", 3, lo=1)
    watchdog_cycles: int = spec(INTEGER, "this many overruns in a row: fault", 5, lo=1)


@dataclass(frozen=True, kw_only=True)
class RealtimeConfig:
    """``[realtime]``: real-time settings asked for by real-time runs (each reported)."""

    priority: int = spec(INTEGER, "SCHED_FIFO priority (0: do not ask)", 0, lo=0, hi=99)
    cpu: int = spec(INTEGER, "pin the loop to this CPU (-1: do not pin)", -1, lo=-1)
    mlockall: bool = spec(BOOL, "lock the process's memory", False)
    gc_freeze: bool = spec(BOOL, "collect then freeze the garbage collector before the loop", True)


@dataclass(frozen=True, kw_only=True)
class DemoTable:
    """``[demo]``: the machine's demo trajectory (``pkrt run`` without ``--traj``), planned
    offline from the model: quintic moves through actuator ``points``, then a task-space piece
    (``task``) from and back to the tool pose at the first point (or the reference assembly)."""

    points: np.ndarray | None = spec(POINTS, "actuator values visited first by quintic moves (back to the "
                                     "first at the end)", None, unit="m or rad")
    move_time: float = spec(NUMBER, "time per move between points", 0.5, unit="s", lo=0.0, lo_open=True)
    dwell: float = spec(NUMBER, "rest at each point", 0.1, unit="s", lo=0.0)
    task: str = spec(STRING, "task-space piece: none, circle or adept-cycle", "none",
                     choices=("none", "circle", "adept-cycle"))
    centre: np.ndarray | None = spec(NUMBERS, "circle centre in task coordinates (default: the home tool pose)",
                                     None, unit="m, rad")
    diameter: float = spec(NUMBER, "circle diameter", 0.1, unit="m", lo=0.0, lo_open=True)
    normal: np.ndarray = spec(NUMBERS, "circle plane normal (x, y, z)", (0.0, 0.0, 1.0))
    speed: float | None = spec(NUMBER, "circle: peak tool speed with quintic speed ramps (else: quintic "
                               "phase over circle_time)", None, unit="m/s", lo=0.0, lo_open=True)
    ramp: float = spec(NUMBER, "circle: speed ramp time", 0.25, unit="s", lo=0.0, lo_open=True)
    circle_time: float = spec(NUMBER, "circle: time without speed", 2.0, unit="s", lo=0.0, lo_open=True)
    laps: float = spec(NUMBER, "circle: laps", 1.0, lo=0.0, lo_open=True)
    tilt: float = spec(NUMBER, "circle, 6-DOF tool: roll amplitude of the tilt oscillation", 0.0, unit="rad", lo=0.0)
    tilt_cycles: float = spec(NUMBER, "circle: tilt oscillations per lap", 2.0, lo=0.0, lo_open=True)
    approach: float = spec(NUMBER, "line from the home tool pose to the piece's start and back", 0.3,
                           unit="s", lo=0.0, lo_open=True)
    start: np.ndarray | None = spec(NUMBERS, "Adept cycle start (x, y, z; default: the home tool position)",
                                    None, unit="m")
    cycle_time: float = spec(NUMBER, "Adept cycle time", 0.5, unit="s", lo=0.0, lo_open=True)
    height: float = spec(NUMBER, "Adept cycle: up and down", 0.025, unit="m", lo=0.0, lo_open=True)
    width: float = spec(NUMBER, "Adept cycle: across", 0.305, unit="m", lo=0.0, lo_open=True)
    direction: np.ndarray = spec(NUMBERS, "Adept cycle: across along (x, y, z)", (1.0, 0.0, 0.0))
    cycles: int = spec(INTEGER, "Adept cycles", 1, lo=1, hi=10000)

    def check(self, ctx: Context) -> None:
        for name in ("normal", "direction"):
            v = getattr(self, name)
            if len(v) != 3 or not np.linalg.norm(v) > 0:
                raise ctx.error(name, f"expected 3 numbers, not all zero, got {v.tolist()}")
        if self.start is not None and len(self.start) != 3:
            raise ctx.error("start", f"expected 3 numbers (x, y, z), got {self.start.tolist()}")


@dataclass(frozen=True, kw_only=True)
class TrackerTable:
    """``[tracker]``: the instrument that measures the tool for geometric calibration (a laser
    tracker: the tool's position, and its orientation on a machine whose tool has one). Its
    noise weighs the measurements in ``pkrt calibrate``; on the simulated plant
    (``pkrt run --measure``) it is the simulated instrument, at ``pose`` with this noise."""

    noise_position: float = spec(NUMBER, "standard deviation of each position coordinate", 10e-6, unit="m",
                                 lo=0.0, lo_open=True)
    noise_orientation: float = spec(NUMBER, "standard deviation of each orientation component (rotation vector)",
                                    20e-6, unit="rad", lo=0.0, lo_open=True)
    pose: np.ndarray = spec(NUMBERS, "simulated instrument: its frame in the machine's base frame, x, y, z (m) and "
                            "roll, pitch, yaw (rad, R = Rz(yaw) Ry(pitch) Rx(roll))", (0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    seed: int = spec(INTEGER, "simulated instrument: noise generator seed", 0, lo=0)

    def check(self, ctx: Context) -> None:
        if len(self.pose) != 6:
            raise ctx.error("pose", f"expected 6 numbers (x, y, z, roll, pitch, yaw), got {self.pose.tolist()}")


@dataclass(frozen=True, kw_only=True)
class PlantTable:
    """The simulated plant's fields (``[drives]`` of ``sim``, ``[emulator]`` of the HIL buses)."""

    plant_tree: str | None = spec(STRING, "the plant's tree file, finer than the controller's (relative to this "
                                  "file); or plant", None)
    plant: str | None = spec(STRING, "exact (backend sim only: the HIL emulators run on trees): H, D, p_ext of "
                             "the plant from the exact reduction at every RK4 stage (built from the model by pkrt "
                             "run; 4 x substeps exact evaluations per cycle); or plant_tree", None, choices=("exact",))
    plant_model: str | None = spec(STRING, "with plant = \"exact\": the plant's own machine description (relative to "
                                   "this file, or a built-in name), a truth the controller's model does not know "
                                   "(same joints and actuators; default: the machine's model)", None)
    viscous: float = spec(NUMBER, "plant viscous friction per actuator", 0.0, unit="N s/m or N m s/rad", lo=0.0)
    coulomb: float = spec(NUMBER, "plant Coulomb friction per actuator", 0.0, unit="N or N m", lo=0.0)
    force_limit: float = spec(NUMBER, "plant actuator force limit", 1e9, unit="N or N m", lo=0.0, lo_open=True)
    substeps: int = spec(INTEGER, "RK4 substeps per cycle", 4, lo=1, hi=1000)
    mass_scale: float = spec(NUMBER, "model mismatch: the plant's masses times this", 1.0, lo=0.0, lo_open=True)

    def check(self, ctx: Context) -> None:
        if self.plant is not None and self.plant_tree is not None:
            raise ctx.error("plant", "give plant = \"exact\" or plant_tree, not both")
        if self.plant is None and self.plant_tree is None:
            raise ctx.error("plant", "missing: give plant_tree = FILE (a tree finer than the controller's) or "
                                     "plant = \"exact\"")
        if self.plant_model is not None and self.plant != "exact":
            raise ctx.error("plant_model", "applies to plant = \"exact\" only")


@dataclass(frozen=True, kw_only=True)
class EmulatorPlantTable(PlantTable):
    """The plant of a HIL drive emulator: on a tree only (the emulator processes do not load models)."""

    def check(self, ctx: Context) -> None:
        super().check(ctx)
        if self.plant == "exact":
            raise ctx.error("plant", "the HIL emulators run their plant on a tree: give plant_tree "
                                     "(plant = \"exact\" is for [drives] backend = \"sim\")")


def _offset(values: dict, ctx: Context) -> np.ndarray:
    return np.zeros(3)


@dataclass(frozen=True, kw_only=True)
class GcodeTable:
    """``[gcode]``: what G-code programs run against (pkrt plan, pkrt run --gcode, pkrt ctl run):
    the tool table and the work offsets, as LinuxCNC keeps them. Machine zero (G53 X0 Y0 Z0)
    is the tool at the reference assembly (pkrt plan --origin moves it)."""

    tool_table: str | None = spec(STRING, "LinuxCNC tool table (.tbl, relative to this file): tool lengths for "
                                  "G43 Hn; without one, T words other than T0 are refused", None)
    tool_units: str = spec(STRING, "units of the tool table's lengths", "mm", choices=("mm", "inch"))
    g54: np.ndarray = spec(NUMBERS, "work offset G54 (x, y, z) from machine zero, the start coordinate system",
                           unit="m", derive=_offset)
    g55: np.ndarray = spec(NUMBERS, "work offset G55 (x, y, z)", unit="m", derive=_offset)
    g56: np.ndarray = spec(NUMBERS, "work offset G56 (x, y, z)", unit="m", derive=_offset)
    g57: np.ndarray = spec(NUMBERS, "work offset G57 (x, y, z)", unit="m", derive=_offset)
    g58: np.ndarray = spec(NUMBERS, "work offset G58 (x, y, z)", unit="m", derive=_offset)
    g59: np.ndarray = spec(NUMBERS, "work offset G59 (x, y, z)", unit="m", derive=_offset)
    block_delete: bool = spec(BOOL, "the block delete switch: skip lines starting with '/' (LinuxCNC's default: "
                              "off, the lines run)", False)
    optional_stop: bool = spec(BOOL, "the optional stop switch: M1 holds a served machine as M0 does", True)

    def check(self, ctx: Context) -> None:
        for k in ("g54", "g55", "g56", "g57", "g58", "g59"):
            v = getattr(self, k)
            if len(v) != 3 or not np.all(np.abs(v) <= 10.0):
                raise ctx.error(k, f"expected 3 numbers x, y, z within 10 m, got {v.tolist()}")


REACTIONS = ("stop", "reflex", "torque-off")


@dataclass(frozen=True, kw_only=True)
class ProtectTable:
    """``[protect]``: contact detection in the loop: the generalized momentum observer on the
    controller's model and friction, a residual per actuator estimating the external force,
    its thresholds and the reaction to a contact (docs/protection.md)."""

    enabled: bool = spec(BOOL, "run the observer every cycle, log its residual and react to a contact", False)
    gain: float = spec(NUMBER, "observer gain K_O: the residual follows the external force as a first-order "
                       "filter of time constant 1 / K_O", 250.0, unit="1/s", lo=0.0, lo_open=True, hi=1e5)
    thresholds: np.ndarray | None = spec(AXES, "a residual beyond its actuator's threshold is a contact "
                                         "(pkrt protect tune derives them from logs of normal runs); left out: "
                                         "the observer runs and its residual is logged, nothing is detected",
                                         None, unit="N or N m", lo=0.0, lo_open=True)
    reaction: str = spec(STRING, "stop: a controlled stop on the path, torque off at standstill (category 1); "
                         "reflex: back off along the residual by reflex_distance, then hold; torque-off: at "
                         "once (category 0)", "stop", choices=REACTIONS)
    reflex_distance: float = spec(NUMBER, "reflex: the back-off distance in actuator space along the residual's "
                                  "direction", 0.005, unit="m or rad", lo=0.0, lo_open=True)
    stop_ramp: float = spec(NUMBER, "stop: the shortest time of the path rate's ramp from 1 to 0 (the "
                            "acceleration limits bound it further)", 0.02, unit="s", lo=0.0, lo_open=True)
    stop_deceleration: float = spec(NUMBER, "stop: the reference's accelerations while it stops on the path "
                                    "within this fraction of the acceleration limits (the actuators' force left for "
                                    "the contact and the tracking)", 1.0, lo=0.0, lo_open=True, hi=1.0)
    standstill: float = spec(NUMBER, "at standstill: every actuator's speed below this fraction of its "
                             "velocity limit", 0.02, lo=0.0, lo_open=True, hi=1.0)
    settle_time: float = spec(NUMBER, "the longest wait for standstill once the stop's or the reflex's "
                              "reference is at rest (then torque off, or hold, anyway)", 0.1, unit="s", lo=0.0)


# the tables every machine file has, in file order (name, class); [drives] and [emulator] are
# the drive family's (``pkrt.drivers.drive_tables``)
COMMON_TABLES = (("machine", MachineTable), ("controller", ControllerConfig), ("limits", Limits),
                 ("realtime", RealtimeConfig), ("demo", DemoTable), ("gcode", GcodeTable), ("tracker", TrackerTable),
                 ("protect", ProtectTable))
