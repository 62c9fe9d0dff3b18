"""G-code (``pkrt.models.planning.gcode``): each word and mode parsed as LinuxCNC does, and a corpus of bad
programs each refused by ``pkrt plan`` with one line, exit code 2, naming the program line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pkrt.models.planning.gcode import parse_program, parse_words
from pkrt.models.planning.geompath import Arc, Blend, Dwell, Line, Motion
from pkrt.rt.cli import main
from pkrt.rt.core.errors import UserError


def _motions(text: str, origin=(0.0, 0.0, 0.0)) -> list:
    return parse_program(text, "p.ngc", origin).items


def _segs(text: str) -> list:
    return [g for it in _motions(text) if isinstance(it, Motion) for g in it.segments]


# -- words ------------------------------------------------------------------------------------

def test_words_comments_spaces_and_line_numbers():
    assert parse_words("N10 G1 X1.5 y-2 (a comment) Z .5 ; rest", 1) == [
        ("N", 10.0), ("G", 1.0), ("X", 1.5), ("Y", -2.0), ("Z", 0.5)]
    assert parse_words("G 0 1 X 1 0", 1) == [("G", 1.0), ("X", 10.0)]  # spaces ignored, as LinuxCNC


def test_g0_g1_feed_units_per_minute_and_origin():
    (a, b) = _segs("G0 X10\nG1 Y10 F600\nM2")  # a stop between them: 90 degrees, G61
    assert isinstance(a, Line) and a.feed == math.inf and np.allclose(a.b, [0.01, 0, 0])
    assert b.feed == pytest.approx(0.01)  # 600 mm/min
    (c,) = _segs("G1 X10 F600\nM2".replace("X10", "X10"))
    (d,) = [g for it in _motions("G1 X10 F600\nM2", (1.0, 2.0, 3.0)) for g in it.segments]
    assert np.allclose(d.a, [1, 2, 3]) and np.allclose(d.b, [1.01, 2, 3])


def test_g20_inches_and_g91_incremental():
    (a, b) = _segs("G20 G91 G1 X1 F10\nY1\nM2")
    assert np.allclose(a.b, [0.0254, 0, 0]) and np.allclose(b.b, [0.0254, 0.0254, 0])
    assert a.feed == pytest.approx(0.0254 * 10 / 60)
    (c,) = _segs("G91 G0 X5\nG90 X5\nM2")  # back to absolute: X5 is where it already is
    assert np.allclose(c.b, [0.005, 0, 0])


@pytest.mark.parametrize("code, mid", [("G2", [0.01, 0.01, 0]), ("G3", [0.01, -0.01, 0])])
def test_g2_clockwise_g3_counter_clockwise_in_xy(code, mid):
    (arc,) = _segs(f"G0 X0\n{code} X20 Y0 I10 J0 F100\nM2")
    assert isinstance(arc, Arc)
    P = arc.eval(np.array([0.0, arc.length / 2, arc.length]))[0]
    assert np.allclose(P, [[0, 0, 0], mid, [0.02, 0, 0]], atol=1e-12)
    assert arc.length == pytest.approx(math.pi * 0.01)


def test_r_arcs_short_and_long():
    (short,) = _segs("G2 X10 Y10 R10 F100\nM2")
    (long_,) = _segs("G2 X10 Y10 R-10 F100\nM2")
    assert short.sweep == pytest.approx(math.pi / 2) and long_.sweep == pytest.approx(1.5 * math.pi)
    for arc in (short, long_):
        assert np.allclose(arc.end(), [0.01, 0.01, 0], atol=1e-12)


def test_planes_g18_g19_full_circle_and_helix():
    (zx,) = _segs("G18 G3 X0 Z0 I10 F100\nM2")  # a full circle in ZX, centre 10 mm along x
    assert zx.sweep == pytest.approx(2 * math.pi)
    P = zx.eval(np.linspace(0, zx.length, 9))[0]
    assert np.allclose(P[:, 1], 0) and np.allclose(np.linalg.norm(P - [0.01, 0, 0], axis=1), 0.01)
    (yz,) = _segs("G19 G2 Y10 Z10 J10 F100\nM2")
    assert np.allclose(yz.end(), [0, 0.01, 0.01], atol=1e-12) and np.allclose(yz.eval(np.array([1e-3]))[0][0, 0], 0)
    (helix,) = _segs("G17 G3 X0 Y0 Z5 I10 F100\nM2")
    assert np.allclose(helix.end(), [0, 0, 0.005], atol=1e-12)
    assert helix.length == pytest.approx(math.hypot(2 * math.pi * 0.01, 0.005))


def test_g4_dwell_in_seconds_and_g61_g64():
    items = _motions("G1 X10 F100\nG4 P0.5\nG1 Y10\nM2")
    assert [type(x) for x in items] == [Motion, Dwell, Motion] and items[1].seconds == 0.5
    stops = _motions("G61 G1 X10 F100\nY10\nM2")
    assert len(stops) == 2  # exact stop at the corner
    (blended,) = _motions("G64 P0.5 G1 X10 F100\nY10\nM2")
    kinds = [g.kind for g in blended.segments]
    assert kinds == ["line", "blend", "line"]
    bl = blended.segments[1]
    P = bl.eval(np.linspace(0, bl.length, 401))[0]
    dev = np.minimum(np.abs(P[:, 1]), np.abs(P[:, 0] - 0.01))  # distance to the two programmed lines
    assert dev.max() <= 0.5e-3 * (1 + 1e-9) and dev.max() > 0.4e-3


def test_m30_ends_and_later_lines_are_not_read():
    items = _motions("%\nG1 X10 F100\nM30\nG1 X20 Q9\n")
    assert len(items) == 1 and np.allclose(items[0].segments[-1].b, [0.01, 0, 0])
    assert len(_motions("%\nG0 X1\n%\nthis is not read")) == 1


# -- bad programs: one line, exit 2, naming the line --------------------------------------------

def plan_refused(path, content, capsys) -> str:
    """Write ``content`` (text or bytes) to ``path``, run ``pkrt plan`` on it: exit 2 and one
    line on stderr (no traceback), returned."""
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code = main(["plan", str(path), "--json"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("pkrt: error: ") and "Traceback" not in err, err
    return err


BAD = [  # (program, text expected in the message)
    ("G1 X1 F100\nG5 X2\nM2", "line 2: G5 is not supported"),
    ("G0 X1\nQ5\nM2", "line 2: word Q"),
    ("G1 X1\nM2", "line 1: G1 without a feed"),
    ("G2 X1 Y1 F100\nM2", "line 1: G2 needs the centre"),
    ("G0 X0\nG2 X10 Y0 I3 F100\nM2", "line 2: radius to the end"),
    ("G0 XNaN\nM2", "line 1: cannot read"),
    ("G0 X1e400\nM2", "line 1: word E is not supported"),  # no exponents in G-code
    ("G0 X99999999\nM2", "line 1: number 99999999 out of range"),
    ("G0 X1\n", "without M2 or M30"),
    ("G4\nM2", "line 1: G4 needs P"),
    ("G64\nM2", "line 1: G64 needs P"),
    ("G0 G1 X1\nM2", "line 1: G0 and G1 in one line"),
    ("G0 X1 X2\nM2", "line 1: X twice"),
    ("(unclosed comment\nM2", "line 1: comment not closed"),
    ("G0 X1 (a (nested) b)\nM2", "line 1: nested comment"),
    ("M3 S1000\nM2", "line 1: M3 is not supported"),
    ("X1\nM2", "line 1: coordinates without a motion mode"),
    ("G1 X1 F-5\nM2", "line 1: feed F must be positive"),
    ("G1 X1 F0\nM2", "line 1: feed F must be positive"),
    ("G17 G2 X1 Y1 K1 F100\nM2", "line 1: K is not an offset in the G17 plane"),
    ("G2 X1 Y1 R1 I1 F100\nM2", "line 1: R and I/J/K together"),
    ("G2 X10 Y0 R2 F100\nM2", "line 1: R 2 is too small"),
    ("G2 X0 Y0 R5 F100\nM2", "line 1: an R arc needs an end point"),
    ("G1 X1 I1 F100\nM2", "line 1: I with G1"),
    ("G4 P-1\nM2", "line 1: G4 P must not be negative"),
    ("G64 P-1\nM2", "line 1: G64 P must not be negative"),
    ("/G0 X1\nM2", "line 1: block delete"),
    ("G0 X1 P2\nM2", "line 1: P without G4 or G64"),
    ("G61.1\nM2", "line 1: G61.1 is not supported"),
    ("G1 X1 F100 N5\nM2", "line 1: N must start the line"),
    ("G0 X1 Y1 )\nM2", "line 1: ')' without '('"),
    ("G28\nM2", "line 1: G28 is not supported"),
    ("T1 M6\nM2", "line 1: word T"),
    ("G0 X1#\nM2", "line 1: cannot read '#'"),
    ("G0 X1\nM2 M30", "line 2: more than one M code"),
    ("G2 X0 Y0 I0 J0 F100\nM2", "line 1: the arc's centre is its start point"),
    ("G0 X1\nG4 P1 X2\nM2", "line 2: G4 with a motion"),
    ("G0 X1\nG0 X200\nM2", "line 2: "),  # outside the Orthoglide's workspace
    ("G20 G0 X3\nM2", "line 1: actuator q1 would be at"),  # 76.2 mm along x: beyond its range
    ("M2", "no motion"),
    ("", "empty program"),
    ("   \n\n", "empty program"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "not a text G-code program (binary data)"),
    (b"G0 X1\xff\xfe\nM2", "not a text G-code program (not UTF-8)"),
]


@pytest.mark.parametrize("program, expected", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_programs_get_one_line_and_exit_2(program, expected, tmp_path, capsys):
    path = tmp_path / "bad.ngc"
    err = plan_refused(path, program, capsys)
    assert expected in err and str(path) in err, err


def test_parse_errors_are_user_errors():
    with pytest.raises(UserError, match="line 3"):
        parse_program("G0 X1\nG1 X2 F100\nG7\nM2")


def test_there_are_at_least_30_bad_programs():
    assert len(BAD) >= 30


@pytest.mark.parametrize("program, expected", [
    ("G1 X1 F100\nG4 P999999\nM2", "line 2: a dwell of 999999 s"),
    ("G1 X10 F0.0001\nM2", "more than 10000000 samples"),
])
def test_programs_too_long_to_plan(program, expected, tmp_path, capsys):
    assert expected in plan_refused(tmp_path / "long.ngc", program, capsys)


@pytest.mark.parametrize("origin", ["nan,0,0", "0,0", "1,inf,0"])
def test_bad_origin(origin, capsys):
    assert main(["plan", "x.ngc", "--origin", origin, "--json"]) == 2
    assert "--origin" in capsys.readouterr().err
