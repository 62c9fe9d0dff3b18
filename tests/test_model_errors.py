"""Bad machine descriptions through ``pkrt model check``: one clear line, exit code 2.

Each bad file is written into tmp_path from a good built-in description with a small edit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkrt.models.kinematics.description import MACHINES_DIR, ModelError
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.rt.cli import main

FOURBAR = (MACHINES_DIR / "fourbar.toml").read_text()
ORTHOGLIDE = (MACHINES_DIR / "orthoglide.toml").read_text()
DELTA = (MACHINES_DIR / "delta.toml").read_text()


def _edit(text: str, old: str, new: str, count: int = 1) -> str:
    assert old in text, f"test edit does not apply: {old!r}"
    return text.replace(old, new, count)


def _drop_last_actuator(text: str) -> str:
    i = text.index('[[actuators]]\nname = "q3"')
    j = text.index("[assembly]")
    k = text.index("# the tool")  # 3 task coordinates would not fit 2 actuators: dropped too
    return _edit(text[:i] + text[j:k], "theta = [0.0, 0.0, 0.0]", "theta = [0.0, 0.0]")


# name -> (file text, fragments the one-line message must contain)
CASES = {
    "unknown_joint_type": (
        _edit(FOURBAR, 'type = "revolute"', 'type = "hinge"'),
        ["[[joints]] 'O'", "field 'type'", "unknown joint type 'hinge'", "revolute"]),
    "missing_mass": (
        _edit(FOURBAR, "mass = 0.30\n", ""),
        ["[[bodies]] 'input'", "field 'mass'", "missing"]),
    "zero_mass": (
        _edit(FOURBAR, "mass = 0.30", "mass = 0.0"),
        ["[[bodies]] 'input'", "field 'mass'", "must be positive"]),
    "negative_mass": (
        _edit(FOURBAR, "mass = 0.45", "mass = -1"),
        ["[[bodies]] 'coupler'", "field 'mass'", "must be positive"]),
    "mass_wrong_type": (
        _edit(FOURBAR, "mass = 0.45", 'mass = "heavy"'),
        ["[[bodies]] 'coupler'", "field 'mass'", "must be a finite number", "'heavy'"]),
    "inertia_not_symmetric": (
        _edit(FOURBAR, "inertia = [1e-5, 0.00025, 0.00025]",
              "inertia = [[1e-5, 1e-4, 0.0], [0.0, 0.00025, 0.0], [0.0, 0.0, 0.00025]]"),
        ["[[bodies]] 'input'", "field 'inertia'", "not symmetric"]),
    "inertia_not_positive_semidefinite": (
        _edit(FOURBAR, "inertia = [1e-5, 0.00025, 0.00025]", "inertia = [1e-5, -0.00025, 0.00025]"),
        ["[[bodies]] 'input'", "field 'inertia'", "not positive semidefinite", "eigenvalues"]),
    "inertia_not_physical": (
        _edit(FOURBAR, "inertia = [1e-5, 0.00025, 0.00025]", "inertia = [0.0, 0.00025, 0.0001]"),
        ["[[bodies]] 'input'", "field 'inertia'", "triangle inequality"]),
    "inertia_wrong_type": (
        _edit(FOURBAR, "inertia = [1e-5, 0.00025, 0.00025]", 'inertia = "abc"'),
        ["[[bodies]] 'input'", "field 'inertia'", "3 principal moments or a 3x3 matrix"]),
    "joint_unknown_body": (
        _edit(FOURBAR, 'body2 = "output"', 'body2 = "outptu"'),
        ["[[joints]] 'C'", "field 'body2'", "no body named 'outptu'"]),
    "empty_range": (
        _edit(FOURBAR, "range = [-1.75, 1.75]", "range = [1.0, 1.0]"),
        ["[[actuators]] 'theta'", "field 'range'", "empty range"]),
    "reversed_range": (
        _edit(FOURBAR, "range = [-1.75, 1.75]", "range = [1.75, -1.75]"),
        ["[[actuators]] 'theta'", "field 'range'", "empty range"]),
    "range_wrong_type": (
        _edit(FOURBAR, "range = [-1.75, 1.75]", 'range = ["a", 1.75]'),
        ["[[actuators]] 'theta'", "field 'range'", "list of 2 numbers"]),
    # spherical joints at C and Q let the output link spin about the line QC: mobility 2
    "mobility_above_actuators": (
        _edit(_edit(FOURBAR, 'name = "Q"\ntype = "revolute"', 'name = "Q"\ntype = "spherical"'),
              'name = "C"\ntype = "revolute"', 'name = "C"\ntype = "spherical"'),
        ["[[actuators]]", "mobility is 2 but 1 actuator(s)",
         "rank analysis: 18 coordinates, 16 constraint rows of rank 16, 0 redundant"]),
    # actuating Q as well: the four-bar has one degree of freedom, not two
    "mobility_below_actuators": (
        _edit(_edit(FOURBAR, "[assembly]",
                    '[[actuators]]\nname = "phi"\njoint = "Q"\nrange = [-1.0, 1.0]\n\n[assembly]'),
              "theta = [0.0]", "theta = [0.0, 0.0]"),
        ["[[actuators]]", "mobility is 1 but 2 actuator(s)",
         "20 constraint rows of rank 17, 3 redundant"]),
    "orthoglide_actuator_missing": (
        _drop_last_actuator(ORTHOGLIDE),
        ["[[actuators]]", "mobility is 3 but 2 actuator(s)", "42 coordinates, 39 constraint rows of rank 39"]),
    # ground pivot Q moved to x = 0.5: |A - Q| = 0.4 > b + c, the loop cannot close
    "guess_cannot_be_assembled": (
        _edit(FOURBAR, "point1 = [0.2, 0.0, 0.0]", "point1 = [0.5, 0.0, 0.0]"),
        ["[assembly]", "cannot be assembled", "residual", "smallest singular value"]),
    "orthoglide_guess_out_of_reach": (
        _edit(ORTHOGLIDE, "theta = [0.0, 0.0, 0.0]", "theta = [0.3, 0.3, 0.3]"),
        ["[assembly]", "cannot be assembled at theta = [0.3, 0.3, 0.3]", "residual"]),
    # numbers that would overflow the assembly are refused where they are read (magnitude at
    # most 1e12: no numpy warning, the field named)
    "absurd_pose": (
        _edit(FOURBAR, "position = [0.05, 0.0, 0.0]", "position = [1e300, 0.0, 0.0]"),
        ["[[bodies]] 'input'", "field 'position'", "magnitude at most 1e+12", "got [1e+300, 0.0, 0.0]"]),
    "absurd_but_readable_pose": (
        _edit(FOURBAR, "position = [0.05, 0.0, 0.0]", "position = [1e12, 0.0, 0.0]"),
        ["[assembly]", "cannot be assembled"]),
    # a large axis is still a direction: here it tilts O's axis
    "large_axis": (
        _edit(FOURBAR, "axis1 = [0.0, 0.0, 1.0]\nref1", "axis1 = [1e12, 1e12, 0.0]\nref1"),
        ["[[actuators]]", "mobility is 0 but 1 actuator(s)", "rank 18"]),
    "overflowing_axis": (
        _edit(FOURBAR, "axis1 = [0.0, 0.0, 1.0]\nref1", "axis1 = [1e308, 1e308, 0.0]\nref1"),
        ["[[joints]] 'O'", "field 'axis1'", "magnitude at most 1e+12"]),
    "invalid_toml": (
        _edit(FOURBAR, "[model]", "[model"),
        ["not a valid TOML file", "line 7"]),
    "model_table_missing": (
        _edit(FOURBAR, "[model]", "[modle]"),
        ["[model]", "table missing"]),
    "gravity_wrong_type": (
        _edit(FOURBAR, "gravity = [0.0, -9.81, 0.0]", "gravity = 9.81"),
        ["[model]", "field 'gravity'", "list of 3 numbers"]),
    "point_wrong_type": (
        _edit(FOURBAR, "point1 = [0.05, 0.0, 0.0]", 'point1 = "here"'),
        ["[[joints]] 'A'", "field 'point1'", "list of 3 numbers"]),
    "body_name_wrong_type": (
        _edit(FOURBAR, 'name = "coupler"', "name = 3"),
        ["[[bodies]] '#2'", "field 'name'", "non-empty string"]),
    "actuators_not_array": (
        _edit(FOURBAR, "[[actuators]]", "[actuators]"),
        ["[[actuators]]", "array of tables"]),
    "assembly_theta_wrong_length": (
        _edit(FOURBAR, "theta = [0.0]", "theta = [0.0, 1.0]"),
        ["[assembly]", "field 'theta'", "list of 1 numbers"]),
    # a rod with inertia about its own axis: its spin is not idle, it cannot be locked
    "idle_motion_with_inertia": (
        _edit(DELTA, "inertia = [0.0, 0.005333333333333333", "inertia = [1e-6, 0.005333333333333333"),
        ["[[actuators]]", "mobility is 9 but 3 actuator(s)", "body 'rod1a'", "has inertia",
         "needs zero inertia about its axis"]),
    "tool_unknown_body": (
        _edit(DELTA, 'body = "platform"\npoint', 'body = "plate"\npoint'),
        ["[tool]", "field 'body'", "no body named 'plate'"]),
    "tool_too_few_coordinates": (
        _edit(DELTA, 'coordinates = ["x", "y", "z"]', 'coordinates = ["x", "y"]'),
        ["[tool]", "field 'coordinates'", "2 task coordinate(s) (x, y) for 3 actuator(s)"]),
    "tool_unknown_coordinate": (
        _edit(DELTA, 'coordinates = ["x", "y", "z"]', 'coordinates = ["x", "y", "w"]'),
        ["[tool]", "field 'coordinates'", "unknown coordinate 'w'"]),
    "tool_partial_orientation": (
        _edit(DELTA, 'coordinates = ["x", "y", "z"]', 'coordinates = ["x", "y", "yaw"]'),
        ["[tool]", "field 'coordinates'", "needs all of roll, pitch, yaw"]),
    "tool_point_wrong_type": (
        _edit(DELTA, "point = [0.0, 0.0, 0.0]", 'point = "centre"'),
        ["[tool]", "field 'point'", "list of 3 numbers"]),
    "tool_not_a_table": (
        _edit(_edit(DELTA, "[tool]", "[other]"), "[model]", "tool = 3\n\n[model]"),
        ["[tool]", "must be a table"]),
    "zero_axis": (
        _edit(FOURBAR, "axis1 = [0.0, 0.0, 1.0]\nref1", "axis1 = [0.0, 0.0, 0.0]\nref1"),
        ["[[joints]] 'O'", "field 'axis1'", "non-zero vector"]),
}


def _check_one_line_error(capsys, code: int, fragments: list[str], path: Path) -> None:
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"pkrt: error: {path}: "), line
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in line, f"{frag!r} not in {line!r}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_description_cli(case, tmp_path, capsys):
    text, fragments = CASES[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    _check_one_line_error(capsys, main(["model", "check", str(path)]), fragments, path)


def test_good_descriptions_pass(capsys):
    for name in ("fourbar", "fivebar", "orthoglide", "delta", "hexapod"):
        assert main(["model", "check", name]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("  ok") == 5


def test_missing_file(tmp_path, capsys):
    path = tmp_path / "nowhere.toml"
    _check_one_line_error(capsys, main(["model", "check", str(path)]), ["no such file"], path)


def test_unknown_builtin_name(capsys):
    assert main(["model", "check", "sixbar"]) == 2
    _, err = capsys.readouterr()
    assert err.strip() == ("pkrt: error: sixbar: no such model file or built-in model "
                           "(built-in: delta, fivebar, fourbar, hexapod, orthoglide)")


def test_not_utf8(tmp_path, capsys):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe\x00abc")
    _check_one_line_error(capsys, main(["model", "check", str(path)]), ["this is a binary file"], path)


def test_subprocess_exit_code_and_message(tmp_path):
    """The installed entry point, in a fresh process: exit 2, one line, no traceback."""
    text, fragments = CASES["unknown_joint_type"]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "model", "check", str(path)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pkrt: error: {path}: ")
    for frag in fragments:
        assert frag in lines[0]


def test_subprocess_json_good_model():
    p = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "model", "check", "fourbar", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    import json

    r = json.loads(p.stdout)
    assert (r["coordinates"], r["constraints"], r["redundant_constraints"], r["mobility"]) == (18, 20, 3, 1)


# -- property: any edit of a field gives a model or one ModelError, nothing else (no warning) --

_VALUE_LINES = [i for i, line in enumerate(FOURBAR.splitlines())
                if "=" in line and not line.lstrip().startswith("#")]

_toml_scalars = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(
        lambda x: "nan" if x != x else ("inf" if x == float("inf") else ("-inf" if x == -float("inf") else repr(x)))),
    st.sampled_from(['"ground"', '"input"', '"coupler"', '"revolute"', '"fixed"', '"spherical"',
                     '"prismatic"', '"universal"', '""', '"O"', '"Q"', "true", "false"]),
)
_toml_values = st.recursive(
    _toml_scalars, lambda inner: st.lists(inner, max_size=4).map(lambda v: "[" + ", ".join(v) + "]"),
    max_leaves=10)


def _write_edited(tmp_path, text: str, line: int, value: str):
    """The description with line ``line``'s value replaced by ``value``: (path, key)."""
    lines = text.splitlines()
    key = lines[line].split("=", 1)[0]
    lines[line] = f"{key}= {value}"
    path = tmp_path / "fuzz.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, key


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=st.sampled_from(_VALUE_LINES), value=_toml_values)
def test_any_field_edit_loads_or_fails_cleanly(tmp_path, line, value):
    path, _ = _write_edited(tmp_path, FOURBAR, line, value)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning would be a second line on stderr
            mech = load_mechanism(str(path))
    except ModelError as e:
        msg = str(e)
        assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
    else:
        assert mech.n_coords - len(mech.independent) == mech.n_act


