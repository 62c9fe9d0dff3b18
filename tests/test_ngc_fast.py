"""The fast G-code reader (``ngc_fast`` over the compiled ``ngc_scan``) against the Python
interpreter, its definition: on generated programs (hypothesis: the CAM subset in every
spelling, mixed with lines only the interpreter runs, errors of every kind, files cut into
blocks of any size and batches of any length), on the project's corpus and LinuxCNC's example
programs, every canonical command equal field by field to the last bit and every error the
same line; the corpus through the fast path against LinuxCNC's ``rs274``; the generated CAM
programs read almost wholly by the scanner, in memory that does not grow with the file."""

from __future__ import annotations

import math
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkrt.models.planning.gcode import canon_stream, read_lines
from pkrt.models.planning.ngc_fast import CanonBatch, FastReader, fast_canon_stream
from pkrt.models.planning.ngc_scan import py_hypot
from pkrt.models.planning.ngc_setup import Setup, Tool
from pkrt.rt.bench.camprograms import finishing, relief
from pkrt.rt.core.errors import UserError
from tests.ngc_oracle import UNPACKED, differences, oracle_commands, pkrt_commands, run_rs274
from tests.test_gcode_oracle import CORPUS, EXAMPLES, PUBLIC, SETUP as ORACLE_SETUP, oracle_text

SETUP = Setup(tools={1: Tool(1, 1, np.array([0.0, 0.0, 20.0])), 2: Tool(2, 2, np.array([1.0, -2.0, 5.0]))},
              offsets={1: np.array([-40.0, -40.0, -120.0]), 2: np.array([-10.0, -10.0, -10.0])})
NCFILES = sorted((UNPACKED / "usr" / "share" / "linuxcnc" / "ncfiles").glob("*.ngc"))


def _bits(x):
    """A value with floats as their exact bits (so -0.0 and 0.0 differ), containers recursed."""
    if x is None or isinstance(x, str):
        return x
    if isinstance(x, (np.ndarray, tuple, list)):
        return tuple(_bits(v) for v in x)
    if isinstance(x, (bool, np.bool_)):
        return ("bool", bool(x))
    if isinstance(x, (int, np.integer)):
        return int(x)
    return float(x).hex()


def key(c) -> tuple:
    return (c.kind, c.line, _bits(c.end), _bits(c.start), _bits(c.feed), _bits(c.blend), _bits(c.units),
            _bits(c.offset), _bits(c.centre), c.turn, c.plane, _bits(c.value), _bits(getattr(c, "naive", None)))  # G64 Q, where the canon has it


def outcome(fn):
    """(the canonical commands as keys, None) or (None, the error's type and one line)."""
    try:
        return [key(c) for c in fn()], None
    except UserError as e:
        return None, (type(e).__name__, str(e))


def both(path: Path, setup: Setup | None = SETUP, **reader):
    """The interpreter's and the fast reader's outcomes on the file at ``path``."""
    p = str(path)
    slow = outcome(lambda: canon_stream(read_lines(p), setup, (0.0, 0.0, 0.0), p))

    def fast():
        for part in FastReader(p, setup, **reader):
            yield from part.canon() if isinstance(part, CanonBatch) else part

    return slow, outcome(fast)


# -- generated programs -----------------------------------------------------------------------------

def _num(draw, v: float, junk: bool = False, precise: bool = False) -> str:
    """``v`` written as CAM posts and people write numbers (now and then, with ``junk``, a
    number the interpreter refuses; ``precise``: to 1e-3 or better)."""
    style = draw(st.sampled_from([0, 1, 3, 5, 6] + [20] * junk) if precise else st.integers(0, 20 if junk else 6))
    if style == 0:
        return f"{v:.4f}"
    if style == 1:
        return f"{v:.3f}".rstrip("0")  # '1.' and '-.5' included
    if style == 2:
        return f"{v:+.2f}"
    if style == 3:
        s = f"{v:.4f}"
        return s.replace("0.", ".", 1) if abs(v) < 1 else s
    if style == 4:
        return str(round(v))
    if style == 5:
        return f"{v:.6f}"
    if style == 6:
        return f"{v:.10f}"
    if style < 20:
        return f"{v:.4f}"
    return draw(st.sampled_from(["0", "-0", "0.0", "00012.5", "1.2.3", "", "-", "1e3", "+-1", "1000001",
                                 "123456789012345678", "0.00000000000000000000001", "#1"]))


