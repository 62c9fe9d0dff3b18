"""The whole-program check before motion: a G-code program file read once by the fast reader
(``ngc_fast``: the interpreter's semantics, its errors), every motion's path sampled
(``ngc_path``: each end point, points at most ``step_mm`` apart along lines, arcs and helices,
arcs also within ``sag_mm`` of the curve and at their extreme points in the plane) and tested
against the machine's workspace (``pkrt.models.kinematics.reach``: the closed-form inverse
kinematics, the actuator ranges, the controller tree's domain), in memory that does not grow
with the program. It refuses a program with one ``UserError`` line naming the file and the
program line: unsupported words, syntax, modal errors (whatever the interpreter refuses), a
tool point outside the workspace. It returns a summary (``ProgramCheck``: counts, lengths, the
feed-limited time, the bounding box, tools and events) with a bounded preview of the tool path
(``Preview``, for the panel).

What needs the dynamics (forces, passive joints along the path, velocity and acceleration
limits) is not checked here: the planner checks it ahead of the motion. Coordinates: task
coordinates, m (the tool's gauge point, as ``gcode`` places programs: machine zero at
``origin``).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError

from ..kinematics.reach import INSIDE, Reach
from .ngc_fast import CanonBatch, FastReader
from .ngc_interp import Canon
from . import ngc_path as npth
from .ngc_path import ARC, FEED, TRAVERSE, Decimator, samples
from .ngc_setup import Setup

MOTION_KIND = {"traverse": TRAVERSE, "feed": FEED, "arc": ARC}
EVENT_KINDS = ("change_tool", "spindle", "speed", "mist", "flood", "dwell", "stop", "work_offset", "tool_offset")
PENDING = 1024  # the interpreter's motions checked together


@dataclass
class Preview:
    """The tool path decimated to a bounded number of points, in order: ``points`` (k, 3; task
    coordinates, m), ``lines`` (the program line of the motion ending at each point), ``kinds``
    (0 traverse, 1 feed or arc: of the piece of path ending at the point), ``tolerance`` (m: no
    dropped point is farther than about this from a kept one), ``points_in`` (before
    decimation)."""
    points: np.ndarray
    lines: np.ndarray
    kinds: np.ndarray
    tolerance: float
    points_in: int

    def to_json(self) -> dict:
        """For a page: coordinates in whole micrometres, flat (x0, y0, z0, x1, ...)."""
        return {"points_um": np.round(self.points * 1e6).astype(np.int64).ravel().tolist(),
                "lines": self.lines.astype(np.int64).tolist(), "kinds": self.kinds.astype(np.int64).tolist(),
                "tolerance_m": self.tolerance, "points_in": self.points_in}


@dataclass
class ProgramCheck:
    """What the pre-check found in a program it accepts: ``lines`` read, of them
    ``interpreted`` by the Python interpreter (the rest by the compiled scanner), ``motions``
    per kind, ``points`` tested against the workspace, ``feed_length_m`` and
    ``traverse_length_m``, ``feed_time_s`` (the feed moves at their programmed feed: the
    program's machining time cannot be shorter at 100 % override), ``box`` ((2, 3) m: the
    tested points' lowest and highest task coordinates), ``tools`` changed to, ``events`` per
    canonical command kind, ``seconds`` the check took, the ``preview``."""
    path: str
    lines: int = 0
    interpreted: int = 0
    motions: dict = field(default_factory=lambda: {"traverse": 0, "feed": 0, "arc": 0})
    points: int = 0
    feed_length_m: float = 0.0
    traverse_length_m: float = 0.0
    feed_time_s: float = 0.0
    box: np.ndarray = field(default_factory=lambda: np.array([[np.inf] * 3, [-np.inf] * 3]))
    tools: list = field(default_factory=list)
    events: dict = field(default_factory=dict)
    seconds: float = 0.0
    preview: Preview | None = None

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> dict:
        """JSON-ready figures (the preview's size, not its points)."""
        return {"path": self.path, "lines": self.lines, "interpreted_lines": self.interpreted,
                "motions": dict(self.motions), "points_checked": self.points,
                "feed_length_m": self.feed_length_m, "traverse_length_m": self.traverse_length_m,
                "feed_time_s": self.feed_time_s, "box_m": self.box.tolist(), "tools": list(self.tools),
                "events": dict(self.events), "seconds": self.seconds, "lines_per_s": self.lines_per_s,
                "preview_points": 0 if self.preview is None else len(self.preview.points),
                "preview_tolerance_m": None if self.preview is None else self.preview.tolerance}


class _Checker:
    """Rows of motions sampled, tested and summed into a ``ProgramCheck``."""

    def __init__(self, out: ProgramCheck, reach: Reach, origin, step_mm: float, sag_mm: float, preview_points: int):
        self.out, self.reach = out, reach
        self.origin = np.asarray(origin, float)
        self.step, self.sag = float(step_mm), float(sag_mm)
        self.decimator = Decimator(preview_points) if preview_points else None
        self.pending: list[Canon] = []
        self.events: Counter = Counter()
        self.q = np.zeros(3)
        self.acc = np.zeros(npth.N_ACC)
        self.acc[npth.ACC_BOX:npth.ACC_BOX + 3], self.acc[npth.ACC_BOX + 3:npth.ACC_BOX + 6] = np.inf, -np.inf
        self.none = (np.empty((0, 3)), np.empty(0, np.int64), np.empty(0, np.int8))

    def batch(self, b: CanonBatch) -> None:
        self.flush()
        m = b.motions
        rows = (b.kind, b.line, b.start, b.end, b.centre, b.turn, b.plane, b.feed)
        if not m.all():
            self.events["speed"] += int(np.count_nonzero(b.kind == 4))
            rows = tuple(a[m] for a in rows)
        n = len(rows[0])
        if n:
            self.rows(*rows, np.full(n, b.units), np.repeat(b.offset[None], n, 0))

    def commands(self, canon: list[Canon]) -> None:
        for c in canon:
            if c.kind in MOTION_KIND:
                self.pending.append(c)
            elif c.kind in EVENT_KINDS:
                self.events[c.kind] += 1
                if c.kind == "change_tool":
                    self.out.tools.append(int(c.value))
        if len(self.pending) >= PENDING:
            self.flush()

    def flush(self) -> None:
        """The interpreter's motions waiting (checked in program order, before what follows)."""
        if not self.pending:
            return
        cs, self.pending = self.pending, []
        arr = np.array
        self.rows(arr([MOTION_KIND[c.kind] for c in cs], np.int8), arr([c.line for c in cs], np.int64),
                  arr([c.start for c in cs], float), arr([c.end for c in cs], float),
                  arr([c.centre if c.centre is not None else (0.0, 0.0) for c in cs], float),
                  arr([c.turn for c in cs], np.int32), arr([c.plane for c in cs], np.int16),
                  arr([c.feed for c in cs], float), arr([c.units for c in cs], float),
                  arr([c.offset for c in cs], float))

    def rows(self, kind, line, start, end, centre, turn, plane, feed, units, offset) -> None:
        """Motion rows (the ``CanonBatch`` columns; units and offset per row) sampled, tested
        against the workspace, summed, added to the preview."""
        args = (kind, line, start, end, centre, turn, plane, feed, units, offset, self.origin, self.step, self.sag)
        n = samples(*args, *self.none, self.acc, False, self.q)
        P, ln, kd = np.empty((n, 3)), np.empty(n, np.int64), np.empty(n, np.int8)
        samples(*args, P, ln, kd, self.acc, True, self.q)
        if not self.out.points:  # the path's start: where the first motion leaves from
            first = self.origin + (start[0] + offset[0]) * units[0] * 1e-3
            P, ln, kd = np.vstack([first[None], P]), np.insert(ln, 0, line[0]), np.insert(kd, 0, kind[0])
            box = self.acc[npth.ACC_BOX:npth.ACC_BOX + 6].reshape(2, 3)
            box[0], box[1] = np.minimum(box[0], first), np.maximum(box[1], first)
            n += 1
        k, code, actuator, theta = self.reach.first_outside(P)
        if code != INSIDE:
            raise UserError(f"line {ln[k]}: {self.reach.why(code, actuator, theta, P[k])}")
        self.out.points += n
        if self.decimator is not None:
            self.decimator.add(P, ln, kd)

    def figures(self) -> None:
        """The sums into the ``ProgramCheck``."""
        o, a = self.out, self.acc
        o.motions = {name: int(a[npth.ACC_COUNT + v]) for name, v in MOTION_KIND.items()}
        o.feed_length_m, o.traverse_length_m = float(a[npth.ACC_FEED_MM]) * 1e-3, float(a[npth.ACC_TRAVERSE_MM]) * 1e-3
        o.feed_time_s = float(a[npth.ACC_FEED_MIN]) * 60.0
        o.box = a[npth.ACC_BOX:npth.ACC_BOX + 6].reshape(2, 3).copy()


def check_program(path: str, reach: Reach, setup: Setup | None = None, origin=(0.0, 0.0, 0.0), start=(0.0, 0.0, 0.0),
                  step_mm: float = 2.0, sag_mm: float = 0.05, preview_points: int = 20_000) -> ProgramCheck:
    """Check the G-code program file ``path`` whole before anything moves (the module
    docstring): its ``ProgramCheck``, or a ``UserError`` of one line ``path: line N: why``.
    ``setup``: the tool table, work offsets and switches; ``origin``: machine zero (task
    coordinates, m); ``start``: where the machine is (mm from machine zero); ``preview_points``:
    the preview's size at most (0: none)."""
    t0 = time.perf_counter()
    path = str(path)
    out = ProgramCheck(path)
    reader = FastReader(path, setup, start, keep=False)
    check = _Checker(out, reach, origin, step_mm, sag_mm, preview_points)
    try:
        try:
            for part in reader:
                check.batch(part) if isinstance(part, CanonBatch) else check.commands(part)
        finally:
            check.flush()  # the motions before an error come first
        check.figures()
        if not any(out.motions.values()):
            raise UserError("the program has no motion")
    except UserError as e:
        why = "empty program" if not reader.seen and reader.read_all else str(e)
        raise UserError(why if why.startswith(path) else f"{path}: {why}") from None
    out.lines, out.interpreted, out.events = reader.lines, reader.interpreted, dict(check.events)
    if check.decimator is not None:
        out.preview = Preview(*check.decimator.result(), check.decimator.points_in)
    out.seconds = time.perf_counter() - t0
    return out
