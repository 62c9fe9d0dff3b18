"""G-code programs for machines with a tool in x, y, z (the LinuxCNC dialect where a choice
exists): parsed and turned into rest-to-rest ``Motion``s and ``Dwell``s in task coordinates (m)
for the time-optimal planner. Nothing is ignored: a word, code or construct not listed here is
refused with one line naming the program line.

Supported: G0 (rapid: the machine's limits only), G1 (feed), G2/G3 (arcs clockwise /
counter-clockwise seen from the positive end of the plane's normal; centre by I/J/K offsets from
the start, always incremental as LinuxCNC's default G91.1, or by R: positive for at most half a
turn, negative for more; a change of the normal coordinate makes a helix; a full circle with
I/J/K when the end is the start), G17/G18/G19 (planes XY, ZX, YZ), G4 P (dwell, seconds), G20/G21
(inch / mm; mm at the start), G90/G91 (absolute / incremental X Y Z; absolute at the start),
G61 (exact stop at corners; the start mode), G64 P (blend corners between lines within P
program units; other corners stop unless tangent; G64 without P is refused), F (feed, program
units per minute, modal), M2/M30 (end; required, later lines are not read), N (line numbers),
comments in parentheses and after ';', '%' delimiter lines.

Program coordinates are relative to ``origin`` (m, default: the tool at the machine's reference
assembly); the program starts there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError

from .geompath import Arc, Dwell, Line, Motion, Segment, join_segments

UNITS = {20: 0.0254, 21: 0.001}  # metres per program unit
PLANES = {17: (0, 1, 2), 18: (2, 0, 1), 19: (1, 2, 0)}  # in-plane axes (e1, e2) then the normal
OFFSET = {0: "I", 1: "J", 2: "K"}
MODAL_GROUPS = {0: "motion", 1: "motion", 2: "motion", 3: "motion", 4: "dwell", 17: "plane", 18: "plane",
                19: "plane", 20: "units", 21: "units", 61: "path", 64: "path", 90: "distance", 91: "distance"}
MAX_ABS = 1e6  # program units: beyond this a number is a mistake, not a coordinate
ARC_ABS_TOL, ARC_REL_TOL = 0.001e-3, 1e-3  # m, fraction: start and end radii may differ by both
_WORD = re.compile(r"([A-Z])([+-]?(?:\d+\.?\d*|\.\d+))")


@dataclass
class Program:
    """The parsed program: ``items`` (Motions and Dwells in order) and its source."""
    items: list
    path: str
    lines: int
    description: dict = field(default_factory=dict)


class _Error(UserError):
    pass


def _strip_comments(text: str, n: int) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            if depth:
                raise _Error(f"line {n}: nested comment")
            depth = 1
        elif ch == ")":
            if not depth:
                raise _Error(f"line {n}: ')' without '('")
            depth = 0
        elif ch == ";" and not depth:
            break
        elif not depth:
            out.append(ch)
    if depth:
        raise _Error(f"line {n}: comment not closed (missing ')')")
    return "".join(out)


def parse_words(text: str, n: int) -> list[tuple[str, float]]:
    """The words of one line (comments removed, spaces ignored as LinuxCNC does)."""
    s = "".join(_strip_comments(text, n).split()).upper()
    words, pos = [], 0
    while pos < len(s):
        m = _WORD.match(s, pos)
        if not m:
            raise _Error(f"line {n}: cannot read '{s[pos:pos + 12]}' (expected a letter and a number)")
        v = float(m.group(2))
        if not math.isfinite(v) or abs(v) > MAX_ABS:
            raise _Error(f"line {n}: number {m.group(2)[:20]} out of range (|value| <= {MAX_ABS:g})")
        words.append((m.group(1), v))
        pos = m.end()
    return words


def _code(v: float, letter: str, n: int) -> int:
    if abs(v - round(v)) > 1e-9:
        raise _Error(f"line {n}: {letter}{v:g} is not supported")
    return int(round(v))


@dataclass
class _State:
    motion: int | None = None
    plane: int = 17
    units: int = 21
    absolute: bool = True
    blend: float | None = None  # G61: None
    feed: float | None = None  # m/s
    pos: np.ndarray = None  # m, program coordinates


def parse_program(text: str, path: str = "program", origin=(0.0, 0.0, 0.0)) -> Program:
    """Parse a whole program into motions and dwells (task coordinates, m). Raises UserError
    (one line, naming the program line) on anything it cannot run exactly as written."""
    origin = np.asarray(origin, float)
    st = _State(pos=np.zeros(3))
    segs: list[Segment] = []
    tols: list = []
    items: list = []
    ended = False
    raw = text.split("\n")
    percent = 0

    def flush():
        if segs:
            items.extend(join_segments(list(segs), list(tols), {"kind": "gcode", "path": path}))
            segs.clear()
            tols.clear()

    for n, line in enumerate(raw, start=1):
        body = line.strip()
        if body == "%":
            percent += 1
            if percent == 2:
                ended = True
                break
            continue
        if body.startswith("/"):
            raise _Error(f"line {n}: block delete '/' is not supported")
        words = parse_words(line, n)
        if not words:
            continue
        if words[0][0] == "N":
            words = words[1:]
        seen: dict[str, float] = {}
        gs: dict[str, int] = {}
        ms = []
        for letter, v in words:
            if letter == "G":
                g = _code(v, "G", n)
                grp = MODAL_GROUPS.get(g)
                if grp is None:
                    raise _Error(f"line {n}: G{v:g} is not supported")
                if grp in gs:
                    raise _Error(f"line {n}: G{gs[grp]} and G{g} in one line (same modal group)")
                gs[grp] = g
            elif letter == "M":
                m = _code(v, "M", n)
                if m not in (2, 30):
                    raise _Error(f"line {n}: M{v:g} is not supported")
                ms.append(m)
            elif letter in "XYZIJKRFP":
                if letter in seen:
                    raise _Error(f"line {n}: {letter} twice in one line")
                seen[letter] = v
            elif letter == "N":
                raise _Error(f"line {n}: N must start the line")
            else:
                raise _Error(f"line {n}: word {letter} is not supported")
        if len(ms) > 1:
            raise _Error(f"line {n}: more than one M code")
        # modal settings first (LinuxCNC's order of execution)
        if "units" in gs:
            st.units = gs["units"]
        if "F" in seen:
            if not seen["F"] > 0:
                raise _Error(f"line {n}: feed F must be positive, got {seen['F']:g}")
            st.feed = seen["F"] * UNITS[st.units] / 60.0
        unit = UNITS[st.units]
        if "plane" in gs:
            st.plane = gs["plane"]
        if "path" in gs:
            if gs["path"] == 64:
                if "P" not in seen:
                    raise _Error(f"line {n}: G64 needs P (the blending tolerance): pkrt never blends without a bound")
                if seen["P"] < 0:
                    raise _Error(f"line {n}: G64 P must not be negative")
                st.blend = seen["P"] * unit
            else:
                st.blend = None
        if "distance" in gs:
            st.absolute = gs["distance"] == 90
        if "dwell" in gs:
            if "P" not in seen:
                raise _Error(f"line {n}: G4 needs P (seconds)")
            if seen["P"] < 0:
                raise _Error(f"line {n}: G4 P must not be negative")
            if any(k in seen for k in "XYZIJKR") or "motion" in gs:
                raise _Error(f"line {n}: G4 with a motion on the same line")
            flush()
            items.append(Dwell(seen["P"], n))
        elif "P" in seen and gs.get("path") != 64:
            raise _Error(f"line {n}: P without G4 or G64")
        if "motion" in gs:
            st.motion = gs["motion"]
        axes = [k for k in "XYZ" if k in seen]
        offsets = [k for k in "IJKR" if k in seen]
        if axes or offsets or "motion" in gs:
            if st.motion is None:
                raise _Error(f"line {n}: coordinates without a motion mode (G0, G1, G2 or G3)")
            target = st.pos.copy()
            for i, k in enumerate("XYZ"):
                if k in seen:
                    target[i] = seen[k] * unit + (0.0 if st.absolute else st.pos[i])
            if st.motion in (0, 1):
                if offsets:
                    raise _Error(f"line {n}: {','.join(offsets)} with G{st.motion} (only arcs take them)")
                feed = np.inf
                if st.motion == 1:
                    if st.feed is None:
                        raise _Error(f"line {n}: G1 without a feed rate (F)")
                    feed = st.feed
                if axes:
                    segs.append(Line.between(origin + st.pos, origin + target, feed, n))
                    tols.append(st.blend)
            elif axes or offsets:  # an arc (a G2/G3 alone only sets the mode)
                if st.feed is None:
                    raise _Error(f"line {n}: G{st.motion} without a feed rate (F)")
                segs.append(_arc(st, seen, target, origin, n))
                tols.append(st.blend)
            st.pos = target
        if ms:
            ended = True
            break
    if not ended:
        raise _Error(f"{path}: the program ends without M2 or M30 (line {len(raw)})")
    flush()
    if not any(isinstance(x, Motion) for x in items):
        raise _Error(f"{path}: the program has no motion")
    return Program(items, path, len(raw), {"kind": "gcode", "path": path})


def _arc(st: _State, seen: dict, target: np.ndarray, origin: np.ndarray, n: int) -> Arc:
    """The arc from st.pos to target (program coordinates, m) in the current plane."""
    unit = UNITS[st.units]
    a, b, c = PLANES[st.plane]
    allowed = {OFFSET[a], OFFSET[b]}
    offs = [k for k in "IJK" if k in seen]
    for k in offs:
        if k not in allowed:
            raise _Error(f"line {n}: {k} is not an offset in the G{st.plane} plane (use {' and '.join(sorted(allowed))})")
    p0, p1 = st.pos, target
    u0, u1 = np.array([p0[a], p0[b]]), np.array([p1[a], p1[b]])
    cw = st.motion == 2
    if "R" in seen:
        if offs:
            raise _Error(f"line {n}: R and I/J/K together")
        r = seen["R"] * unit
        chord = u1 - u0
        d = float(np.linalg.norm(chord))
        if d < 1e-12:
            raise _Error(f"line {n}: an R arc needs an end point different from the start")
        if abs(r) < 1e-12:
            raise _Error(f"line {n}: R must not be zero")
        if d > 2 * abs(r) * (1 + 1e-9) + 1e-12:
            raise _Error(f"line {n}: R {seen['R']:g} is too small for the chord {d / unit:.6g}")
        h = math.sqrt(max(r * r - d * d / 4, 0.0))
        left = np.array([-chord[1], chord[0]]) / d
        side = (1 if not cw else -1) * (1 if r > 0 else -1)
        ctr = 0.5 * (u0 + u1) + side * h * left
    else:
        if not offs:
            raise _Error(f"line {n}: G{st.motion} needs the centre (I, J, K) or a radius R")
        ctr = u0 + np.array([seen.get(OFFSET[a], 0.0), seen.get(OFFSET[b], 0.0)]) * unit
    r0, r1 = float(np.linalg.norm(u0 - ctr)), float(np.linalg.norm(u1 - ctr))
    if r0 < 1e-9:
        raise _Error(f"line {n}: the arc's centre is its start point (zero radius)")
    if abs(r1 - r0) > ARC_ABS_TOL and abs(r1 - r0) > ARC_REL_TOL * r0:
        raise _Error(f"line {n}: radius to the end of the arc ({r1 / unit:.6g}) differs from the radius to its "
                     f"start ({r0 / unit:.6g})")
    t0 = math.atan2(u0[1] - ctr[1], u0[0] - ctr[0])
    t1 = math.atan2(u1[1] - ctr[1], u1[0] - ctr[0])
    sweep = ((t0 - t1) if cw else (t1 - t0)) % (2 * math.pi)
    if sweep < 1e-9:
        sweep = 2 * math.pi  # end at the start: a full circle
    e = np.eye(3)
    centre = origin + ctr[0] * e[a] + ctr[1] * e[b] + p0[c] * e[c]
    h_rate = (p1[c] - p0[c]) / sweep
    length = sweep * math.hypot(0.5 * (r0 + r1), h_rate)
    return Arc(length, st.feed, n, "arc", centre, e[a], e[b], r0, r1, t0, sweep, -1 if cw else 1, h_rate)


def read_program(path: str, origin) -> Program:
    """Read and parse a program file (UTF-8 or ASCII text)."""
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if b"\x00" in data:
        raise UserError(f"{path}: not a text G-code program (binary data)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text G-code program (not UTF-8)") from None
    if not text.strip():
        raise UserError(f"{path}: empty program")
    try:
        return parse_program(text.replace("\r\n", "\n").replace("\r", "\n"), path, origin)
    except _Error as e:
        raise UserError(f"{path}: {e}" if not str(e).startswith(path) else str(e)) from None