def _sep(draw) -> str:
    return draw(st.sampled_from(["", "", " ", " ", "\t", "  ", "(c)", " (a comment) "]))


PLANE_WORDS = {"17": ("X", "Y", "I", "J"), "18": ("Z", "X", "K", "I"), "19": ("Y", "Z", "J", "K")}
OTHER_LINES = ["M3 S1000", "M5", "M8", "M9", "G54", "G55", "G20", "G21", "G80", "G93", "G94", "T1 M6",
               "T2 M6 G43 H2", "G43 H1", "G49", "G4 P0.1", "/G1 X1", "/M3 S100", "M0", "M1", "G98", "G99",
               "G81 X1 Y1 Z-1 R1", "G83 X1 Y2 Z-2 R1 Q0.5", "G53 G0 Z0", "G40", "(MSG, hello)", "( debug, x)",
               "(print, x)", "; log, x", "G1 X1 (100%)", "G1 X1 (caf\u00e9)", "g1 x1 y2 f300", "G1 x.5", "G1\tX1",
               "G1 X1 ;rest", "G0", "G1", "G1 X2", "N10.5 G0 X1", "G1.0 X1", "G90.1", "G91.1", "G93 G1 X1 F2",
               "G94 F500"]
ERROR_LINES = ["%", "G91 G28 Z0", "O100 sub", "#1 = 2", "G1 X[1+2]", "G1 X1 (c (nested))", "G1 X1 (unclosed",
               "G1 X1)", "G0 X1 N5", "N G0", "G1 X1 X2", "G0 G1 X1", "G17 G18", "G1 X1 F-5", "S-1", "G41",
               "G64 G2 X1 Y1 R5 P1", "G0 X1 I1", "G1 R1 X1", "G1 Q1 X1", "G0 P1 X1", "G1 X1 \u00e9", "G1 X1\x0c",
               "G2 X1 Y1 I0 J0", "G3 P0 I1", "G3 P1.5 I1", "G2 I1 J1 K1", "G2 X5 R0.1", "G90.1 G2 X1 Y0 I1",
               "G2", "F0", "N10. G0 X1", "G00.1 X1", "G0.5 X1", "G-1 X1", "G1 X1e3", "G80 X1", "X1",
               "G3 P1 X0 Y0 I1 J0"]


@st.composite
def cam_line(draw, state: dict) -> str:
    """A line of the subset, mostly valid given the generator's view of the state (``state``:
    pos, plane, incremental, motion; junk: now and then a number the interpreter refuses)."""
    kind = draw(st.integers(0, 9))
    junk = state["junk"]
    n = draw(st.sampled_from(["", "", "", "N10 ", "n20", "N30.5 ", "N7"]))
    sep = _sep(draw)
    if kind == 0:
        return n + draw(st.sampled_from(["G17", "G18", "G19", "G90", "G91", "G90.1", "G91.1", "G61", "G61.1", "G64",
                                         "G64 P0.01", "G64 P0.02 Q0.01", "G17 G90", "F600", "F1200.5", "S12000",
                                         "G64P.005", "g18", "(only a comment)", "", "   ", ";only a comment"]))
    if kind <= 5:  # a line move
        g = draw(st.sampled_from(["G0", "G00", "G1", "G01", "g1"] + (["", ""] if state["motion"] in "01" else [])))
        state["motion"] = g[-1:] or state["motion"]
        words = []
        for ax in "XYZ":
            if draw(st.booleans()):
                v = draw(st.floats(-20, 20, allow_nan=False))
                words.append(ax + _num(draw, v, junk))
        if draw(st.integers(0, 3)) == 0:
            words.append("F" + _num(draw, draw(st.floats(1, 3000)), junk=False))
        if draw(st.integers(0, 6)) == 0:
            words.append("S" + _num(draw, draw(st.floats(0, 20000)), junk=False))
        draw(st.randoms()).shuffle(words)
        return n + g + sep + sep.join(words)
    # an arc in the state's plane: centre offset and an end on (about) the same circle
    plane = state["plane"]
    a, b, ca, cb = PLANE_WORDS[plane]
    g = draw(st.sampled_from(["G2", "G3", "G02", "G03"] + (["", ""] if state["motion"] in "23" else [])))
    state["motion"] = g[-1:] or state["motion"]
    r, phi = draw(st.floats(0.2, 5)), draw(st.floats(-math.pi, math.pi))
    i, j = r * math.cos(phi), r * math.sin(phi)
    turn = draw(st.floats(0.05, 6.2)) * draw(st.sampled_from([1, -1]))
    c = math.cos(turn), math.sin(turn)
    ea, eb = -i * c[0] + j * c[1] + i, -i * c[1] - j * c[0] + j  # the start rotated about the centre, relative
    if not state["incremental"]:
        ea, eb = ea + state["pos"].get(a, 0.0), eb + state["pos"].get(b, 0.0)
    words = [a + _num(draw, ea, junk, True), b + _num(draw, eb, junk, True)]
    if draw(st.booleans()):
        words += [ca + _num(draw, i, junk, True), cb + _num(draw, j, junk, True)]
    else:  # R: the chord's radius either way round (a few too short)
        words.append("R" + _num(draw, draw(st.sampled_from([r, -r, r, -r, r * 1.5, r * 0.4])), junk, True))
    if draw(st.integers(0, 4)) == 0:
        words.append(draw(st.sampled_from(["P2", "P1", "P3.0"])))
    if draw(st.integers(0, 3)) == 0:  # a helix
        normal = "XYZ"[3 - "XYZ".index(a) - "XYZ".index(b)]
        words.append(normal + _num(draw, draw(st.floats(-5, 5))))
    return n + g + sep + sep.join(words)


