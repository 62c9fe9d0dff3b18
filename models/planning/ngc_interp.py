"""The RS274/NGC interpreter: blocks (``ngc_words``) executed with LinuxCNC's semantics and
order of execution (``interp_execute.cc``, ``interp_convert.cc``) into canonical commands
(``Canon``), the same ones LinuxCNC's standalone ``rs274`` prints: straight traverses and
feeds, arcs, dwells, spindle, coolant and tool commands, stops.

Positions are program coordinates in program units (mm or inch, ``units`` mm each), after the
work offset and the tool length offset are taken away, as LinuxCNC's canonical commands have
them: the machine's controlled point (the tool's gauge point, where pkrt's kinematics put the
tool) is at ``(end + offset) * units`` mm from machine zero, ``offset`` being the work offset
plus the tool length offset. The machine starts at ``start`` (mm from machine zero).

Implemented (word by word in docs/gcode.md): G0 G1 G2 G3 (I J K or R, P turns, helices), G4,
G17 G18 G19, G20 G21, G40, G43 (H) G43.1 G49, G53, G54-G59, G61 G61.1 G64 (P, Q), G73 G80
G81 G82 G83 G85 G86 G89, G90 G91, G90.1 G91.1, G93 G94, G98 G99; M0 M1 M2 M30 M3 M4 M5 M6 M7
M8 M9; F S T H L P Q R. Anything else is refused (``NgcError``, one line naming the line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .ngc_cycles import CYCLES, cycle
from .ngc_setup import Setup
from .ngc_words import AXES, Block, NgcError, g_name

MM_PER_INCH = 25.4
CENTRE_WORDS = {170: ("I", "J"), 180: ("K", "I"), 190: ("J", "K")}
# tolerances of LinuxCNC (interp_internal.hh), per program unit: mm, inch
RADIUS_TOL = {21: 0.00005 * MM_PER_INCH, 20: 0.00005}  # an R arc's radius may fall short by this
SPIRAL_TOL = {21: 2 * 0.01 * math.sqrt(2), 20: 2 * 0.001 * math.sqrt(2)}  # start and end radii may differ
SPIRAL_REL = 0.001

SUPPORTED_G = {0, 10, 20, 30, 40, 170, 180, 190, 200, 210, 400, 430, 431, 490, 530, 540, 550, 560, 570, 580, 590,
               610, 611, 640, 730, 800, 810, 820, 830, 850, 860, 890, 900, 910, 901, 911, 930, 940, 980, 990}
SUPPORTED_M = {0, 1, 2, 30, 3, 4, 5, 6, 7, 8, 9}
WHY_NOT_G = {410: "cutter radius compensation", 420: "cutter radius compensation",
             411: "cutter radius compensation", 421: "cutter radius compensation",
             280: "reference positions", 281: "reference positions", 300: "reference positions",
             301: "reference positions", 920: "coordinate offsets", 921: "coordinate offsets",
             922: "coordinate offsets", 923: "coordinate offsets", 520: "coordinate offsets",
             100: "setting offsets and tools from the program", 382: "probing", 383: "probing", 384: "probing",
             385: "probing", 330: "threading", 331: "threading", 760: "threading", 50: "splines", 51: "splines",
             52: "splines", 53: "splines", 740: "tapping", 840: "tapping",
             870: "back boring (spindle orientation)", 880: "boring with a manual retraction",
             950: "feed per revolution", 960: "constant surface speed", 970: "constant surface speed",
             432: "added tool offsets", 591: "more coordinate systems", 592: "more coordinate systems",
             593: "more coordinate systems", 70: "lathe modes", 80: "lathe modes", 171: "UVW planes",
             181: "UVW planes", 191: "UVW planes", 700: "lathe cycles", 710: "lathe cycles",
             711: "lathe cycles", 712: "lathe cycles", 720: "lathe cycles", 721: "lathe cycles",
             722: "lathe cycles"}


@dataclass
class Canon:
    """One canonical command. Motions (``traverse``, ``feed``, ``arc``): ``end`` (x, y, z program
    coordinates), ``feed`` (program units per minute; inf for a traverse), ``blend`` (the path
    control: None exact path, "stop" exact stop, a number: blending tolerance in program
    units), ``units`` (mm per program unit), ``offset`` (program units: work plus tool length
    offset); arcs also ``centre`` (in the plane's first and second axes), ``turn`` (+n counter-
    clockwise, -n clockwise, n turns) and ``plane`` (170, 180, 190). Other kinds carry ``value``:
    dwell (s), speed (S), spindle ("cw", "ccw", "off"), mist, flood (bool), select_tool,
    change_tool (tool number), tool_offset ((3,) program units), work_offset (index, (3,)
    program units), stop ("M0", "M1"), feed_rate, end."""
    kind: str
    line: int
    end: np.ndarray | None = None
    start: np.ndarray | None = None  # motions: where they start (program coordinates)
    feed: float = math.inf
    blend: Any = None
    units: float = 1.0
    offset: np.ndarray | None = None
    centre: tuple[float, float] | None = None
    turn: int = 0
    plane: int = 170
    value: Any = None


class Interpreter:
    """Executes blocks in order; ``out`` collects the canonical commands, ``ended`` is set by
    M2/M30. State in program units (LinuxCNC's ``setup``)."""

    def __init__(self, setup: Setup, start=(0.0, 0.0, 0.0)):
        self.setup = setup
        self.units, self.mm = 21, 1.0
        self.origin_index = 1
        self.origin = setup.offset(1)  # program units
        self.tool_offset = np.zeros(3)
        self.pos = np.asarray(start, float) - self.origin - self.tool_offset
        self.motion: int | None = None
        self.plane = 170
        self.absolute, self.ijk_absolute, self.inverse_time = True, False, False
        self.feed = 0.0
        self.speed, self.spindle, self.mist, self.flood = 0.0, "off", False, False
        self.selected = 0  # M6 before any T changes to tool 0 (no tool), as LinuxCNC does
        self.tool = 0
        self.blend: Any = None  # G61 (pkrt's start mode): exact path
        self.retract_r = False  # G98
        self.cycle: dict[str, Any] = {"r": 0.0, "cc": 0.0, "p": 0.0, "q": 0.0, "il": None}
        self.out: list[Canon] = []
        self.ended = False
        self.n = 0

    # -- helpers -----------------------------------------------------------------------------------
    def err(self, text: str) -> NgcError:
        return NgcError(f"line {self.n}: {text}")

    def emit(self, kind: str, **kw) -> Canon:
        c = Canon(kind, self.n, **kw)
        if c.end is not None:
            c.units, c.offset = self.mm, self.origin + self.tool_offset
        self.out.append(c)
        return c

    def move(self, kind: str, end: np.ndarray, **kw) -> None:
        """A traverse, feed or arc to ``end`` (program coordinates); the position follows."""
        end = np.array(end, float)
        if kind != "traverse":
            kw.setdefault("feed", self.feed)
        kw.setdefault("blend", self.blend)
        self.emit(kind, end=end, start=self.pos.copy(), **kw)
        self.pos = end

    # -- a block -----------------------------------------------------------------------------------
    def execute(self, b: Block) -> None:
        """One block, in LinuxCNC's order of execution."""
        self.n = b.line
        motion = self.check(b)
        w, g, m = b.words, b.g, b.m
        if "feed mode" in g:
            self.inverse_time = g["feed mode"] == 930
            if not self.inverse_time:
                self.feed = 0.0
        if "F" in w and not self.inverse_time:
            self.feed = w["F"]
        if "S" in w:
            self.speed = w["S"]
            self.emit("speed", value=w["S"])
        if "T" in w:
            self._select_tool(int(w["T"]))
        if "tool change" in m:
            self._change_tool()
        if "spindle" in m:
            self.spindle = {3: "cw", 4: "ccw", 5: "off"}[m["spindle"]]
            self.emit("spindle", value=self.spindle)
        if "coolant" in m:
            self._coolant(m["coolant"])
        if g.get("non-modal") == 40:
            self.emit("dwell", value=w["P"])
        if "plane" in g:
            self.plane = g["plane"]
            self.emit("plane", value=self.plane)
        if "units" in g:
            self._units(g["units"])
        if "tool length offset" in g:
            self._tool_length(g["tool length offset"], b)
        if "coordinate system" in g:
            self._coordinate_system((g["coordinate system"] - 540) // 10 + 1)
        if "path control" in g:
            code = g["path control"]
            self.blend = {610: None, 611: "stop"}.get(code, w.get("P", 0.0))
        if "distance" in g:
            self.absolute = g["distance"] == 900
        if "arc distance" in g:
            self.ijk_absolute = g["arc distance"] == 901
        if "retract mode" in g:
            self.retract_r = g["retract mode"] == 990
        if motion is not None:
            self._motion(motion, b)
        if "stop" in m:
            self._stop(m["stop"], b)

    def check(self, b: Block) -> int | None:
        """The codes and words of the block checked as LinuxCNC's ``check_items`` and
        ``enhance_block`` do; returns the motion the block makes (None: none)."""
        for grp, code in b.g.items():
            if code not in SUPPORTED_G:
                why = WHY_NOT_G.get(code)
                raise self.err(f"{g_name(code)} is not supported" + (f" ({why})" if why else ""))
        for code in b.m.values():
            if code not in SUPPORTED_M:
                raise self.err(f"M{code} is not supported")
        w, g = b.words, b.g
        for k in "FSTHLP":
            if k in w and w[k] < 0:
                raise self.err(f"negative {k} ({k}{w[k]:g})")
        for k in "THL":
            if k in w and w[k] != int(w[k]):
                raise self.err(f"{k} must be a whole number, got {k}{w[k]:g}")
        axes, g0, g1 = b.has("XYZ"), g.get("non-modal"), g.get("motion")
        tlo = g.get("tool length offset")
        motion = None
        if g1 is not None:
            if g1 == 800:
                if axes:
                    raise self.err("X, Y or Z with G80 (no motion mode uses them)")
            elif not axes and g1 not in (0, 10, 20, 30):
                raise self.err(f"{g_name(g1)} without X, Y or Z")
            if tlo == 431 and axes:
                raise self.err(f"G43.1 and {g_name(g1)} both use the axis words")
            motion = g1
        elif axes and tlo != 431:
            if self.motion in (None, 800):
                raise self.err("X, Y or Z without a motion mode (G0, G1, G2, G3 or a canned cycle)")
            motion = self.motion
        elif not axes and b.has("IJK") and self.motion in (20, 30):
            motion = self.motion
        if g0 == 40:
            if "P" not in w:
                raise self.err("G4 needs P (seconds)")
            if motion in (20, 30):
                raise self.err("G4 with G2 or G3 (both use P)")
        if g0 == 530:
            if motion not in (0, 10):
                raise self.err("G53 needs G0 or G1")
            if g.get("distance") == 910 or (g.get("distance") != 900 and not self.absolute):
                raise self.err("G53 in incremental distance mode (G91)")
        if "H" in w and tlo != 430:
            raise self.err("H without G43")
        arc, cycle = motion in (20, 30), motion in CYCLES
        for k in "IJK":
            if k in w and not arc:
                raise self.err(f"{k} without G2 or G3")
        if "L" in w and not cycle:
            raise self.err("L without a canned cycle")
        if "R" in w and not (arc or cycle):
            raise self.err("R without G2, G3 or a canned cycle")
        if "P" in w:
            if not (g0 == 40 or g.get("path control") == 640 or motion in (20, 30, 820, 860, 890)):
                raise self.err("P without G4, G64, G2, G3, G82, G86 or G89")
            if arc and (abs(round(w["P"]) - w["P"]) > 0.001 or round(w["P"]) < 1):
                raise self.err(f"P must be a whole number >= 1 with G2 or G3 (turns), got P{w['P']:g}")
        if "Q" in w and not (motion in (730, 830) or g.get("path control") == 640):
            raise self.err("Q without G73, G83 or G64")
        return motion

    # -- modes -------------------------------------------------------------------------------------
    def _units(self, code: int) -> None:
        if code // 10 != self.units:
            f = MM_PER_INCH if code == 210 else 1 / MM_PER_INCH
            self.units, self.mm = code // 10, 1.0 if code == 210 else MM_PER_INCH
            self.pos, self.origin, self.tool_offset = self.pos * f, self.origin * f, self.tool_offset * f
            self.feed *= f
            if isinstance(self.blend, float):
                self.blend *= f
        self.emit("units", value=code // 10)

    def _coordinate_system(self, index: int) -> None:
        if index == self.origin_index:
            return
        new = self.setup.offset(index) / self.mm
        self.pos = self.pos + self.origin - new
        self.origin_index, self.origin = index, new
        self.emit("work_offset", value=(index, new.copy()))

    def _tool_length(self, code: int, b: Block) -> None:
        if code == 490:
            new = np.zeros(3)
        elif code == 431:
            new = self.tool_offset.copy()
            for i, k in enumerate("XYZ"):
                if k in b.words:
                    new[i] = b.words[k]
        else:
            number = int(b.words["H"]) if "H" in b.words else self.tool
            new = self._tool(number).offset / self.mm if number else np.zeros(3)
        self.pos = self.pos + self.tool_offset - new
        self.tool_offset = new
        self.emit("tool_offset", value=new.copy())

    def _tool(self, number: int):
        t = self.setup.tools.get(number)
        if t is None:
            where = (f"the tool table {self.setup.tool_table}" if self.setup.tool_table
                     else "a tool table ([gcode] tool_table in the machine configuration)")
            raise self.err(f"tool {number} is not in {where}")
        return t

    def _select_tool(self, number: int) -> None:
        if number:
            self._tool(number)
        self.selected = number
        self.emit("select_tool", value=number)

    def _change_tool(self) -> None:
        self.spindle = "off"  # LinuxCNC stops the spindle for a tool change
        self.emit("spindle", value="off")
        self.tool = self.selected
        self.emit("change_tool", value=self.tool)

    def _coolant(self, code: int, only_on: bool = False) -> None:
        """M7 mist on, M8 flood on, M9 both off (``only_on``: those that are on, as M2 does)."""
        if code == 7 or (code == 9 and (self.mist or not only_on)):
            self.mist = code == 7
            self.emit("mist", value=self.mist)
        if code == 8 or (code == 9 and (self.flood or not only_on)):
            self.flood = code == 8
            self.emit("flood", value=self.flood)

    def _stop(self, code: int, b: Block) -> None:
        if code in (0, 1):
            self.emit("stop", value=f"M{code}")
            return
        # M2, M30: LinuxCNC's resets (convert_stop), then the end
        self._coordinate_system(1)
        self.plane, self.absolute, self.inverse_time = 170, True, False
        self.feed = b.words.get("F", 0.0)
        self.spindle = "off"
        self.emit("spindle", value="off")
        self.motion = 10
        self._coolant(9, only_on=True)
        self.emit("end", value=f"M{code}")
        self.ended = True

    # -- motion ------------------------------------------------------------------------------------
    def ends(self, b: Block, g53: bool = False) -> np.ndarray:
        """The end point of a motion (program coordinates), LinuxCNC's ``find_ends``."""
        end = self.pos.copy()
        for i, k in enumerate("XYZ"):
            if k not in b.words:
                continue
            v = b.words[k]
            if g53:
                end[i] = v - self.origin[i] - self.tool_offset[i]
            else:
                end[i] = v if self.absolute else self.pos[i] + v
        return end

    def _motion(self, code: int, b: Block) -> None:
        if code in CYCLES:
            cycle(self, code, b)
            return
        self.cycle["il"] = None  # the cycles' initial level is forgotten by any other motion mode
        if code == 800:
            self.motion = 800
            return
        if code != 0:
            self._feed_check(b, code)
        self.motion = code
        end = self.ends(b, b.g.get("non-modal") == 530)
        if code in (0, 10):
            if code == 10 and self.inverse_time:
                self._inverse_feed(float(np.linalg.norm(end - self.pos)), b)
            self.move("traverse" if code == 0 else "feed", end)
        else:
            self._arc(code, b, end)

    def _feed_check(self, b: Block, code: int) -> None:
        if self.inverse_time:
            if "F" not in b.words:
                raise self.err(f"{g_name(code)} in inverse time (G93) needs F on its line")
        elif self.feed == 0.0:
            raise self.err(f"{g_name(code)} with zero feed rate (F)")

    def _inverse_feed(self, length: float, b: Block) -> None:
        self.feed = max(0.1, length * b.words["F"])  # LinuxCNC's inverse_time_rate_*
        self.emit("feed_rate", value=self.feed)

    def _arc(self, code: int, b: Block, end: np.ndarray) -> None:
        """G2/G3 (LinuxCNC's ``convert_arc``, ``arc_data_ijk``, ``arc_data_r``)."""
        w, plane = b.words, self.plane
        a1, a2, a3 = AXES[plane]
        ijk = b.has("IJK")
        name = g_name(code)
        if "R" not in w and not ijk:
            raise self.err(f"{name} needs the centre (I, J, K) or a radius R")
        if "R" in w and ijk:
            raise self.err("R and I/J/K together")
        first, second = CENTRE_WORDS[plane]
        if ijk:
            wrong = [k for k in "IJK" if k in w and k not in (first, second)]
            if wrong:
                raise self.err(f"{wrong[0]} is not an offset in the {g_name(plane)} plane (use {first} and {second})")
            for k in (first, second):
                if k not in w and self.ijk_absolute:
                    raise self.err(f"{k} missing in an absolute-centre arc (G90.1)")
        elif not b.has("XYZ"[a1] + "XYZ"[a2]):
            raise self.err(f"an R arc in the {g_name(plane)} plane needs {'XYZ'[a1]} or {'XYZ'[a2]}")
        turns = int(round(w["P"])) if "P" in w else 1
        c1, c2, e1, e2 = self.pos[a1], self.pos[a2], end[a1], end[a2]
        if "R" in w:
            centre = self._centre_r(code, c1, c2, e1, e2, w["R"])
        else:
            o1, o2 = w.get(first, 0.0), w.get(second, 0.0)
            centre = (o1, o2) if self.ijk_absolute else (c1 + o1, c2 + o2)
            self._check_radii(c1, c2, e1, e2, centre)
        turn = -turns if code == 20 else turns
        if self.inverse_time:
            self._inverse_feed(arc_length((c1, c2, self.pos[a3]), centre, turn, (e1, e2, end[a3])), b)
        self.motion = code
        self.move("arc", end, centre=centre, turn=turn, plane=plane)

    def _centre_r(self, code: int, c1, c2, e1, e2, radius: float) -> tuple[float, float]:
        if e1 == c1 and e2 == c2:
            raise self.err("an R arc needs an end point different from the start")
        r = abs(radius)
        mid1, mid2 = (e1 + c1) / 2.0, (e2 + c2) / 2.0
        half = math.hypot(mid1 - e1, mid2 - e2)
        if half - r > RADIUS_TOL[self.units] or r == 0.0:
            raise self.err(f"R {radius:g} is too small for the chord {2 * half:.6g}")
        if half / r > 1 - 1e-12:
            half = r
        side = -1 if (code == 20) == (radius > 0) else 1
        theta = math.atan2(e2 - c2, e1 - c1) + side * math.pi / 2
        off = r * math.cos(math.asin(half / r))
        return mid1 + off * math.cos(theta), mid2 + off * math.sin(theta)

    def _check_radii(self, c1, c2, e1, e2, centre) -> None:
        r1 = math.hypot(centre[0] - c1, centre[1] - c2)
        r2 = math.hypot(centre[0] - e1, centre[1] - e2)
        if r1 < RADIUS_TOL[self.units] or r2 < RADIUS_TOL[self.units]:
            raise self.err(f"zero-radius arc (radius {r1:.6g} at the start, {r2:.6g} at the end)")
        err, tol = abs(r1 - r2), SPIRAL_TOL[self.units]
        if err > 100 * tol or (err / max(r1, r2) > SPIRAL_REL and err > tol):
            raise self.err(f"radius to the end of the arc ({r2:.6g}) differs from the radius to its start ({r1:.6g})")


def find_turn(p1, centre, turn: int, p2) -> float:
    """The signed angle (rad) an arc turns from p1 to p2 about ``centre`` (LinuxCNC's
    ``find_turn``): end at the start is a full turn; each turn beyond the first adds 2 pi."""
    if turn == 0:
        return 0.0
    alpha = math.atan2(p1[1] - centre[1], p1[0] - centre[0])
    beta = math.atan2(p2[1] - centre[1], p2[0] - centre[0])
    if turn > 0:
        if beta <= alpha:
            beta += 2 * math.pi
        return beta - alpha + (turn - 1) * 2 * math.pi
    if alpha <= beta:
        alpha += 2 * math.pi
    return beta - alpha + (turn + 1) * 2 * math.pi


def arc_length(p1, centre, turn: int, p2) -> float:
    """Length of a helical arc (LinuxCNC's ``find_arc_length``): points (first, second, normal)."""
    r = math.hypot(centre[0] - p1[0], centre[1] - p1[1])
    theta = find_turn(p1, centre, turn, p2)
    return r * abs(theta) if p2[2] == p1[2] else math.hypot(r * theta, p2[2] - p1[2])
