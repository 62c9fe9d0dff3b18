"""Passive-joint limits and capsules (``pkrt.models.kinematics.passive``): the description's
fields and their one-line errors, the content hash that leaves them out (the shipped trees still
load), the margins against independent computations (the hexapod's legs, the Delta's rod lean,
a five-bar's joint angle, a slider-crank's slide, segment distances by brute force), ``pkrt
model check``'s report, and the planners' refusals before motion: ``pkrt plan`` (G-code with
its line, path CSVs), ``pkrt run --traj``."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from pkrt.models.kinematics.description import MACHINES_DIR, load_description
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.passive import PathCheck, compile_passive, segment_distance
from pkrt.models.kinematics.taskspace import TaskKinematics, rpy_matrix
from pkrt.rt.cli import main

HEXAPOD = (MACHINES_DIR / "hexapod.toml").read_text()
FIVEBAR = (MACHINES_DIR / "fivebar.toml").read_text()
PROTECTION_LINE = re.compile(r"^(radius|segment|cone|cone_axis) = .*\n", re.MULTILINE)  # what the shipped ones have

SLIDER_CRANK = """
[model]
name = "slider-crank"
gravity = [0.0, -9.81, 0.0]

[[bodies]]
name = "crank"
mass = 0.2
inertia = [1e-5, 1e-4, 1e-4]
position = [0.0, 0.0, 0.0]

[[bodies]]
name = "rod"
mass = 0.3
inertia = [1e-5, 2e-3, 2e-3]
position = [0.1, 0.0, 0.0]

[[bodies]]
name = "slider"
mass = 0.5
inertia = [1e-4, 1e-4, 1e-4]
position = [0.4, 0.0, 0.0]

[[joints]]
name = "O"
type = "revolute"
body1 = "ground"
body2 = "crank"
at = [0.0, 0.0, 0.0]
axis = [0.0, 0.0, 1.0]
ref = [1.0, 0.0, 0.0]

[[joints]]
name = "A"
type = "revolute"
body1 = "crank"
body2 = "rod"
at = [0.1, 0.0, 0.0]
axis = [0.0, 0.0, 1.0]

[[joints]]
name = "B"
type = "revolute"
body1 = "rod"
body2 = "slider"
at = [0.4, 0.0, 0.0]
axis = [0.0, 0.0, 1.0]

[[joints]]
name = "S"
type = "prismatic"
body1 = "ground"
body2 = "slider"
at = [0.4, 0.0, 0.0]
axis = [1.0, 0.0, 0.0]
ref = [0.0, 1.0, 0.0]
range = [-0.05, 0.01]

[[actuators]]
name = "q"
joint = "O"
range = [-1.0, 1.0]

