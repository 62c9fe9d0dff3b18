"""G-code programs for machines with a tool in x, y, z, interpreted as LinuxCNC's RS274/NGC
interpreter does (``ngc_words`` reads the lines, ``ngc_interp`` and ``ngc_cycles`` execute
them into canonical commands) and turned here into what the time-optimal planner times:
rest-to-rest ``Motion``s, ``Dwell``s and ``Event``s (spindle, coolant, tool changes, program
stops) in task coordinates (m). Nothing is ignored: a word, code or construct pkrt does not
implement is refused with one line naming the program line (docs/gcode.md lists them).

Machine zero (G53's X0 Y0 Z0) is ``origin`` (m, task coordinates; default: the tool at the
machine's reference assembly); the work offsets G54-G59 and the tool table come from the
machine configuration (``ngc_setup.Setup``). The program starts with the machine at machine
zero (``start``: elsewhere, mm from machine zero). The tool's gauge point (where the
kinematics put the tool) follows the canonical path plus the tool length offset.

Motions join as the path control mode says: G61 (the start mode) exact path (corners stop
unless tangent), G61.1 a stop after every motion, G64 P blends corners between lines within P
(G64 without P: as G61, pkrt never blends without a bound); canned cycles run in exact path.
Spindle, coolant and tool commands stop the motion (LinuxCNC waits for motion to end before
them too) and become events of the plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError

from .geompath import Arc, Dwell, Event, Line, Segment, join_segments
from .ngc_interp import Canon, Interpreter, find_turn
from .ngc_setup import Setup
from .ngc_words import AXES, NgcError, read_block

MOTIONS = ("traverse", "feed", "arc")


@dataclass
class Program:
    """The interpreted program: ``items`` (Motions, Dwells and Events in order), its canonical
    commands and its source."""
    items: list
    path: str
    lines: int
    canon: list = field(default_factory=list)
    description: dict = field(default_factory=dict)


def interpret(text: str, setup: Setup | None = None, start=(0.0, 0.0, 0.0), path: str = "program") -> list[Canon]:
    """The canonical commands of a whole program held as text (``canon_stream`` of its lines)."""
    return list(canon_stream(text.split("\n"), setup, start, path))


def canon_stream(lines: Iterable[str], setup: Setup | None = None, start=(0.0, 0.0, 0.0),
                 path: str = "program") -> Iterator[Canon]:
    """The canonical commands of a program, yielded block by block as its lines are read (a
    file read lazily by ``read_lines`` is never held whole). ``start``: where the machine is, mm
    from machine zero. A ``%`` line first (before it only blank lines) makes the next ``%`` line
    its end; M2 or M30 end it, later lines are not read. Raises NgcError (one line naming the
    program line)."""
    ip = Interpreter(setup or Setup(), start)
    percent, seen, n = False, False, 0
    for n, line in enumerate(lines, start=1):
        if not seen and line.strip():
            seen = True
            if line.strip() == "%":
                percent = True
                continue
        if percent and line.strip() == "%":  # the second percent line ends the program
            ip.ended = True
            break
        b = read_block(line, n)
        if b.delete and ip.setup.block_delete:
            continue
        if b.empty:
            continue
        ip.execute(b)
        if ip.out:
            yield from ip.out
            ip.out.clear()
        if ip.ended:
            break
    if not ip.ended:
        raise NgcError(f"{path}: the program ends without M2 or M30 (line {n})")


def read_lines(path: str) -> Iterator[str]:
    """The lines of a program file, read lazily (UTF-8 or ASCII text; CR LF and CR ends as LF).
    Raises UserError naming the file (unreadable, binary data, not UTF-8) at the line where
    that is found."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    with f:
        for n, raw in enumerate(f, start=1):
            yield from text_lines(raw, n, path)


def text_lines(raw: bytes, n: int, path: str) -> list[str]:
    """The program lines of the file's line ``n`` (its bytes ``raw``, with or without the LF):
    one, or more where lone CRs end lines. Raises UserError naming the file (binary data, not
    UTF-8)."""
    if b"\x00" in raw:
        raise UserError(f"{path}: not a text G-code program (binary data at line {n})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text G-code program (not UTF-8 at line {n})") from None
    text = text[:-1] if text.endswith("\n") else text
    text = text[:-1] if text.endswith("\r") else text
    return text.split("\r") if "\r" in text else [text]