def _track(state: dict, line: str) -> None:
    """The generator's rough view of the state after ``line`` (planes, distance mode, position)."""
    up = re.sub(r"\([^)]*\)|;.*|\s", "", line.upper())
    for p in ("17", "18", "19"):
        if f"G{p}" in up:
            state["plane"] = p
    if "G91" in up and "G91.1" not in up:
        state["incremental"] = True
    if "G90" in up and "G90.1" not in up:
        state["incremental"] = False
    m = re.search(r"G0*([0-3])(?![0-9.])", up)
    if m:
        state["motion"] = m.group(1)
    if re.search(r"G(8[0-9]|73|93)", up):
        state["motion"] = "8"
    for ax in "XYZ":
        m = re.search(ax + r"([+-]?\d*\.?\d+)", up)
        if m and not state["incremental"]:
            state["pos"][ax] = float(m.group(1))


@st.composite
def programs(draw) -> tuple[bytes, int, int]:
    """A program's bytes, a block size and a batch size to read it with."""
    state = {"plane": "17", "incremental": False, "pos": {}, "motion": "1", "junk": draw(st.integers(0, 9)) == 0}
    head = draw(st.sampled_from([["G21 G90 F600"], ["%", "G21 G90 F600 G1"], ["", "(header)", "G21 G17 G90 G94 G54",
                                                                            "F300"], ["G20 F10 G1"], ["G1 F100"]]))
    head = head + ["G0 X1 Y1 Z1", draw(st.sampled_from(["G1", "G0", "G1 F200", "G3 I1"]))]  # a known position
    lines = list(head)
    for line in head:
        _track(state, line)
    for _ in range(draw(st.integers(0, 40))):
        other = draw(st.integers(0, 7)) == 0
        line = draw(st.sampled_from(OTHER_LINES)) if other else draw(cam_line(state))
        _track(state, line)
        lines.append(line)
        if other:  # it may have moved the program's zero: a move to a known point
            x, y, z = (round(draw(st.floats(-20, 20)), 3) for _ in range(3))
            lines.append(f"G90 G0 X{x} Y{y} Z{z}")
            state.update(pos={"X": x, "Y": y, "Z": z}, incremental=False, motion="0")
    if draw(st.integers(0, 3)) == 0:  # one line the interpreter refuses
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(ERROR_LINES)))
    ends = [["M2"], ["M30"], ["G0 Z5", "M30", "G1 X1 never read"], [], ["M2", "(after the end)"]]
    lines += draw(st.sampled_from(ends + [["%"], ["%", "G1 X1 never read"]] if head[0] == "%" else ends))
    eol = draw(st.sampled_from(["\n", "\r\n", "\n", "\r"]))
    text = eol.join(lines) + draw(st.sampled_from(["", eol]))
    return text.encode("utf-8"), draw(st.sampled_from([7, 16, 64, 4096, 1 << 20])), draw(st.sampled_from([3, 4, 9, 1 << 15]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(programs())
def test_the_fast_reader_gives_the_interpreters_commands_and_errors(tmp_path, prog):
    data, block, rows = prog
    p = tmp_path / "p.ngc"
    p.write_bytes(data)
    slow, fast = both(p, block=block, rows=rows)
    assert fast == slow


def test_binary_and_non_utf8_lines_are_refused_at_their_line_as_read_lines_does(tmp_path):
    for data in (b"G21\nG0 X1\nG1 X2 F100\x00\nM2\n", b"G21\nG0 X1\n(caf\xe9)\nM2\n", b"G21\r\nG0 X1\rG0 X\xff\nM2",
                 b"G21\nG0 X1\nM2\n\x00\x00"):
        p = tmp_path / "b.ngc"
        p.write_bytes(data)
        slow, fast = both(p, block=5)
        assert slow == fast and (slow[1] or slow[0])
    missing = both(tmp_path / "missing.ngc")
    assert missing[0] == missing[1] and "cannot read" in missing[0][1][1]


# -- real programs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", CORPUS + NCFILES, ids=[p.stem for p in CORPUS + NCFILES])
def test_corpus_and_linuxcnc_examples_equal_through_the_fast_path(path):
    """Every program of the project's corpus and of LinuxCNC's shipped ncfiles (those pkrt
    refuses included: the same error at the same line)."""
    for setup in (SETUP, ORACLE_SETUP):
        slow, fast = both(path, setup)
        assert fast == slow


def test_linuxcnc_ncfiles_are_there():
    assert len(NCFILES) > 40, f"LinuxCNC's example programs are missing from {UNPACKED} (run .ci/rs274)"


@pytest.mark.parametrize("path", CORPUS + [EXAMPLES / n for n in PUBLIC], ids=[p.stem for p in CORPUS] + PUBLIC)
def test_oracle_corpus_through_the_fast_path_agrees_with_linuxcnc(path, tmp_path):
    """The fast reader's commands against rs274's (as tests/test_gcode_oracle.py compares the
    interpreter's)."""
    text = path.read_text(errors="replace")
    printed, err = run_rs274(oracle_text(text), ORACLE_SETUP)
    assert not err, f"rs274 refused it: {err}"
    p = tmp_path / "p.ngc"
    p.write_text(text)
    ours = pkrt_commands(fast_canon_stream(str(p), ORACLE_SETUP))
    diffs = differences(ours, oracle_commands(printed))
    assert not diffs, "\n".join(diffs[:10])


def test_cam_programs_are_read_by_the_scanner_in_bounded_memory(tmp_path):
    """The generated relief and finishing programs: all but their few preamble and end lines
    read by the compiled scanner; the reader's peak memory (small blocks and batches here) the
    same for a file ten times longer, and a small part of the file's size."""
    peaks = []
    for lines in (20_000, 200_000):
        path = relief(tmp_path / f"r{lines}.ngc", lines=lines)
        reader = FastReader(str(path), SETUP, block=1 << 14, rows=1 << 10)
        tracemalloc.start()
        rows = sum(len(b) for b in reader if isinstance(b, CanonBatch))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert reader.lines > 0.99 * lines and reader.interpreted <= 8 and rows > 0.99 * lines
    assert peaks[1] < 1.2 * peaks[0] and peaks[1] < 0.1 * path.stat().st_size, (peaks, path.stat().st_size)
    f = finishing(tmp_path / "f.ngc", segments=5000)
    reader = FastReader(str(f), SETUP)
    assert sum(len(b) for b in reader if isinstance(b, CanonBatch)) >= 5000 and reader.interpreted <= 8


def test_hypot_is_cpythons_to_the_bit():
    rng = np.random.default_rng(7)
    x = rng.normal(size=20000) * 10.0 ** rng.integers(-6, 7, 20000)
    y = x * rng.choice([1.0, 1e-3, -1e-8, 0.0, -1.0], 20000) + rng.normal(size=20000) * 1e-9
    assert all(py_hypot(a, b) == math.hypot(a, b) for a, b in zip(x, y))