[assembly]
theta = [0.0]
"""


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _edit(text: str, old: str, new: str, count: int = 1) -> str:
    assert old in text, f"test edit does not apply: {old!r}"
    return text.replace(old, new, count)


def _one_line(capsys, code: int, want_code: int, fragments: list[str]) -> str:
    out, err = capsys.readouterr()
    assert code == want_code, (out, err)
    line = err.strip()
    assert line.startswith("pkrt: error: ") and "\n" not in line and "Traceback" not in err, err
    for f in fragments:
        assert f in line, (f, line)
    return line


# -- the description's fields --------------------------------------------------------------------

CASES = {
    "cone_on_a_revolute": (FIVEBAR, ('name = "P"\ntype = "revolute"', 'name = "P"\ntype = "revolute"\ncone = 0.3'),
                           ["[[joints]] 'P'", "field 'cone'", "a revolute joint has no cone"]),
    "misspelt_cone_axis": (HEXAPOD, ("cone_axis = ", "cone_axiz = "),
                          ["[[joints]] 's1'", "field 'cone_axiz'", "unknown field"]),
    "spherical_cone_needs_its_axis": (HEXAPOD, (re.search(r"cone_axis = .*\n", HEXAPOD).group(0), ""),
                                      ["[[joints]] 's1'", "field 'cone_axis'", "needs its axis"]),
    "cone_too_wide": (HEXAPOD, ("cone = 0.5236", "cone = 3.5"), ["[[joints]] 'u1'", "field 'cone'", "below pi"]),
    "cone_not_a_number": (HEXAPOD, ("cone = 0.5236", 'cone = "wide"'), ["[[joints]] 'u1'", "must be a finite number"]),
    "axis_without_cone": (FIVEBAR, ('name = "P"\ntype = "revolute"', 'name = "P"\ntype = "revolute"\ncone_axis = [0, 0, 1]'),
                          ["[[joints]] 'P'", "field 'cone_axis'", "without 'cone'"]),
    "range_on_a_spherical": (HEXAPOD, ("cone = 0.3142  # rad", "range = [-0.1, 0.1]\ncone = 0.3142  # rad"),
                             ["[[joints]] 's1'", "field 'range'", "a spherical joint has no range"]),
    "range_on_an_actuated_joint": (FIVEBAR, ('name = "A1"\ntype = "revolute"', 'name = "A1"\ntype = "revolute"\nrange = [-1, 1]'),
                                   ["[[joints]] 'A1'", "field 'range'", "actuated (by 'theta1')"]),
    "empty_range": (FIVEBAR, ('name = "P"\ntype = "revolute"', 'name = "P"\ntype = "revolute"\nrange = [0.5, -0.5]'),
                    ["[[joints]] 'P'", "field 'range'", "empty range"]),
    "revolute_range_past_pi": (FIVEBAR, ('name = "P"\ntype = "revolute"', 'name = "P"\ntype = "revolute"\nrange = [-4, 1]'),
                               ["[[joints]] 'P'", "field 'range'", "(-pi, pi)"]),
    "negative_radius": (HEXAPOD, ("radius = 0.035", "radius = -0.035"),
                        ["[[bodies]] 'cylinder1'", "field 'radius'", "must be positive"]),
    "segment_without_radius": (HEXAPOD, ("radius = 0.035  # m: a 70 mm actuator housing\n", ""),
                               ["[[bodies]] 'cylinder1'", "field 'segment'", "without 'radius'"]),
    "segment_of_one_point": (HEXAPOD, ("segment = [[0.471651807134, -0.09672944167, 0.055418729704], ",
                                       "segment = ["), ["[[bodies]] 'cylinder1'", "field 'segment'", "two points"]),
    "no_default_segment": (HEXAPOD, (re.search(r"segment = .*\n", HEXAPOD).group(0), ""),
                           ["[[bodies]] 'cylinder1'", "field 'segment'", "2 joints are at one point"]),
    "protection_over_two_lines": (HEXAPOD, ("segment = [[0.471651807134, -0.09672944167, 0.055418729704], ",
                                            "segment = [[0.471651807134, -0.09672944167, 0.055418729704],\n  "),
                                  ["[[joints]], [[bodies]]", "one line of its own", "content hash"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_protection_field_is_one_line_naming_file_table_and_field(case, tmp_path, capsys):
    text, (old, new), fragments = CASES[case]
    path = _write(tmp_path, f"{case}.toml", _edit(text, old, new))
    _one_line(capsys, main(["model", "check", path]), 2, [path, *fragments])


def test_the_content_hash_leaves_the_protection_lines_out_and_the_shipped_trees_still_load():
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree

    for name in ("delta", "hexapod"):
        text = (MACHINES_DIR / f"{name}.toml").read_text()
        stripped = PROTECTION_LINE.sub("", text)
        assert stripped != text  # the shipped machines do have limits and radii
        have = load_description(name).content_hash
        assert have == hashlib.sha256(stripped.encode()).hexdigest()
        tree = load_controller_tree(load_machine(name))  # the runtime's own check of the shipped tree
        assert tree.header["model"]["content_hash"] == have
    # no protection: the hash is the file's, as before
    assert load_description("fivebar").content_hash == hashlib.sha256((MACHINES_DIR / "fivebar.toml").read_bytes()).hexdigest()


def test_changing_a_limit_keeps_the_hash_changing_a_mass_does_not(tmp_path):
    base = load_description("hexapod").content_hash
    wider = _write(tmp_path, "a.toml", HEXAPOD.replace("cone = 0.3142", "cone = 0.4"))
    assert load_description(wider).content_hash == base
    assert load_description(wider).joints[2].cone == 0.4
    heavier = _write(tmp_path, "b.toml", _edit(HEXAPOD, "mass = 12.0", "mass = 12.5"))
    assert load_description(heavier).content_hash != base


# -- the geometry against independent computations -----------------------------------------------

def test_segment_distance_equals_brute_force_including_points_and_parallel_segments():
    rng = np.random.default_rng(0)
    P = rng.normal(size=(300, 4, 3))
    P[:50, 1] = P[:50, 0]  # a point and a segment
    P[50:100, 3] = P[50:100, 2]
    P[100:130, 1], P[100:130, 3] = P[100:130, 0], P[100:130, 2]  # two points
    P[130:200, 3] = P[130:200, 2] + 0.7 * (P[130:200, 1] - P[130:200, 0])  # parallel
    d = segment_distance(*(np.ascontiguousarray(P[:, i]) for i in range(4)))
    u = np.linspace(0.0, 1.0, 301)[:, None]
    brute = np.array([np.linalg.norm((p[0] + u * (p[1] - p[0]))[:, None] - (p[2] + u * (p[3] - p[2]))[None], axis=-1).min()
                      for p in P])
    assert np.all(d <= brute + 1e-12)  # never more than a sampled distance
    assert np.all(brute - d <= 4e-3 * np.linalg.norm(P[:, 1] - P[:, 0], axis=-1).max())  # the sampling's step


def _rodrigues(k: np.ndarray, a: float) -> np.ndarray:
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(a) * K + (1 - np.cos(a)) * K @ K


def _cardan_bend(a1: np.ndarray, a2: np.ndarray, home: np.ndarray, leg: np.ndarray) -> float:
    """A base cardan's bend from the leg alone: the cylinder turns the leg from ``home`` to
    ``leg`` and keeps its cross axis a2 across the base's a1 (the turn about the leg that does,
    nearest zero); the bend is the angle its shaft a1 x a2 is turned by."""
    k = np.cross(home, leg)
    turn = _rodrigues(k / np.linalg.norm(k), np.arccos(np.clip(home @ leg, -1, 1)))
    v = turn @ a2
    A, B, C = v @ a1, np.cross(leg, v) @ a1, (leg @ v) * (leg @ a1)
    base = np.arctan2(B, A - C)
    psi = min((base + s * np.arccos(np.clip(-C / np.hypot(A - C, B), -1, 1)) for s in (1, -1)),
              key=lambda x: abs((x + np.pi) % (2 * np.pi) - np.pi))
    w = np.cross(a1, a2)
    w /= np.linalg.norm(w)
    return float(np.arccos(np.clip(w @ (_rodrigues(leg, psi) @ turn @ w), -1, 1)))


def test_hexapod_cones_are_the_joints_bends_and_clearances_the_capsules_distance():
    mech = load_mechanism("hexapod")
    kin = TaskKinematics(mech)
    p = compile_passive(mech)
    d = mech.description
    pose = np.array([0.02, -0.01, 0.82, 0.08, -0.05, 0.12])
    cfg, theta, res = kin.solve_pose(pose, mech.ref_config, mech.theta_ref)
    assert res < 1e-12
    m = p.margins(cfg.X[None], cfg.R[None])[0]
    R = rpy_matrix(pose[3:])
    for j in range(1, 7):
        u = next(x for x in d.joints if x.name == f"u{j}")
        s = next(x for x in d.joints if x.name == f"s{j}")
        plat = d.bodies[mech.body_names.index("platform")]
        B = u.point1  # on the ground
        Q = pose[:3] + R @ s.point2  # the platform's ball centre (the platform's frame is the tool's)
        leg = (Q - B) / np.linalg.norm(Q - B)
        home = plat.position + s.point2 - B  # the leg at home (R = identity)
        home /= np.linalg.norm(home)
        a2 = d.bodies[mech.body_names.index(f"cylinder{j}")].rotation @ u.axis2  # world, at home
        tilt_u = _cardan_bend(u.axis1, a2, home, leg)
        tilt_s = np.arccos(np.clip(leg @ (R @ home), -1, 1))  # the piston's axis against the platform's
        assert abs(p.cone_max[p.names.index(f"u{j}")] - m[p.names.index(f"u{j}")] - tilt_u) < 1e-9
        assert abs(p.cone_max[p.names.index(f"s{j}")] - m[p.names.index(f"s{j}")] - tilt_s) < 1e-9
    # a pair: the capsules' segments from the legs' end points, distance by brute force
    i = p.names.index("piston1/piston6")
    ends = []
    for b in ("piston1", "piston6"):
        k = mech.body_names.index(b)
        seg = d.bodies[k].segment - d.bodies[k].com
        ends.append(cfg.X[k] + seg @ cfg.R[k].T)
    u = np.linspace(0, 1, 2001)[:, None]
    a, b = ends[0][0] + u * (ends[0][1] - ends[0][0]), ends[1][0] + u * (ends[1][1] - ends[1][0])
    brute = np.linalg.norm(a[:, None] - b[None], axis=-1).min()
    assert abs(m[i] + 2 * 0.0125 - brute) < 2e-4


def test_delta_ball_joints_measure_the_rods_lean_whatever_the_spin_lock():
    """The Delta's rods spin idly (locked in the model only to be determinate): the ball joint's
    tilt is the rod's lean out of the plane across the stud (axis v), asin(|rod . v|)."""
    mech = load_mechanism("delta")
    check = PathCheck(mech)
    p = check.passive
    names = mech.body_names
    for theta in ([0.3, -0.2, 0.6], [0.7, 0.1, -0.25], [0.0, 0.5, 0.2]):
        c = check.assembler.solve(theta)
        m = p.margins(c.X[None], c.R[None])[0]
        for i in (1, 2, 3):
            ph = np.radians(120 * (i - 1))
            v_arm = c.R[names.index(f"arm{i}")] @ mech.ref_config.R[names.index(f"arm{i}")].T @ np.array(
                [-np.sin(ph), np.cos(ph), 0.0])
            for side in "ab":
                rod = c.R[names.index(f"rod{i}{side}")] @ np.array([1.0, 0.0, 0.0])
                lean = np.arcsin(abs(rod @ v_arm))
                for joint in (f"elbow{i}{side}", f"wrist{i}{side}"):
                    k = p.names.index(joint)
                    assert abs(p.cone_max[k] - m[k] - lean) < 1e-9, (theta, joint)


