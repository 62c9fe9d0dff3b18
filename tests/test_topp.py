"""Time-optimal path parameterisation (``pkrt.models.planning.topp``): limits hold at every loop sample
(forces recomputed with the exact reduction, independent of the planner's tree), the analytic
minimum time of a velocity- and acceleration-limited straight line, a limit binds almost
everywhere (time-optimality), viscous friction is bounded soundly, the planned tool stays on
the path (the reference machine's closed-form forward kinematics), an unholdable path is
refused."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.models.planning.geompath import Line, Motion, polyline_motions
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.taskspace import TaskKinematics
from pkrt.models.planning.topp import ExactDynamics, PathPlanner, PlanLimits, TreeDynamics, forces
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.machine.runsetup import load_controller_tree
from tests.test_delta_hexapod import delta_fk

RATE = 1000.0


@pytest.fixture(scope="module")
def delta():
    cfg = load_machine("delta")
    mech = load_mechanism(cfg.model_path)
    return cfg, mech, TreeDynamics(load_controller_tree(cfg))


@pytest.fixture(scope="module")
def ortho():
    cfg = load_machine("orthoglide")
    mech = load_mechanism(cfg.model_path)
    return cfg, mech, TreeDynamics(load_controller_tree(cfg))


def _planner(machine, limits=None, **kw):
    cfg, mech, dyn = machine
    return PathPlanner(mech, dyn, limits or PlanLimits.from_config(cfg), RATE, kin=TaskKinematics(mech), **kw)


ADEPT = np.array([-0.1525, 0.0, -0.8])


def _adept_half(tolerance=0.01):
    up, across = np.array([0, 0, 0.025]), np.array([0.305, 0, 0])
    (m,) = polyline_motions([ADEPT, ADEPT + up, ADEPT + up + across, ADEPT + across], tolerance)
    return m


def test_delta_adept_half_cycle_holds_every_limit_at_the_loop_rate(delta):
    cfg, mech, _ = delta
    lim = PlanLimits.from_config(cfg)
    plan, rep = _planner(delta, lim).plan_motion(_adept_half())
    exact = forces(ExactDynamics(mech), plan.pos, plan.vel, plan.acc, lim)  # not the planner's tree
    assert np.abs(plan.vel).max(axis=0).max() <= lim.velocity.max() * (1 - lim.margin) * 1.002
    assert np.all(np.abs(plan.acc) <= lim.acceleration * (1 - lim.margin) * 1.002)
    assert np.all(np.abs(exact) <= lim.force), np.abs(exact).max(axis=0)
    assert np.all(np.abs(rep["tau"]) <= lim.force * (1 - lim.margin) * 1.002)
    # at rest at both ends, positions and velocities continuous sample to sample
    assert np.abs(plan.vel[[0, -1]]).max() < 1e-9
    assert np.abs(np.diff(plan.pos, axis=0)).max() <= np.abs(plan.vel).max() / RATE * 1.05
    # faster than the hand-timed half cycle (0.25 s) under the same machine's limits
    assert 0.1 < plan.duration < 0.25
    # jerk smoothing (the default 2 ms window): the acceleration changes over several samples
    # (instantaneous accelerations: a period's mean already spreads a jump over two samples)
    jump = np.abs(np.diff(_planner(delta, lim, held_acc=False).plan_motion(_adept_half())[0].acc, axis=0)).max()
    raw, _ = _planner(delta, lim, smooth=0.0, held_acc=False).plan_motion(_adept_half())
    assert jump < 0.75 * np.abs(np.diff(raw.acc, axis=0)).max()


def test_planned_tool_stays_on_the_blended_path(delta):
    m = _adept_half(0.005)
    plan, _ = _planner(delta).plan_motion(m)
    tool = np.array([delta_fk(th) for th in plan.pos])
    ref = m.eval(np.linspace(0, m.length, 20001))[0]
    dist = np.array([np.linalg.norm(ref - p, axis=1).min() for p in tool])
    assert dist.max() < 2e-5  # the sampled path's interpolation between exact grid points
    assert np.linalg.norm(tool[-1] - (ADEPT + [0.305, 0, 0])) < 1e-9


def test_velocity_and_acceleration_limited_line_takes_the_analytic_time(ortho):
    cfg, mech, dyn = ortho
    v, a = 0.5, 4.0
    lim = PlanLimits([v] * 3, [a] * 3, [1e6] * 3, 0.0, 0.0, margin=0.0)
    a0, b0 = np.array([-0.1, -0.1, -0.1]), np.array([-0.2, -0.05, -0.1])
    m = Motion([Line.between(a0, b0)], task=False)
    plan, _ = PathPlanner(mech, dyn, lim, RATE, grid_points=400, smooth=0.0).plan_motion(m)
    d = 0.1  # the axis that moves furthest binds: trapezoid d / v + v / a
    assert plan.duration == pytest.approx(d / v + v / a, rel=0.01)
    # the limit binds and holds at every sample (ending on a sample costs under one period)
    assert v * (1 - 4e-3) <= np.abs(plan.vel[:, 0]).max() <= v
    # the straight line in actuator space is kept: axis 2 never moves, axis 1 moves half as far
    assert np.abs(plan.pos[:, 2] + 0.1).max() < 1e-12
    assert np.allclose(plan.pos[:, 1] + 0.1, -(plan.pos[:, 0] + 0.1) / 2, atol=1e-12)


def test_pure_velocity_limit_gives_length_over_speed(ortho):
    cfg, mech, dyn = ortho
    lim = PlanLimits([0.2] * 3, [1e5] * 3, [1e7] * 3, 0.0, 0.0, margin=0.0)
    m = Motion([Line.between([-0.2, -0.1, -0.1], [0.0, -0.1, -0.1])], task=False)
    plan, _ = PathPlanner(mech, dyn, lim, RATE, grid_points=2000, smooth=0.0).plan_motion(m)
    assert plan.duration == pytest.approx(0.2 / 0.2, rel=2e-3)


def test_a_limit_binds_almost_everywhere(delta):
    cfg, mech, _ = delta
    lim = PlanLimits.from_config(cfg)
    plan, rep = _planner(delta, lim, smooth=0.0).plan_motion(_adept_half())  # the raw time-optimal profile
    vl, al, fl = lim.planning
    ratio = np.maximum.reduce([np.abs(plan.vel) / vl, np.abs(plan.acc) / al, np.abs(rep["tau"]) / fl]).max(axis=1)
    assert np.mean(ratio > 0.8) > 0.9 and np.median(ratio) > 0.95, (np.mean(ratio > 0.8), np.median(ratio))


def test_viscous_friction_is_bounded_soundly(ortho):
    cfg, mech, dyn = ortho
    base = PlanLimits.from_config(cfg)
    m = polyline_motions([[0.0, 0.0, 0.0], [-0.1, -0.05, -0.02], [-0.1, -0.1, -0.1]], 0.005)
    plans = {}
    for b in (0.0, 20.0, 300.0):
        lim = PlanLimits(base.velocity, base.acceleration, base.force, b, base.coulomb, base.margin)
        plan, rep = _planner(ortho, lim).plan_motion(m[0])
        true = forces(ExactDynamics(mech), plan.pos, plan.vel, plan.acc, lim)  # viscous b thetadot exactly
        assert np.all(np.abs(true) <= lim.force * (1 - lim.margin) * 1.01), (b, np.abs(true).max())
        plans[b] = plan.duration
    assert plans[0.0] <= plans[20.0] < plans[300.0]


def test_coulomb_and_gravity_beyond_the_force_limit_is_refused(ortho):
    cfg, mech, dyn = ortho
    lim = PlanLimits([1.0] * 3, [10.0] * 3, [5.0] * 3, 0.0, 0.0, margin=0.0)  # cannot hold the platform
    m = Motion([Line.between([-0.1, -0.1, -0.1], [-0.1, -0.1, -0.15])], task=False)
    with pytest.raises(UserError, match="force limits"):
        PathPlanner(mech, dyn, lim, RATE).plan_motion(m)


def test_task_path_out_of_the_workspace_is_refused_with_its_line(ortho):
    seg = Line.between([0.0, 0.0, 0.0], [0.4, 0.0, 0.0], line=7)
    with pytest.raises(UserError, match=r"^line 7: "):
        _planner(ortho).plan_motion(Motion([seg]))


def test_same_time_as_toppra_on_the_same_path(ortho):
    """An independent implementation (the toppra package) times the same actuator-space path
    under velocity, acceleration and force limits (forces from the same tree, no viscous
    friction: toppra cannot take it) in the same minimum time."""
    ta = pytest.importorskip("toppra")
    import toppra.algorithm
    import toppra.constraint
    import toppra.interpolator

    from pkrt.models.planning.geompath import PointSpline
    from pkrt.models.planning.topp import quad

    cfg, mech, dyn = ortho
    pts = [[-0.1, -0.1, -0.1], [-0.05, -0.15, -0.12], [0.0, -0.1, -0.2], [-0.05, -0.05, -0.15], [-0.15, -0.1, -0.1]]
    m = Motion([PointSpline.through(pts)], task=False)
    v, a, f = 0.8, 15.0, 150.0
    lim = PlanLimits([v] * 3, [a] * 3, [f] * 3, 0.0, 0.0, margin=0.0)
    plan, _ = PathPlanner(mech, dyn, lim, RATE, grid_points=400, smooth=0.0).plan_motion(m)

    class Path(toppra.interpolator.AbstractGeometricPath):
        dof = 3
        path_interval = np.array([0.0, m.length])

        def __call__(self, s, order=0):
            return m.eval(np.atleast_1d(s))[order] if np.ndim(s) else m.eval(np.array([s]))[order][0]

    def inv_dyn(q, qd, qdd):
        H, D, p = dyn(q)
        return H @ qdd + D @ quad(qd) - p

    cons = [toppra.constraint.JointVelocityConstraint(np.array([[-v, v]] * 3)),
            toppra.constraint.JointAccelerationConstraint(np.array([[-a, a]] * 3)),
            toppra.constraint.JointTorqueConstraint(inv_dyn, np.array([[-f, f]] * 3), np.zeros(3))]
    algo = toppra.algorithm.TOPPRA(cons, Path(), gridpoints=np.linspace(0, m.length, 401),
                                   parametrizer="ParametrizeConstAccel")
    traj = algo.compute_trajectory(0, 0)
    assert plan.duration == pytest.approx(traj.duration, rel=0.01)