class _Items:
    """Canonical commands to planner items: segments are collected until something stops the
    motion (a dwell, an event, an exact stop), then joined (``join_segments``)."""

    def __init__(self, origin: np.ndarray, start_mm: np.ndarray, setup: Setup, description: dict):
        self.origin, self.setup, self.description = origin, setup, description
        self.at = origin + start_mm * 1e-3  # the gauge point now (m)
        self.segs: list[Segment] = []
        self.tols: list = []
        self.items: list = []
        self.spindle, self.speed = "off", 0.0
        self.coolant = {"mist": False, "flood": False}

    def flush(self) -> None:
        if self.segs:
            self.items.extend(join_segments(self.segs, self.tols, self.description))
            self.segs, self.tols = [], []

    def machine(self, c: Canon, p) -> np.ndarray:
        return self.origin + (np.asarray(p, float) + c.offset) * c.units * 1e-3

    def motion(self, c: Canon) -> None:
        end = self.machine(c, c.end)
        feed = c.feed * c.units * 1e-3 / 60.0  # m/s
        seg = _arc(c, self.at, end, self) if c.kind == "arc" else Line.between(self.at, end, feed, c.line)
        if seg.length > 1e-12:
            stop = c.blend == "stop"
            if stop:
                self.flush()
            self.segs.append(seg)
            self.tols.append(None if (stop or c.blend is None) else c.blend * c.units * 1e-3)
            if stop:
                self.flush()
        self.at = end

    def event(self, c: Canon, kind: str, text: str, hold: bool = False, **values) -> None:
        self.flush()
        self.items.append(Event(kind, c.line, {**values, "text": f"line {c.line}: {text}"}, hold))

    def command(self, c: Canon) -> None:
        if c.kind in MOTIONS:
            self.motion(c)
        elif c.kind == "dwell":
            self.flush()
            self.items.append(Dwell(c.value, c.line))
        elif c.kind in ("speed", "spindle"):
            state, speed = (self.spindle, c.value) if c.kind == "speed" else (c.value, self.speed)
            if (state, speed) != (self.spindle, self.speed):
                self.spindle, self.speed = state, speed
                what = {"cw": "clockwise", "ccw": "counter-clockwise"}.get(state)
                text = (f"spindle {what} at S{speed:g}" if what else
                        f"spindle speed S{speed:g} (stopped)" if c.kind == "speed" else "spindle stopped")
                self.event(c, "spindle", text, state=state, speed=speed)
        elif c.kind in ("mist", "flood") and self.coolant[c.kind] != c.value:
            self.coolant[c.kind] = bool(c.value)
            on = [k for k, v in self.coolant.items() if v]
            self.event(c, "coolant", f"coolant {' and '.join(on) if on else 'off'}", **self.coolant)
        elif c.kind == "change_tool":
            self.event(c, "tool", f"tool change to T{c.value} (M6): hold until resumed", hold=True, tool=c.value)
        elif c.kind == "stop" and (c.value == "M0" or self.setup.optional_stop):
            self.event(c, "stop", f"program stop ({c.value}): hold until resumed", hold=True, code=c.value)


def _arc(c: Canon, start: np.ndarray, end: np.ndarray, conv: _Items) -> Arc:
    """The geometric arc of canonical ARC_FEED ``c`` from ``start`` to ``end`` (gauge point, m)."""
    a1, a2, a3 = AXES[c.plane]
    ctr = conv.machine(c, _point(c.centre, c.end[a3], c.plane))
    u0, u1, uc = (np.array([p[a1], p[a2]]) for p in (start, end, ctr))
    sweep = abs(find_turn((c.start[a1], c.start[a2]), c.centre, c.turn, (c.end[a1], c.end[a2])))
    r0, r1 = float(np.linalg.norm(u0 - uc)), float(np.linalg.norm(u1 - uc))
    e = np.eye(3)
    centre = uc[0] * e[a1] + uc[1] * e[a2] + start[a3] * e[a3]
    h_rate = (end[a3] - start[a3]) / sweep
    length = sweep * math.hypot(0.5 * (r0 + r1), h_rate)
    phi0 = math.atan2(u0[1] - uc[1], u0[0] - uc[0])
    feed = c.feed * c.units * 1e-3 / 60.0
    return Arc(length, feed, c.line, "arc", centre, e[a1], e[a2], r0, r1, phi0, sweep, 1 if c.turn > 0 else -1, h_rate)


def _point(centre, normal: float, plane: int) -> np.ndarray:
    a1, a2, a3 = AXES[plane]
    p = np.empty(3)
    p[a1], p[a2], p[a3] = centre[0], centre[1], normal
    return p


def parse_program(text: str, path: str = "program", origin=(0.0, 0.0, 0.0), setup: Setup | None = None,
                  start=(0.0, 0.0, 0.0)) -> Program:
    """Interpret a whole program into motions, dwells and events (task coordinates, m).
    Raises UserError (one line, naming the program line) on anything it cannot run exactly
    as written."""
    setup = setup or Setup()
    origin = np.asarray(origin, float)
    canon = interpret(text, setup, start, path)
    desc = {"kind": "gcode", "path": path}
    conv = _Items(origin, np.asarray(start, float), setup, desc)
    for c in canon:
        conv.command(c)
    conv.flush()
    if not any(c.kind in MOTIONS for c in canon):
        raise NgcError(f"{path}: the program has no motion")
    return Program(conv.items, path, len(text.split("\n")), canon, desc)


def read_program(path: str, origin, setup: Setup | None = None) -> Program:
    """Read and interpret a program file (UTF-8 or ASCII text) whole."""
    text = "\n".join(read_lines(path))
    if not text.strip():
        raise UserError(f"{path}: empty program")
    try:
        return parse_program(text, path, origin, setup)
    except NgcError as e:
        raise UserError(f"{path}: {e}" if not str(e).startswith(path) else str(e)) from None