def test_a_passive_revolute_and_a_passive_prismatic_range(tmp_path, capsys):
    five = load_mechanism(_write(tmp_path, "five.toml", _edit(
        FIVEBAR, 'name = "P"\ntype = "revolute"', 'name = "P"\ntype = "revolute"\nrange = [-0.4, 0.3]')))
    check = PathCheck(five)
    names = five.body_names
    d1, d2 = names.index("distal1"), names.index("distal2")

    def bar_angle(R):
        return np.arctan2(R[1, 0], R[0, 0])

    guess = five.description.bodies  # the joint's zero: the bodies as posed in the file
    ref = bar_angle(guess[d2].rotation) - bar_angle(guess[d1].rotation)
    for theta in ([1.75, 1.3], [2.1, 1.0], [1.9, 1.5]):
        c = check.assembler.solve(theta)
        q = (bar_angle(c.R[d2]) - bar_angle(c.R[d1]) - ref + np.pi) % (2 * np.pi) - np.pi
        assert abs(check.passive.margins(c.X[None], c.R[None])[0, 0] - min(q + 0.4, 0.3 - q)) < 1e-9

    sc = load_mechanism(_write(tmp_path, "sc.toml", SLIDER_CRANK))
    check = PathCheck(sc)
    xs0 = 0.1 + 0.3
    for q in (-0.8, -0.3, 0.5, 0.9):
        c = check.assembler.solve([q])
        xs = 0.1 * np.cos(q) + np.sqrt(0.09 - (0.1 * np.sin(q)) ** 2)  # the slider, closed form
        assert abs(check.passive.margins(c.X[None], c.R[None])[0, 0] - min(xs - xs0 + 0.05, 0.01 - (xs - xs0))) < 1e-9
    # the slider's range ends 5 cm in: the crank may turn about 0.95 rad
    v = check.first_violation(np.linspace(0.0, 1.0, 101)[:, None])
    assert v is not None and 0.9 < v[0] / 100 < 1.0 and check.passive.names[v[1]] == "S"
    assert main(["model", "check", _write(tmp_path, "bad.toml", SLIDER_CRANK.replace("[-0.05, 0.01]", "[0.01, 0.05]"))]) == 1
    out, err = capsys.readouterr()
    assert "FAILED: the reference pose is beyond a limit" in out
    assert "pkrt: error: slider-crank: at the reference pose joint S outside its range [0.01, 0.05] m" in err


