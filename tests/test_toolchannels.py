"""Tool channels (issue 10): the tool's task coordinates of the logged reference (``tool_ref``)
and measured positions (``tool``), computed after the run from the model the log names, in the
run's plot, ``pkrt log plot`` and the CSV and MCAP exports. Checked against the task-space path
the reference was planned from and the Orthoglide's closed-form forward kinematics; a log whose
model file is missing or changed, a NaN row, a 6-DOF tool and a machine without a tool."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil

import jsonschema
import numpy as np
import pytest

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.taskspace import TaskKinematics, circle
from pkrt.rt.cli import main
from pkrt.rt.app.toolchannels import tool_channels, tool_error
from pkrt.rt.runtime.machine.config import MACHINES_DIR
from pkrt.rt.runtime.record.logfile import LogWriter, read_log
from tests.orthoglide_oracle import orthoglide_fk
from tests.test_delta_hexapod import HOME
from tests.test_mcapexport import read_mcap

RATE = 1000.0
L_ORTHOGLIDE = 0.31  # m, leg length (shared/reference-models.md)
BASE_COLUMNS = ["cycle", "t [s]"]


def _write_task_csv(path, task) -> None:
    """A task-space trajectory file ``t,x,y,z`` sampled on the loop's grid (the run's spline
    passes through every sample)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "x", "y", "z"])
        for k, p in enumerate(task.pos):
            w.writerow([repr(k / RATE)] + [repr(float(v)) for v in p])


def _orthoglide_circle():
    """A 20 mm circle about the Orthoglide's reference tool pose in 0.5 s (at rest at both ends)."""
    mech = load_mechanism("orthoglide")
    home = TaskKinematics(mech).forward(mech.theta_ref)[0]
    return circle(home, 0.02, 0.5, RATE, normal=(1, 1, 1))


