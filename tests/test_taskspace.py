"""Task-space planning: the planned actuator values put the tool on the commanded path (forward
kinematics, closed forms where the reference gives them), planned rates are exact (closed forms
for the Orthoglide; finite differences of the planned positions as a consistency check only),
paths outside the workspace or the ranges are refused with the time."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.taskspace import TaskKinematics, adept_cycle, circle, join, line, load_task_csv, plan_task_path, round_trip, tool_pose
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import Planned
from tests.orthoglide_oracle import orthoglide_fk, orthoglide_ik
from tests.test_delta_hexapod import HOME, delta_fk, delta_ik, hexapod_fk, hexapod_ik

RATE = 1000.0


@pytest.fixture(scope="module")
def machines():
    return {name: load_mechanism(name) for name in ("orthoglide", "delta", "fivebar", "hexapod")}


def _fd_consistent(plan: Planned) -> None:
    """Central differences of the planned positions agree with the planned velocities and
    accelerations to within the differences' own truncation error: h^2/6 max|jerk| and
    h^2/12 max|snap| (jerk and snap estimated from the planned accelerations), with a factor 4
    (where pieces join, the jerk jumps: there the error is about h |jump| / 6) and a rounding
    floor."""
    h = 1.0 / plan.rate_hz
    p, a = plan.pos, plan.acc
    v_fd = (p[2:] - p[:-2]) / (2 * h)
    a_fd = (p[2:] - 2 * p[1:-1] + p[:-2]) / h**2
    jerk = np.abs(np.diff(a, axis=0)).max() / h
    snap = np.abs(np.diff(a, 2, axis=0)).max() / h**2
    floor = 1e-12 * np.abs(p).max() / h**2
    assert np.abs(v_fd - plan.vel[1:-1]).max() < 4 * h**2 / 6 * jerk + floor * h
    assert np.abs(a_fd - plan.acc[1:-1]).max() < 4 * h**2 / 12 * snap + floor
    # and the bound is tight enough to mean something: far below the rates themselves
    assert 4 * h**2 / 6 * jerk < 1e-2 * np.abs(plan.vel).max()
    assert 4 * h**2 / 12 * snap < 0.2 * np.abs(plan.acc).max()


def _paths(name):
    if name == "orthoglide":
        c = np.array([-0.05, -0.04, -0.06])
        return [line([0, 0, 0], [0.04, -0.12, 0.03], 0.6, RATE),
                circle(c, 0.05, 1.2, RATE, normal=(1, 1, 1), laps=1.5)]
    if name == "delta":
        return [line([0, 0, -0.75], [0.12, -0.08, -0.88], 0.5, RATE),
                circle([0.02, 0, -0.85], 0.15, 1.0, RATE)]
    if name == "fivebar":
        return [line([0.0, 0.316], [0.02, 0.30], 0.4, RATE), circle([0.0, 0.305], 0.015, 0.8, RATE)]
    return [line(HOME, HOME + [0.03, -0.02, 0.04, 0.05, -0.04, 0.12], 0.8, RATE),
            circle(HOME, 0.05, 2.0, RATE, tilt=0.06)]


@pytest.mark.parametrize("name", ["orthoglide", "delta", "fivebar", "hexapod"])
def test_planned_tool_follows_lines_and_circles(name, machines):
    mech = machines[name]
    for path in _paths(name):
        plan = plan_task_path(mech, path)
        assert isinstance(plan, Planned) and plan.rate_hz == RATE and plan.pos.shape == (path.n, mech.n_act)
        # the model's own forward kinematics (an assembly by actuator values, walking the branch)
        fk = TaskKinematics(mech).forward(plan.pos)
        assert np.abs(fk - path.pos).max() < 1e-9
        _fd_consistent(plan)
        # closed forms where the reference document gives them
        if name == "orthoglide":
            th, thd, thdd = orthoglide_ik(path.pos, path.vel, path.acc, 0.31)
            np.testing.assert_allclose(plan.pos, th, rtol=0, atol=1e-10)
            np.testing.assert_allclose(plan.vel, thd, rtol=0, atol=1e-10 * np.abs(thd).max())
            np.testing.assert_allclose(plan.acc, thdd, rtol=0, atol=1e-9 * np.abs(thdd).max())
            fk_closed = np.array([orthoglide_fk(t, 0.31) for t in plan.pos[::25]])
            assert np.abs(fk_closed - path.pos[::25]).max() < 1e-9
        elif name == "delta":
            np.testing.assert_allclose(plan.pos, [delta_ik(P) for P in path.pos], rtol=0, atol=1e-10)
            assert np.abs(np.array([delta_fk(t) for t in plan.pos[::10]]) - path.pos[::10]).max() < 1e-9
        elif name == "hexapod":
            np.testing.assert_allclose(plan.pos, [hexapod_ik(x) for x in path.pos], rtol=0, atol=1e-10)
            fk_closed = np.array([hexapod_fk(t, x) for t, x in zip(plan.pos[::20], path.pos[::20])])
            assert np.abs(fk_closed - path.pos[::20]).max() < 1e-9


def test_hexapod_circle_with_tilt_from_home(machines):
    """The hexapod's demo motion: from home to a circle of 50 mm with a roll oscillation of
    0.06 rad, and back home."""
    mech = machines["hexapod"]
    circ = circle(HOME, 0.05, 2.0, RATE, tilt=0.06)
    assert np.abs(circ.pos[:, 3]).max() == pytest.approx(0.06, rel=1e-4)
    assert np.abs(circ.vel[[0, -1]]).max() < 1e-12  # at rest at both ends
    path = round_trip(HOME, circ, 0.5)
    assert path.n == 3001
    np.testing.assert_allclose(path.pos[[0, -1]], [HOME, HOME], atol=1e-15)
    plan = plan_task_path(mech, path)
    fk = TaskKinematics(mech).forward(plan.pos[::10])
    assert np.abs(fk - path.pos[::10]).max() < 1e-9
    assert np.abs(fk[:, 3]).max() > 0.05
    _fd_consistent(plan)


def test_adept_cycle(machines):
    mech = machines["delta"]
    start = np.array([-0.1525, 0.0, -0.8])
    for blend in (0.3, None):
        path = adept_cycle(start, RATE, cycle_time=0.5, blend=blend)
        assert path.n == 501  # 0.5 s at 1 kHz
        np.testing.assert_allclose(path.pos[[0, -1]], [start, start], atol=1e-15)
        assert np.ptp(path.pos[:, 2]) == pytest.approx(0.025, abs=1e-12)
        assert np.ptp(path.pos[:, 0]) == pytest.approx(0.305, abs=1e-12)
        assert np.abs(path.pos[:, 1]).max() == 0.0
        plan = plan_task_path(mech, path)
        assert np.abs(TaskKinematics(mech).forward(plan.pos) - path.pos).max() < 1e-9
        _fd_consistent(plan)
    # stop-and-go: straight up at the start (no horizontal motion before the top)
    path = adept_cycle(start, RATE, blend=None)
    top = int(np.argmax(path.pos[:, 2]))
    assert np.abs(path.pos[:top, 0] - start[0]).max() < 1e-15


def test_path_outside_the_actuator_ranges_is_refused(machines):
    path = line([0, 0, -0.8], [0, 0, -1.05], 0.5, RATE)
    with pytest.raises(UserError, match=r"at t = 0\.\d{4} s actuator theta1 would be at 1\.0\d+ rad, outside its range \[-0\.3, 1\]"):
        plan_task_path(machines["delta"], path)


def test_path_outside_the_workspace_is_refused(tmp_path, machines):
    """With ranges that do not stop it first, a path below the Delta's reach (about
    z = -1.086) cannot be assembled: refused at the time it leaves."""
    from pkrt.models.kinematics.description import MACHINES_DIR

    text = (MACHINES_DIR / "delta.toml").read_text().replace("range = [-0.30, 1.00]", "range = [-3.0, 3.0]")
    p = tmp_path / "wide.toml"
    p.write_text(text)
    mech = load_mechanism(str(p))
    path = line([0, 0, -0.8], [0, 0, -1.3], 1.0, RATE)
    with pytest.raises(UserError, match=r"task path refused: at t = 0\.\d{4} s the tool pose .* outside delta's workspace"):
        plan_task_path(mech, path)
    with pytest.raises(UserError, match="cannot reach"):
        TaskKinematics(mech).start_at([0, 0, -1.3])


def test_task_csv_six_coordinates(tmp_path, machines):
    mech = machines["hexapod"]
    t = np.linspace(0, 2, 41)
    w = 2 * np.pi * 0.5
    rows = np.column_stack([t, 0.02 * np.sin(w * t), 0.02 * (1 - np.cos(w * t)), 0.8 + 0.01 * np.sin(w * t),
                            0.03 * np.sin(w * t), np.zeros_like(t), 0.05 * np.sin(w * t)])
    f = tmp_path / "pose.csv"
    np.savetxt(f, rows, delimiter=",", header="t,x,y,z,roll,pitch,yaw", comments="")
    path = load_task_csv(str(f), RATE, ("x", "y", "z", "roll", "pitch", "yaw"))
    assert path.n == 2001
    plan = plan_task_path(mech, path)
    assert np.abs(TaskKinematics(mech).forward(plan.pos[::50]) - path.pos[::50]).max() < 1e-9
    np.testing.assert_allclose(plan.pos, [hexapod_ik(x) for x in path.pos], rtol=0, atol=1e-10)
    bad = tmp_path / "xyz.csv"
    np.savetxt(bad, rows[:, :4], delimiter=",", header="t,x,y,z", comments="")
    with pytest.raises(UserError, match=r"columns must be t,x,y,z,roll,pitch,yaw \(optionally followed by <name>_vel and <name>_acc columns\); got 't,x,y,z'"):
        load_task_csv(str(bad), RATE, ("x", "y", "z", "roll", "pitch", "yaw"))


def test_wrong_path_width_and_no_tool(machines):
    with pytest.raises(UserError, match=r"needs 6 coordinate\(s\)"):
        plan_task_path(machines["hexapod"], line([0, 0, 0.8], [0, 0, 0.81], 0.1, RATE))
    with pytest.raises(UserError, match=r"no \[tool\] table"):
        TaskKinematics(load_mechanism("fourbar"))


def test_join_refuses_gaps():
    with pytest.raises(UserError, match="do not join"):
        join([line([0, 0, 0], [1, 0, 0], 1, RATE), line([0, 0, 0], [1, 0, 0], 1, RATE)], {})


def test_tool_pose_at_reference(machines):
    np.testing.assert_allclose(tool_pose(machines["delta"], machines["delta"].ref_config),
                               [0, 0, -0.661437828], atol=1e-9)
    np.testing.assert_allclose(tool_pose(machines["orthoglide"], machines["orthoglide"].ref_config), 0, atol=1e-12)



def test_runtime_consumes_a_task_space_plan_unchanged(machines):
    """An Orthoglide circle planned here runs through the runtime in lockstep (simulated
    plant, computed torque) as any planned reference: no fault, tracking under 0.1 mm (10 um
    measured)."""
    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree
    from pkrt.rt.runtime.machine.run import run_session

    config = load_machine("orthoglide")
    home = orthoglide_fk(np.full(3, -0.1), 0.31)
    path = round_trip(home, circle(home, 0.04, 1.0, config.rate_hz, normal=(1, 1, 1)), 0.3)
    plan = plan_task_path(machines["orthoglide"], path)
    r = run_session(config, open_drives(config), lockstep=True, tree=load_controller_tree(config), trajectory=plan)
    assert r["fault"] is None and r["cycles"] == plan.n
    assert r["max_error"] < 1e-4


def test_adept_cycle_at_half_a_second_fits_the_torque_limit(machines):
    """The planned 0.5 s Adept cycle's inverse dynamics (exact model) plus the reference's
    friction (0.05 N m s/rad viscous, 0.1 N m Coulomb) stay under its 20 N m limit (peak
    about 10.5 N m): the cycle can run without saturation."""
    from pkrt.models.reduction.exact import ExactModel

    mech = machines["delta"]
    plan = plan_task_path(mech, adept_cycle([-0.1525, 0.0, -0.8], RATE, cycle_time=0.5))
    model = ExactModel(mech)
    tau = np.array([model(p).tau(v, a) for p, v, a in zip(plan.pos[::2], plan.vel[::2], plan.acc[::2])])
    tau += 0.05 * plan.vel[::2] + 0.1 * np.sign(plan.vel[::2])
    assert 5.0 < np.abs(tau).max() < 20.0