@pytest.mark.parametrize("guess", ["2.5", "3.141592653589793", "-2.8"])
def test_assembly_guess_on_the_antipodal_solution_of_an_actuated_angle(guess, tmp_path, capsys):
    """The actuated-angle row is sin(alpha - theta) = 0, also met by alpha = theta + pi: a guess
    theta far from the body poses must not assemble the crank half a turn away (it did, and
    'model check' reported the mechanism assembled at that theta)."""
    path = tmp_path / "flipped.toml"
    path.write_text(_edit(FOURBAR, "theta = [0.0]", f"theta = [{guess}]"))
    _check_one_line_error(capsys, main(["model", "check", str(path)]), ["[assembly]", "half a turn"], path)


FIVEBAR = (MACHINES_DIR / "fivebar.toml").read_text()
_TOOL_LINES = [i for i, line in enumerate(FIVEBAR.splitlines())
               if "=" in line and i > FIVEBAR.splitlines().index("[tool]")]
_tool_scalars = st.one_of(_toml_scalars, st.sampled_from(['"x"', '"y"', '"z"', '"roll"', '"pitch"', '"yaw"',
                                                          '"distal1"', '"proximal2"', '"w"']))
_tool_values = st.recursive(
    _tool_scalars, lambda inner: st.lists(inner, max_size=7).map(lambda v: "[" + ", ".join(v) + "]"),
    max_leaves=10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=st.sampled_from(_TOOL_LINES), value=_tool_values)
def test_any_tool_edit_loads_or_fails_cleanly(tmp_path, line, value):
    """[tool] fields: a valid tool or one ModelError naming [tool] and the field."""
    from pkrt.models.kinematics.description import load_description

    path, key = _write_edited(tmp_path, FIVEBAR, line, value)
    try:
        tool = load_description(str(path)).tool
    except ModelError as e:
        msg = str(e)
        assert msg.startswith(f"{path}: [tool], field '{key.strip()}'") and "\n" not in msg, msg
    else:
        assert len(tool.coordinates) == 2 and tool.point.shape == (3,) and np.all(np.isfinite(tool.point))
