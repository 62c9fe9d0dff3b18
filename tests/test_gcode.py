"""G-code (``pkrt.models.planning.gcode``): each word and mode interpreted as LinuxCNC does
(the corpus against LinuxCNC's own interpreter is tests/test_gcode_oracle.py), and a corpus of
bad programs each refused by ``pkrt plan`` with one line, exit code 2, naming the program line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pkrt.models.planning.gcode import interpret, parse_program
from pkrt.models.planning.geompath import Arc, Dwell, Event, Line, Motion
from pkrt.models.planning.ngc_setup import Setup, Tool, read_tool_table
from pkrt.models.planning.ngc_words import read_block
from pkrt.rt.cli import main
from pkrt.rt.core.errors import UserError

SETUP = Setup(tools={1: Tool(1, 1, np.array([0.0, 0.0, 20.0])), 2: Tool(2, 2, np.array([1.0, -1.0, 30.0]))},
              offsets={1: np.array([-40.0, -40.0, -60.0]), 2: np.array([10.0, 0.0, -5.0])})


def _motions(text: str, origin=(0.0, 0.0, 0.0), setup=None) -> list:
    return parse_program(text, "p.ngc", origin, setup).items


def _segs(text: str, setup=None) -> list:
    return [g for it in _motions(text, setup=setup) if isinstance(it, Motion) for g in it.segments]


def _ends(text: str, setup=SETUP) -> list:
    """(kind, end in program units) of each motion."""
    return [(c.kind, c.end.round(6).tolist()) for c in interpret(text, setup) if c.end is not None]


# -- words ------------------------------------------------------------------------------------

def test_words_comments_spaces_and_line_numbers():
    b = read_block("N10 G1 X1.5 y-2 (a comment) Z .5 ; rest", 1)
    assert b.words == {"X": 1.5, "Y": -2.0, "Z": 0.5} and b.g == {"motion": 10} and b.comment == " rest"
    assert read_block("G 0 1 X 1 0", 1).words == {"X": 10.0}  # spaces ignored, as LinuxCNC
    assert read_block("g61.1 g90.1 G43.1 z2", 1).g == {"path control": 611, "arc distance": 901,
                                                        "tool length offset": 431}
    assert read_block("/G0 X1", 1).delete and read_block("G80 G0 X1", 1).g == {"motion": 0}  # G80 yields


def test_g0_g1_feed_units_per_minute_and_origin():
    (a, b) = _segs("G0 X10\nG1 Y10 F600\nM2")  # a stop between them: 90 degrees, G61
    assert isinstance(a, Line) and a.feed == math.inf and np.allclose(a.b, [0.01, 0, 0])
    assert b.feed == pytest.approx(0.01)  # 600 mm/min
    (d,) = [g for it in _motions("G1 X10 F600\nM2", (1.0, 2.0, 3.0)) for g in it.segments]
    assert np.allclose(d.a, [1, 2, 3]) and np.allclose(d.b, [1.01, 2, 3])


def test_g20_inches_and_g91_incremental():
    (a, b) = _segs("G20 G91 G1 X1 F10\nY1\nM2")
    assert np.allclose(a.b, [0.0254, 0, 0]) and np.allclose(b.b, [0.0254, 0.0254, 0])
    assert a.feed == pytest.approx(0.010 / 60)  # F runs before G20 on its line (LinuxCNC's order): 10 mm/min
    assert _segs("G20\nG1 X1 F10\nM2")[0].feed == pytest.approx(0.0254 * 10 / 60)  # 10 inch/min
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


def test_planes_g18_g19_full_circle_helix_and_turns():
    (zx,) = _segs("G18 G3 X0 Z0 I10 F100\nM2")  # a full circle in ZX, centre 10 mm along x
    assert zx.sweep == pytest.approx(2 * math.pi)
    P = zx.eval(np.linspace(0, zx.length, 9))[0]
    assert np.allclose(P[:, 1], 0) and np.allclose(np.linalg.norm(P - [0.01, 0, 0], axis=1), 0.01)
    (yz,) = _segs("G19 G2 Y10 Z10 J10 F100\nM2")
    assert np.allclose(yz.end(), [0, 0.01, 0.01], atol=1e-12) and np.allclose(yz.eval(np.array([1e-3]))[0][0, 0], 0)
    (helix,) = _segs("G17 G3 X0 Y0 Z5 I10 F100\nM2")
    assert np.allclose(helix.end(), [0, 0, 0.005], atol=1e-12)
    assert helix.length == pytest.approx(math.hypot(2 * math.pi * 0.01, 0.005))
    (three,) = _segs("G17 G2 X0 Y0 Z-6 J5 P3 F100\nM2")  # P: three turns down 6 mm
    assert three.sweep == pytest.approx(6 * math.pi) and np.allclose(three.end(), [0, 0, -0.006], atol=1e-12)


def test_g90_1_absolute_arc_centres():
    arc = _segs("G0 X10\nG90.1 G3 X-10 I0 J0 F100\nM2")[-1]  # centre at the program origin, not 10 mm on
    assert np.allclose(arc.centre, 0) and arc.sweep == pytest.approx(math.pi)


def test_g4_dwell_in_seconds_and_g61_g61_1_g64():
    items = _motions("G1 X10 F100\nG4 P0.5\nG1 Y10\nM2")
    assert [type(x) for x in items] == [Motion, Dwell, Motion] and items[1].seconds == 0.5
    assert len(_motions("G61 G1 X10 F100\nY10\nM2")) == 2  # exact path: a stop at the corner
    assert len(_motions("G61 G1 X10 F100\nX20\nM2")) == 1  # ... but not on a straight join
    assert len(_motions("G61.1 G1 X10 F100\nX20\nM2")) == 2  # exact stop: a stop after every motion
    assert len(_motions("G64 G1 X10 F100\nY10\nM2")) == 2  # G64 without P: as G61 (no unbounded blend)
    (blended,) = _motions("G64 P0.5 G1 X10 F100\nY10\nM2")
    assert [g.kind for g in blended.segments] == ["line", "blend", "line"]
    bl = blended.segments[1]
    P = bl.eval(np.linspace(0, bl.length, 401))[0]
    dev = np.minimum(np.abs(P[:, 1]), np.abs(P[:, 0] - 0.01))  # distance to the two programmed lines
    assert dev.max() <= 0.5e-3 * (1 + 1e-9) and dev.max() > 0.4e-3


def test_m30_ends_and_later_lines_are_not_read():
    items = _motions("%\nG1 X10 F100\nM30\nG1 X20 Q9\n")
    assert len(items) == 1 and np.allclose(items[0].segments[-1].b, [0.01, 0, 0])
    assert len(_motions("\n%\nG0 X1\n%\nthis is not read")) == 1


def test_work_offsets_g53_and_tool_length_offsets():
    text = ("G0 X1 Y2 Z3\nG55 G0 X1 Y2 Z3\nG53 G0 X0 Y0 Z0\nT2 M6\nG43 H2\nG0 X0 Y0 Z0\nG43.1 Z5\nG0 Z0\n"
            "G49 G0 Z0\nM2")
    assert _ends(text) == [("traverse", [1, 2, 3]), ("traverse", [1, 2, 3]), ("traverse", [-10, 0, 5]),
                           ("traverse", [0, 0, 0]), ("traverse", [0, 0, 0]), ("traverse", [1, -1, 0])]
    gauge = [(c.end + c.offset) * c.units for c in interpret(text, SETUP) if c.end is not None]  # mm from zero
    assert np.allclose(gauge, [[-39, -38, -57], [11, 2, -2], [0, 0, 0], [11, -1, 25], [11, -1, 0], [11, -1, -5]])
    (tool,) = [it for it in _motions(text, setup=SETUP) if isinstance(it, Event)]
    assert tool.kind == "tool" and tool.hold and tool.values["tool"] == 2 and tool.line == 4


def test_spindle_coolant_and_tool_events():
    items = _motions("T1 M6\nS8000 M3 M8\nG0 X1\nM7\nS9000\nG1 X2 F100\nM0\nM1\nM5 M9\nG0 X0\nM4\nM30",
                     setup=SETUP)
    ev = [(it.kind, it.line, it.hold, {k: v for k, v in it.values.items() if k != "text"})
          for it in items if isinstance(it, Event)]
    assert ev == [("tool", 1, True, {"tool": 1}), ("spindle", 2, False, {"state": "off", "speed": 8000.0}),
                  ("spindle", 2, False, {"state": "cw", "speed": 8000.0}),
                  ("coolant", 2, False, {"mist": False, "flood": True}),
                  ("coolant", 4, False, {"mist": True, "flood": True}),
                  ("spindle", 5, False, {"state": "cw", "speed": 9000.0}),
                  ("stop", 7, True, {"code": "M0"}), ("stop", 8, True, {"code": "M1"}),
                  ("spindle", 9, False, {"state": "off", "speed": 9000.0}),
                  ("coolant", 9, False, {"mist": False, "flood": True}),  # MIST_OFF, then FLOOD_OFF
                  ("coolant", 9, False, {"mist": False, "flood": False}),
                  ("spindle", 11, False, {"state": "ccw", "speed": 9000.0}),
                  ("spindle", 12, False, {"state": "off", "speed": 9000.0})]
    quiet = Setup(SETUP.tools, optional_stop=False)  # the optional stop switch off: M1 does nothing
    assert not any(isinstance(it, Event) and it.kind == "stop" for it in _motions("G0 X1\nM1\nM2", setup=quiet))


def test_canned_cycles_expand_as_linuxcnc_does():
    ends = _ends("G0 X0 Y0 Z10\nG99 G81 X1 Y1 Z-2 R1 F100\nX2\nG98 G83 X3 Z-2.5 R1 Q1\nG80\nM2", Setup())
    assert ends == [("traverse", [0, 0, 10]),
                    ("traverse", [1, 1, 10]), ("traverse", [1, 1, 1]), ("feed", [1, 1, -2]), ("traverse", [1, 1, 1]),
                    ("traverse", [2, 1, 1]), ("feed", [2, 1, -2]), ("traverse", [2, 1, 1]),
                    ("traverse", [3, 1, 10]), ("traverse", [3, 1, 1]),  # G98: up to where the cycles began
                    ("feed", [3, 1, 0]), ("traverse", [3, 1, 1]), ("traverse", [3, 1, 0.254]),
                    ("feed", [3, 1, -1]), ("traverse", [3, 1, 1]), ("traverse", [3, 1, -0.746]),
                    ("feed", [3, 1, -2]), ("traverse", [3, 1, 1]), ("traverse", [3, 1, -1.746]),
                    ("feed", [3, 1, -2.5]), ("traverse", [3, 1, 10])]
    reps = _ends("G0 X0 Y0 Z5\nG91 G98 G81 X2 Z-3 R-4 L3 F100\nM2", Setup())  # L repeats, incremental
    assert [e for k, e in reps if k == "feed"] == [[2, 0, -2], [4, 0, -2], [6, 0, -2]]
    assert reps[-1] == ("traverse", [6, 0, 5])


def test_block_delete_switch_and_inverse_time():
    assert np.allclose(_motions("G0 X1\n/G0 X2\nM2")[0].segments[-1].b, [0.002, 0, 0])  # switch off: it runs
    assert np.allclose(_motions("G0 X1\n/G0 X2\nM2", setup=Setup(block_delete=True))[0].segments[-1].b,
                       [0.001, 0, 0])
    (a,) = _segs("G93 G1 X30 F2\nM2")  # inverse time: the move takes 1/2 min
    assert a.feed == pytest.approx(0.030 * 2 / 60)


def test_tool_tables(tmp_path):
    p = tmp_path / "t.tbl"
    p.write_text("; comment\nT1 P1 Z0.5 D0.125 ;first\nt2 p5 x0.1 z-1\n\n")
    tools = read_tool_table(str(p), "inch")
    assert tools[1].offset.tolist() == [0, 0, 12.7] and tools[1].diameter == pytest.approx(3.175)
    assert tools[2].pocket == 5 and tools[2].offset[0] == pytest.approx(2.54) and tools[1].comment == "first"
    for bad, msg in (("T1 Z1\nT1 Z2", "line 2: tool 1 twice"), ("P1 Z1", "line 1: no tool number"),
                     ("T1 Q3", "lathe tools"), ("T1 K3", "unknown word K"), ("T0 Z1", "T must be"),
                     ("T1 Z1e3", "cannot read 'Z1e3'")):
        p.write_text(bad)
        with pytest.raises(UserError, match=msg):
            read_tool_table(str(p))


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
    ("G1 X1 F100\nG5 X2\nM2", "line 2: G5 is not supported (splines)"),
    ("G0 X1\nQ5\nM2", "line 2: Q without G73, G83 or G64"),
    ("G1 X1\nM2", "line 1: G1 with zero feed rate (F)"),
    ("G2 X1 Y1 F100\nM2", "line 1: G2 needs the centre"),
    ("G0 X0\nG2 X10 Y0 I3 F100\nM2", "line 2: radius to the end"),
    ("G0 XNaN\nM2", "line 1: XNAN"),
    ("G0 X1e400\nM2", "line 1: word E400 is not supported"),  # no exponents in G-code
    ("G0 X99999999\nM2", "line 1: number 99999999 out of range"),
    ("G0 X1\n", "without M2 or M30"),
    ("G4\nM2", "line 1: G4 needs P"),
    ("G64 P-1\nM2", "line 1: negative P"),
    ("G0 G1 X1\nM2", "line 1: G0 and G1 in one line"),
    ("G0 X1 X2\nM2", "line 1: X twice"),
    ("(unclosed comment\nM2", "line 1: comment not closed"),
    ("G0 X1 (a (nested) b)\nM2", "line 1: nested comment"),
    ("M19\nM2", "line 1: M19 is not supported"),
    ("X1\nM2", "line 1: X, Y or Z without a motion mode"),
    ("G1 X1 F-5\nM2", "line 1: negative F"),
    ("G1 X1 F0\nM2", "line 1: G1 with zero feed rate"),
    ("G17 G2 X1 Y1 K1 F100\nM2", "line 1: K is not an offset in the G17 plane"),
    ("G2 X1 Y1 R1 I1 F100\nM2", "line 1: R and I/J/K together"),
    ("G2 X10 Y0 R2 F100\nM2", "line 1: R 2 is too small"),
    ("G2 X0 Y0 R5 F100\nM2", "line 1: an R arc needs an end point"),
    ("G1 X1 I1 F100\nM2", "line 1: I without G2 or G3"),
    ("G4 P-1\nM2", "line 1: negative P"),
    ("G41 X1\nM2", "line 1: G41 is not supported (cutter radius compensation)"),
    ("G0 X1 P2\nM2", "line 1: P without G4"),
    ("G59.1\nM2", "line 1: G59.1 is not supported"),
    ("G1 X1 F100 N5\nM2", "line 1: N must start the line"),
    ("G0 X1 Y1 )\nM2", "line 1: ')' without '('"),
    ("G28\nM2", "line 1: G28 is not supported (reference positions)"),
    ("T9 M6\nG0 X1\nM2", "line 1: tool 9 is not in the tool table"),
    ("G0 X1#\nM2", "line 1: '#': parameters (#) are not supported"),
    ("G0 X1\nM2 M30", "line 2: M2 and M30 in one line"),
    ("G2 X0 Y0 I0 J0 F100\nM2", "line 1: zero-radius arc"),
    ("G2 X1 Y1 I1 G4 P1 F100\nM2", "line 1: G4 with G2 or G3"),
    ("#1=5\nG0 X#1\nM2", "line 1: '#1=5': parameters (#) are not supported"),
    ("G0 X[1+2]\nM2", "line 1: X[1+2]: expressions ([...]) are not supported"),
    ("O100 sub\nM2", "line 1: 'O100SUB': O-words (subroutines, loops, conditions) are not supported"),
    ("G0 X1 A90\nM2", "line 1: word A90 is not supported: pkrt's G-code machines have X, Y and Z only"),
    ("G92 X0\nM2", "line 1: G92 is not supported (coordinate offsets)"),
    ("G95\nM2", "line 1: G95 is not supported (feed per revolution)"),
    ("G0 X1\nM98 P100\nM2", "line 2: M98 is not supported"),
    ("G0 @5 ^30\nM2", "line 1: word @5 is not supported: polar coordinates"),
    ("G93 G81 X1 Z-1 R1 F2\nM2", "line 1: G81 in inverse time feed mode (G93)"),
    ("G81 X1 Z-1 F100\nM2", "line 1: G81 needs R"),
    ("G81 X1 Z-1 R1 L0 F100\nM2", "line 1: G81 with L0"),
    ("G83 X1 Z-1 R1 Q0 F100\nM2", "line 1: G83 with Q <= 0"),
    ("G81 X1 Z2 R1 F100\nM2", "line 1: G81: R (1) below the bottom of the hole (2)"),
    ("G86 X1 Z-1 R1 P1 F100\nM2", "line 1: G86 with the spindle stopped"),
    ("G91 G53 G0 X1\nM2", "line 1: G53 in incremental distance mode"),
    ("G53 G2 X1 Y1 I1 F100\nM2", "line 1: G53 needs G0 or G1"),
    ("G0 X1 H1\nM2", "line 1: H without G43"),
    ("M61 Q1\nG0 X1\nM2", "line 1: M61 is not supported"),
    ("G0 X1\n%\nM2", "line 2: cannot read '%'"),  # '%' only as the first line
    ("G93 G1 X1\nM2", "line 1: G1 in inverse time (G93) needs F on its line"),
    ("G80 X1\nM2", "line 1: X, Y or Z with G80"),
    ("G81 R1 F100\nM2", "line 1: G81 without X, Y or Z"),
    ("G0 X1\nG2 X2 Y2 I1 P1.5 F100\nM2", "line 2: P must be a whole number >= 1 with G2 or G3"),
    ("G0 X1\nG88 X1 Z-1 R1 P1 F100\nM2", "line 2: G88 is not supported (boring with a manual retraction)"),
    ("G1 X1 F100 L2\nM2", "line 1: L without a canned cycle"),
    ("G0 X1\nG7.5\nM2", "line 2: G7.5 is not a G code pkrt (or LinuxCNC) knows"),
    ("M200\nM2", "line 1: M200 is not an M code pkrt (or LinuxCNC) knows"),
    ("G0 X1.2.3\nM2", "line 1: cannot read the number 'X1.2.3'"),
    ("G0 X1(c)2\nM2", "line 1: cannot read '2'"),
    ("G18 G2 X1 R2 Y1 F100\nG17 G2 Z3 R5\nM2", "line 2: an R arc in the G17 plane needs X or Y"),
    ("G0 X1\nG90.1 G2 X2 J0 F100\nM2", "line 2: I missing in an absolute-centre arc (G90.1)"),
    ("G0 X1\nG0 X200\nM2", "line 2: "),  # outside the Orthoglide's workspace
    ("G20 G0 X3\nM2", "line 1: actuator q1 would be at"),  # 76.2 mm along x: beyond its range
    ("M2", "no motion"),
    ("", "empty program"),
    ("   \n\n", "empty program"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "not a text G-code program (binary data at line 1)"),
    (b"G0 X1\xff\xfe\nM2", "not a text G-code program (not UTF-8 at line 1)"),
]


@pytest.mark.parametrize("program, expected", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_programs_get_one_line_and_exit_2(program, expected, tmp_path, capsys):
    path = tmp_path / "bad.ngc"
    err = plan_refused(path, program, capsys)
    assert expected in err and str(path) in err, err


def test_parse_errors_are_user_errors():
    with pytest.raises(UserError, match="line 3"):
        parse_program("G0 X1\nG1 X2 F100\nG7\nM2")


def test_there_are_at_least_60_bad_programs():
    assert len(BAD) >= 60


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


# -- reading lazily -------------------------------------------------------------------------

def test_a_program_file_is_read_lazily_and_gives_the_commands_of_its_text(tmp_path):
    from pkrt.models.planning.gcode import canon_stream, read_lines

    text = "%\nG21 G90\r\nG1 X1 F100\rG1 Y2\n\nM2\n%\n"
    p = tmp_path / "p.ngc"
    p.write_bytes(text.encode())
    whole = interpret(text.replace("\r\n", "\n").replace("\r", "\n"), SETUP)
    lazy = list(canon_stream(read_lines(str(p)), SETUP, path=str(p)))
    assert [(c.kind, c.line, c.end.tolist() if c.end is not None else None) for c in lazy] == \
           [(c.kind, c.line, c.end.tolist() if c.end is not None else None) for c in whole]

    read = []

    def lines():  # nothing after M2 is read, and commands come before the rest is read
        for n, line in enumerate(["G1 X1 F100", "G1 X2", "M2", "G1 X3"], start=1):
            read.append(n)
            yield line

    it = canon_stream(lines(), SETUP)
    first = next(it)
    assert first.kind == "feed" and read == [1]
    list(it)
    assert read == [1, 2, 3]


def test_a_binary_or_non_utf8_program_file_is_refused_naming_the_line(tmp_path):
    from pkrt.models.planning.gcode import read_lines

    p = tmp_path / "b.ngc"
    p.write_bytes(b"G1 X1\nG1 \xff\n")
    with pytest.raises(UserError, match=r"b.ngc: not a text G-code program \(not UTF-8 at line 2\)"):
        list(read_lines(str(p)))
    p.write_bytes(b"G1 X1\nG1\x00\n")
    with pytest.raises(UserError, match=r"binary data at line 2"):
        list(read_lines(str(p)))
    with pytest.raises(UserError, match="cannot read"):
        list(read_lines(str(tmp_path / "missing.ngc")))