def test_model_check_reports_the_margins_at_the_reference(capsys):
    assert main(["model", "check", "delta"]) == 0
    out = capsys.readouterr().out
    assert "passive-joint limits 12 cone(s), 0 range(s); capsule pairs 30" in out
    assert "closest pair at the reference: bodies rod1b and rod2a are apart: clearance 20.6 mm" in out
    assert main(["model", "check", "hexapod", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["protection"]
    assert r["inside"] and len(r["items"]) == 12 + 60
    assert r["closest_pair"]["name"] in ("piston4/piston5", "piston1/piston6", "piston2/piston3")
    assert abs(r["closest_pair"]["margin"] - 0.1098) < 1e-3
    assert main(["model", "check", "orthoglide"]) == 0
    assert "passive-joint limits and capsules: none declared" in capsys.readouterr().out


# -- planners refuse before motion -------------------------------------------------------------------

def test_gcode_past_a_ball_joint_cone_is_refused_with_its_line_and_a_program_inside_is_planned(tmp_path, capsys):
    prog = _write(tmp_path, "p.ngc", "G21 G90\nG1 Z-60 F6000\nG1 X-100\nG1 X-330\nG1 X0 Z0\nM2\n")
    line = _one_line(capsys, main(["plan", prog, "--machine", "delta", "--json"]), 2,
                     [prog, "line 4: at t = ", "joint wrist", "tilted", "its cone 0.3142 rad (18.0 deg)"])
    assert "trajectory refused" in line
    ok = _write(tmp_path, "q.ngc", "G21 G90\nG1 Z-60 F6000\nG1 X-100\nG1 X0 Z0\nM2\n")
    assert main(["plan", ok, "--machine", "delta", "--json"]) == 0
    capsys.readouterr()


def _hexapod_machine(tmp_path: Path, model_text: str) -> str:
    """hexapod-sim with another description of the same dynamics (the shipped trees, by path)."""
    model = _write(tmp_path, "hexapod-x.toml", model_text)
    cfg = (MACHINES_DIR / "hexapod-sim.toml").read_text()
    cfg = _edit(cfg, 'model = "hexapod"', f'model = "{model}"')
    cfg = _edit(cfg, 'tree = "hexapod.pkt"', f'tree = "{MACHINES_DIR / "hexapod.pkt"}"')
    return _write(tmp_path, "hexapod-x-sim.toml", cfg)


def test_hexapod_paths_that_tilt_a_ball_joint_or_make_two_legs_touch_are_refused(tmp_path, capsys):
    # the platform turned: the actuators stay in range, the platform's ball joints pass 18 deg
    yaw = _write(tmp_path, "yaw.csv", "x,y,z,roll,pitch,yaw\n0,0,0.8,0,0,0\n0,0,0.8,0,0,0.2\n0,0,0.8,0,0,0.4\n"
                                      "0,0,0.8,0,0,0.57\n")
    _one_line(capsys, main(["plan", yaw, "--machine", "hexapod", "--json"]), 2,
              [yaw, "trajectory refused: at t = ", "joint s", "its cone 0.3142 rad (18.0 deg)"])
    inside = _write(tmp_path, "in.csv", "x,y,z,roll,pitch,yaw\n0,0,0.8,0,0,0\n0,0,0.8,0,0,0.2\n0,0,0.8,0,0,0.4\n")
    assert main(["plan", inside, "--machine", "hexapod", "--json"]) == 0
    capsys.readouterr()
    # legs 4 and 5 with 134 mm pistons: 1.2 mm apart at home, they touch when both legs lengthen
    fat = re.sub(r'(name = "piston[45]"\n)radius = 0.0125', r"\1radius = 0.0668", HEXAPOD)
    machine = _hexapod_machine(tmp_path, fat)
    names = ",".join(f"l{i}" for i in range(1, 7))
    touch = _write(tmp_path, "touch.csv", f"{names}\n0,0,0,0,0,0\n0,0,0,0.035,0.035,0\n0,0,0,0.07,0.07,0\n")
    _one_line(capsys, main(["plan", touch, "--machine", machine, "--json"]), 2,
              [touch, "bodies piston4 and piston5 touch: clearance -"])
    apart = _write(tmp_path, "apart.csv", f"{names}\n0,0,0,0,0,0\n0,0,0,-0.035,-0.035,0\n0,0,0,-0.07,-0.07,0\n")
    assert main(["plan", apart, "--machine", machine, "--json"]) == 0
    capsys.readouterr()


def test_run_refuses_an_actuator_trajectory_past_a_cone_before_anything_moves(tmp_path, capsys):
    traj = _write(tmp_path, "t.csv", "t,theta1,theta2,theta3\n0,0,0,0\n1,0.45,0,0\n2,0.9,0,0\n3,0,0,0\n")
    log = tmp_path / "run.pktlog"
    _one_line(capsys, main(["run", "--machine", "delta", "--traj", traj, "--lockstep", "--log", str(log)]), 2,
              ["trajectory refused: at t = 1.", "joint wrist", "its cone 0.3142 rad"])
    assert not log.exists()  # refused before the loop: no log


def test_hil_refuses_the_same_trajectory_before_its_drives_move(tmp_path):
    """``pkrt hil --traj`` plans its reference as ``pkrt run`` does, and checks it the same way."""
    from pkrt.rt.app.hil import reference_of
    from pkrt.rt.core.errors import UserError
    from pkrt.rt.runtime.machine.config import load_machine

    traj = _write(tmp_path, "t.csv", "t,theta1,theta2,theta3\n0,0,0,0\n1,0.45,0,0\n2,0.9,0,0\n3,0,0,0\n")
    with pytest.raises(UserError, match=r"trajectory refused: at t = 1\.\d+ s joint wrist.* its cone"):
        reference_of(traj=traj)(load_machine("delta-can"))
