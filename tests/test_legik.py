"""Closed-form inverse kinematics (``pkrt.models.kinematics.legik``) against the reference: Newton on the
model's constraints (``TaskKinematics.solve_pose`` and ``rates``), on the planner's grid of a
path on each shipped machine with a tool, positions and exact rates to 1e-9."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.models.planning.geompath import Line, Motion, polyline_motions
from pkrt.models.kinematics.legik import leg_kinematics
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.taskspace import TaskKinematics, tool_pose
from pkrt.models.planning.topp import PathPlanner, PlanLimits, TreeDynamics
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.machine.runsetup import load_controller_tree


def _planners(name: str):
    cfg = load_machine(name)
    mech = load_mechanism(cfg.model_path)
    dyn = TreeDynamics(load_controller_tree(cfg))
    lim = PlanLimits.from_config(cfg)
    return [PathPlanner(mech, dyn, lim, cfg.rate_hz, kin=TaskKinematics(mech), closed_form=c) for c in (True, False)]


def _motion(name: str, home: np.ndarray) -> Motion:
    if name == "delta":  # the Adept half cycle, corners blended (lines and blends)
        p0 = np.array([-0.1525, 0.0, -0.8])
        up, across = np.array([0, 0, 0.025]), np.array([0.305, 0, 0])
        return polyline_motions([p0, p0 + up, p0 + up + across, p0 + across], 0.01)[0]
    if name == "orthoglide":
        return polyline_motions([home, home + [0.04, 0, -0.02], home + [0.04, 0.04, -0.02]], 0.005)[0]
    end = home + [0.02, 0.01, 0.01, 0.05, -0.04, 0.08]  # the hexapod: it turns as well
    return Motion([Line.between(home, end)])


@pytest.mark.parametrize("name", ["delta", "orthoglide", "hexapod"])
def test_closed_form_grid_equals_newton_to_1e9(name):
    fast, ref = _planners(name)
    assert fast.legs is not None and ref.legs is None
    home = tool_pose(fast.mech, fast.mech.ref_config, fast.kin.tool)
    motion = _motion(name, home)
    a, b = fast.grid(motion), ref.grid(motion)
    assert a.theta.shape == b.theta.shape  # junctions: both one-sided values compared
    assert np.abs(a.theta - b.theta).max() < 1e-9
    assert np.abs(a.theta_s - b.theta_s).max() < 1e-9 * (1 + np.abs(b.theta_s).max())
    assert np.abs(a.theta_ss - b.theta_ss).max() < 1e-9 * (1 + np.abs(b.theta_ss).max())


def test_closed_form_rates_at_random_poses_of_the_hexapod():
    mech = load_mechanism("hexapod")
    kin = TaskKinematics(mech)
    legs = leg_kinematics(kin)
    rng = np.random.default_rng(3)
    home = tool_pose(mech, mech.ref_config, kin.tool)
    for _ in range(10):
        x = home + rng.uniform(-1, 1, 6) * [0.03, 0.03, 0.03, 0.08, 0.08, 0.1]
        xd, xdd = rng.normal(size=6), rng.normal(size=6)
        cfg, theta, res = kin.solve_pose(x, mech.ref_config, mech.theta_ref)
        assert res < kin.tol
        _, thd, _, thdd = kin.rates(cfg, theta, x, xd, xdd)
        th, th1, th2 = legs.solve(x, xd, xdd)
        np.testing.assert_allclose(th[0], theta, rtol=0, atol=1e-9)
        np.testing.assert_allclose(th1[0], thd, rtol=0, atol=1e-9)
        np.testing.assert_allclose(th2[0], thdd, rtol=0, atol=1e-9)


def test_a_machine_without_such_legs_uses_newton():
    mech = load_mechanism("fivebar")  # the actuators drive a closed planar loop, not separate legs
    assert leg_kinematics(TaskKinematics(mech)) is None


def test_closed_form_refuses_a_point_outside_the_workspace_with_its_line():
    fast, _ = _planners("delta")
    p0 = np.array([0.0, 0.0, -0.8])
    far = Motion([Line.between(p0, p0 + [0.0, 0.0, -0.5], line=12)])  # the rods cannot reach
    with pytest.raises(UserError, match=r"^line 12: the tool pose .* outside delta's workspace"):
        fast.plan_motion(far)


def test_closed_form_refuses_a_point_outside_the_actuator_ranges():
    fast, _ = _planners("orthoglide")
    seg = Line.between([0.0, 0.0, 0.0], [0.09, 0.0, 0.0], line=3)  # q1 = 0.09 there, beyond 0.06
    with pytest.raises(UserError, match=r"^line 3: actuator q\d would be at .* outside its range"):
        fast.plan_motion(Motion([seg]))