def _run(capsys, *args) -> tuple[int, dict]:
    code = main(["run", "--lockstep", "--no-rt", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _csv(path) -> tuple[list[str], np.ndarray]:
    with open(path) as f:
        rows = list(csv.reader(f))
    return rows[0], np.array([[float(v) for v in r] for r in rows[1:]])


@pytest.fixture(scope="module")
def orthoglide_run(tmp_path_factory):
    """A lockstep run of the Orthoglide along a task-space circle, through ``pkrt run``."""
    d = tmp_path_factory.mktemp("tool")
    task = _orthoglide_circle()
    _write_task_csv(d / "circle.csv", task)
    log = d / "run.pktlog"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", "--lockstep", "--no-rt", "--json", "--traj", str(d / "circle.csv"), "--log", str(log)])
    return d, log, task, code, json.loads(out.getvalue())


def test_channels_of_a_lockstep_run_are_the_planned_path_and_the_closed_form(orthoglide_run, capsys):
    d, log, task, code, summary = orthoglide_run
    assert code == 0
    data, info = tool_channels(read_log(log))
    assert info["note"] is None and info["channels"] == ["tool_ref", "tool"] and info["coordinates"] == ["x", "y", "z"]
    ref, act = data.get("tool_ref"), data.get("tool")
    assert data.n_cycles == task.n and ref.shape == act.shape == (task.n, 3)
    # the reference's tool path is the task path it was planned from
    assert np.abs(ref - task.pos).max() < 1e-9
    # the measured positions' tool path is the closed-form forward kinematics of the reference
    pos = data.get("pos")
    closed = np.array([orthoglide_fk(p, L_ORTHOGLIDE) for p in pos])
    assert np.abs(act - closed).max() < 1e-9
    assert 0 < np.abs(act - ref).max() < 1e-3  # the tracking error is there, and small
    # the run's summary: the tool error from these channels, and the plot written
    e = np.linalg.norm(closed - task.pos, axis=1)
    assert abs(summary["tool_error"]["max_m"] - e.max()) < 1e-9
    assert summary["tool_error"]["samples"] == task.n and summary["tool_channels"]["note"] is None
    assert summary["plot"] and (d / "run.png").stat().st_size > 0


def test_log_plot_has_the_tool_panels(orthoglide_run, tmp_path, capsys):
    _, log, _, _, _ = orthoglide_run
    out = tmp_path / "p.png"
    assert main(["log", "plot", str(log), "-o", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    r = json.loads(cap.out)
    assert r["tool_channels"]["channels"] == ["tool_ref", "tool"] and cap.err == ""
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[:2] == (1000, 1600)


def test_csv_and_mcap_exports_hold_the_tool_channels(orthoglide_run, tmp_path, capsys):
    _, log, task, _, _ = orthoglide_run
    out_csv, out_mcap = tmp_path / "r.csv", tmp_path / "r.mcap"
    assert main(["log", "export", str(log), "--csv", str(out_csv), "--mcap", str(out_mcap)]) == 0
    assert capsys.readouterr().err == ""
    data, _ = tool_channels(read_log(log))
    names, rows = _csv(out_csv)
    tool_cols = [f"tool_ref_{c} [m]" for c in "xyz"] + [f"tool_{c} [m]" for c in "xyz"]
    assert names[-6:] == tool_cols
    assert np.array_equal(rows[:, -6:], np.hstack([data.get("tool_ref"), data.get("tool")]))  # repr: exact
    assert np.abs(rows[:, -6:-3] - task.pos).max() < 1e-9
    _, msgs, schemas, _, _ = read_mcap(out_mcap)
    tool = msgs["/pkrt/tool"]
    assert len(tool) == task.n
    for m in tool[::50]:
        jsonschema.validate(m, schemas["/pkrt/tool"])
    got = {f: np.array([[m[f][c] for c in "xyz"] for m in tool]) for f in ("reference", "position", "error")}
    assert np.abs(got["reference"] - task.pos).max() < 1e-9
    assert np.allclose(got["position"], data.get("tool"), rtol=1e-15, atol=0)
    assert np.allclose(got["error"], got["reference"] - got["position"], rtol=0, atol=1e-15)
    assert schemas["/pkrt/tool"]["properties"]["reference"]["description"].endswith("[m]")


def test_a_nan_row_gives_nan_tool_values(tmp_path, capsys):
    """A NaN reading (the simulated plant's fault): that row's tool is NaN, the rest finite; the
    run still writes its plot, the exports work."""
    task = _orthoglide_circle()
    _write_task_csv(tmp_path / "c.csv", task)
    log = tmp_path / "nan.pktlog"
    code, r = _run(capsys, "--traj", str(tmp_path / "c.csv"), "--log", str(log), "--inject", "nan@0.1")
    assert code == 1 and r["fault"] and r["plot"]
    data, info = tool_channels(read_log(log))
    bad = ~np.all(np.isfinite(data.get("pos")), axis=1)
    assert bad.any() and info["note"] is None
    assert np.all(np.isnan(data.get("tool")[bad])) and np.all(np.isfinite(data.get("tool")[~bad]))
    assert np.all(np.isfinite(data.get("tool_ref")))
    assert r["tool_error"]["samples"] == int((~bad).sum())
    assert main(["log", "export", str(log), "--csv", str(tmp_path / "n.csv"), "--mcap", str(tmp_path / "n.mcap")]) == 0
    names, rows = _csv(tmp_path / "n.csv")
    assert np.all(np.isnan(rows[bad][:, names.index("tool_x [m]")]))
    _, msgs, _, _, _ = read_mcap(tmp_path / "n.mcap")
    assert msgs["/pkrt/tool"][int(np.argmax(bad))]["position"]["x"] is None


def _own_orthoglide(tmp_path) -> tuple:
    """The Orthoglide configuration with its own copy of the model file (same bytes)."""
    model = tmp_path / "my-orthoglide.toml"
    shutil.copy(MACHINES_DIR / "orthoglide.toml", model)
    text = (MACHINES_DIR / "orthoglide-sim.toml").read_text()
    text = text.replace('model = "orthoglide"', 'model = "my-orthoglide.toml"')
    for name in ("orthoglide.pkt", "orthoglide-plant.pkt"):
        text = text.replace(f'"{name}"', f'"{MACHINES_DIR / name}"')
    config = tmp_path / "my.toml"
    config.write_text(text)
    return config, model


@pytest.mark.parametrize("damage,why", [
    (lambda m: m.write_text(m.read_text() + "\n# edited after the run\n"), "has changed since the run"),
    (lambda m: m.unlink(), "is not there"),
])
def test_a_missing_or_changed_model_is_a_note_and_the_rest_exports(tmp_path, capsys, damage, why):
    config, model = _own_orthoglide(tmp_path)
    task = _orthoglide_circle()
    _write_task_csv(tmp_path / "c.csv", task)
    log = tmp_path / "r.pktlog"
    code, r = _run(capsys, "--machine", str(config), "--traj", str(tmp_path / "c.csv"), "--log", str(log),
                   "--duration", "0.05")
    assert code == 0 and r["tool_channels"]["channels"] == ["tool_ref", "tool"]
    damage(model)
    out = tmp_path / "p.png"
    assert main(["log", "plot", str(log), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pkrt: note: ") and why in err and "Traceback" not in err
    assert out.stat().st_size > 0
    assert main(["log", "export", str(log), "--csv", str(tmp_path / "x.csv"), "--mcap", str(tmp_path / "x.mcap"),
                 "--json"]) == 0
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and why in cap.err
    assert why in json.loads(cap.out)["tool_channels"]["note"]
    names, rows = _csv(tmp_path / "x.csv")
    assert not any(n.startswith("tool") for n in names) and names[:2] == BASE_COLUMNS and "pos_q1 [m]" in names
    assert len(rows) == read_log(log).n_cycles
    _, msgs, _, _, _ = read_mcap(tmp_path / "x.mcap")
    assert "/pkrt/tool" not in msgs and "/pkrt/measured" in msgs


def test_a_machine_without_a_tool_is_unchanged(tmp_path, capsys):
    """The four-bar (one crank, no [tool]): no tool channels, no note, the same CSV columns."""
    shutil.copy(MACHINES_DIR / "fourbar.pkt", tmp_path / "plant.pkt")  # the plant's tree: a copy
    (tmp_path / "fb.toml").write_text(f"""
[machine]
name = "fourbar-sim"
model = "{MACHINES_DIR / 'fourbar.toml'}"
tree = "{MACHINES_DIR / 'fourbar.pkt'}"
rate_hz = 1000.0

[controller]
kind = "ct"
bandwidth_hz = 8.0
tau_max = 50.0

[limits]
velocity = 10.0
acceleration = 1000.0
following_error = 0.5

[drives]
backend = "sim"
plant_tree = "plant.pkt"
""")
    with open(tmp_path / "fb.csv", "w") as f:
        f.write("t,theta\n" + "".join(f"{k / RATE!r},{0.2 * (k / 100) ** 2 * (3 - 2 * k / 100)!r}\n"
                                      for k in range(101)))
    log = tmp_path / "fb.pktlog"
    code, r = _run(capsys, "--machine", str(tmp_path / "fb.toml"), "--traj", str(tmp_path / "fb.csv"),
                   "--log", str(log))
    assert code == 0 and r["tool_channels"] == {"channels": [], "coordinates": [], "rows": r["cycles"],
                                                "seconds": 0.0, "note": None}
    assert r["tool_error"] is None and r["plot"]
    assert main(["log", "export", str(log), "--csv", str(tmp_path / "fb-out.csv")]) == 0
    assert capsys.readouterr().err == ""
    names, _ = _csv(tmp_path / "fb-out.csv")
    assert names == ["cycle", "t [s]", "ref_pos [rad]", "ref_vel [rad/s]", "ref_acc [rad/s^2]", "pos [rad]",
                     "vel [rad/s]", "tau [N m]", "tau_model [N m]", "wake_us [us]", "compute_us [us]", "flags [bits]"]


ANGLES = ["roll", "pitch", "yaw"]


@pytest.mark.parametrize("name,task", [
    ("hexapod", circle(HOME, 0.03, 0.15, RATE, tilt=0.05)),
    ("fivebar", circle([0.0, 0.305], 0.015, 0.15, RATE)),
])
def test_six_dof_and_planar_tools_from_a_log(tmp_path, name, task):
    """The hexapod's tool (x, y, z in m; roll, pitch, yaw in rad) and the five-bar's (x, y)
    from a log naming the model: the reference channel is the planned circle (the hexapod's
    with its tilt); the CSV columns and MCAP keys are the coordinates with their units; a NaN
    row gives NaN; the plot draws the path (3-D or planar)."""
    model = MACHINES_DIR / f"{name}.toml"
    mech = load_mechanism(str(model))
    coords = ["x", "y", "z"] + ANGLES if name == "hexapod" else ["x", "y"]
    units = {c: "rad" if c in ANGLES else "m" for c in coords}
    plan = TaskKinematics(mech).plan(task)
    s = mech.n_act
    header = {"machine": {"machine": {"name": f"{name}-test", "model": str(model)}},
              "machine_path": str(tmp_path / "gone.toml"), "model_name": name,
              "model_hash": mech.content_hash, "rate_hz": RATE,
              "axes": list(mech.actuator_names)}
    u = mech.actuator_units[0]
    w = LogWriter(tmp_path / "h.pktlog", header, [("t", 1, "s"), ("ref_pos", s, u), ("pos", s, u)], 32)
    for k in range(plan.n):
        w.row[:] = np.concatenate([[k / RATE], plan.pos[k], np.full(s, np.nan) if k == 60 else plan.pos[k]])
        w.commit()
    w.close({})
    data, info = tool_channels(read_log(tmp_path / "h.pktlog"))
    assert info["coordinates"] == coords and info["note"] is None
    assert np.abs(data.get("tool_ref") - task.pos).max() < 1e-9
    act = data.get("tool")
    assert np.all(np.isnan(act[60])) and np.abs(np.delete(act, 60, 0) - np.delete(task.pos, 60, 0)).max() < 1e-9
    assert tool_error(data)["samples"] == plan.n - 1 and tool_error(data)["max_m"] < 1e-9
    assert main(["log", "export", str(tmp_path / "h.pktlog"), "--csv", str(tmp_path / "h.csv"),
                 "--mcap", str(tmp_path / "h.mcap")]) == 0
    names, _ = _csv(tmp_path / "h.csv")
    assert names[-len(coords):] == [f"tool_{c} [{units[c]}]" for c in coords]
    _, msgs, _, _, _ = read_mcap(tmp_path / "h.mcap")
    m = msgs["/pkrt/tool"][10]
    assert list(m["reference"]) == coords
    assert max(abs(m["reference"][c] - task.pos[10, i]) for i, c in enumerate(coords)) < 1e-9
    assert main(["log", "plot", str(tmp_path / "h.pktlog"), "-o", str(tmp_path / "h.png")]) == 0


def test_a_long_run_leaves_its_tool_channels_to_the_log_commands(tmp_path, capsys, monkeypatch):
    """``pkrt run`` computes the tool channels after the run only for a log of at most
    ``TOOL_ROWS_AFTER_RUN`` rows (a long run, or one stopped by a signal, ends promptly): beyond
    it a note, no tool error, the plot without the tool panels; ``pkrt log plot`` still has them."""
    import pkrt.rt.app.machinerun as machinerun

    monkeypatch.setattr(machinerun, "TOOL_ROWS_AFTER_RUN", 100)
    log = tmp_path / "long.pktlog"
    code, r = _run(capsys, "--duration", "0.5", "--log", str(log))
    assert code == 0 and r["cycles"] == 501
    assert r["tool_channels"]["channels"] == [] and r["tool_error"] is None
    assert r["tool_channels"]["note"].startswith("tool channels left out after the run: 501 rows, more than 100")
    assert r["plot"] and (tmp_path / "long.png").stat().st_size > 0
    assert main(["log", "plot", str(log), "--out", str(tmp_path / "p.png")]) == 0
    capsys.readouterr()
    data, tool = tool_channels(read_log(log))
    assert tool["channels"] == ["tool_ref", "tool"] and tool["note"] is None
