"""Geometric calibration (``pkrt.models.calibration``) on the three machines, from simulated
readings (no runs; ``tests/test_calibrate_cli.py`` runs the machine): the identification
Jacobian against finite differences, what the base set keeps and why it leaves the rest, the
written description against the model it was written from, a random truth per machine
calibrated to the instrument's noise, the Orthoglide's demo traced by a calibrated machine's
true tool, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.models.calibration.fit import CalibrationInputError, calibrate
from pkrt.models.calibration.jacobian import Frame, PoseModel, residual_jacobian, residuals
from pkrt.models.calibration.output import random_change, write_description
from pkrt.models.calibration.poses import candidate_poses, observability, select
from pkrt.models.calibration.problem import Problem
from pkrt.models.kinematics.description import load_description, rotation_from_vector
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.taskspace import TaskKinematics, plan_demo, rpy_matrix
from pkrt.rt.bench.bench_calibrate import NOISE, readings, trial
from pkrt.rt.runtime.machine.config import load_machine

MACHINES = ("orthoglide", "delta", "hexapod")


@pytest.fixture(scope="module", params=MACHINES)
def machine(request):
    """(config, mechanism, problem, candidate poses, base set) of one machine."""
    config = load_machine(request.param)
    mech = load_mechanism(config.model_path)
    problem = Problem(mech, mech.description.tool.orientation, *NOISE)
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    theta, _ = candidate_poses(mech, 160, lo + 0.05 * (hi - lo), hi - 0.05 * (hi - lo), seed=3)
    base = problem.base_set(PoseModel(problem.params, theta[:80]))
    return config, mech, problem, theta, base


def test_jacobian_matches_differences(machine):
    """Every column of the readings' Jacobian (geometry, away from the description, and the
    instrument's pose exp([psi]x) R0, t0 + dt away from psi = 0) against central differences."""
    _, mech, problem, theta, _ = machine
    delta = random_change(problem.params, np.random.default_rng(5))
    model = PoseModel(problem.params, theta[:3])
    R0, t0 = rotation_from_vector([0.3, -0.2, 0.5]), np.array([1.0, -0.5, 0.3])
    inc0 = np.array([1e-3, -2e-3, 5e-4, 0.0, 0.0, 0.0])

    def frame(inc):
        return Frame(rotation_from_vector(inc[:3]) @ R0, t0 + inc[3:])

    P, Rt, J = model.jacobian(delta)
    meas = Rt @ rotation_from_vector([1e-3, 2e-3, -1e-3])  # readings off the model's frames
    Jg, Jf = residual_jacobian(P, Rt, J, frame(inc0), meas, problem.orientation, inc0[:3])
    A = np.concatenate([Jg, Jf], axis=2)

    def res(d, inc):
        return residuals(*model.poses(d), frame(inc), np.zeros((3, 3)), meas, problem.orientation)

    big = np.abs(A * problem.scale).max()  # the largest reading change per prior size
    for j in range(problem.n):
        h = 1e-2 * problem.scale[j]  # differences of assemblies solved to 1e-12 m: noise ~1e-12 / h
        dp, dm, ip, im = delta.copy(), delta.copy(), inc0.copy(), inc0.copy()
        if j < problem.n_geo:
            dp[j] += h
            dm[j] -= h
        else:
            ip[j - problem.n_geo] += h
            im[j - problem.n_geo] -= h
        fd = (res(dp, ip) - res(dm, im)) / (2 * h)
        col = A[:, :, j]
        err = np.abs(fd - col).max() * problem.scale[j]
        assert err <= 1e-4 * max(np.abs(col).max() * problem.scale[j], 1e-2 * big), problem.names[j]


def test_base_set_keeps_what_the_tool_shows(machine):
    """The base set has the instrument's pose, every offset and scale, and names why each
    other parameter is left out."""
    _, mech, problem, _, base = machine
    kept = {problem.names[i] for i in base.base}
    assert {f"tracker.{c}" for c in ("rx", "ry", "rz", "x", "y", "z")} <= kept
    assert {f"{a}.{k}" for a in mech.actuator_names for k in ("offset", "scale")} <= kept
    why = {problem.names[j]: w for j, w in base.dependent}
    assert len(why) + base.n_base == problem.n
    if mech.name == "orthoglide":  # a guide's point along its own axis is the actuator's zero
        assert why["slide1.point1.x"] == "acts on the tool as a combination of q1.offset (+1)"
        assert base.n_base == 30
    if mech.name == "delta":  # a rod acts by its length: one end's axial position of each rod is kept
        for rod in ("1a", "1b", "2a", "2b", "3a", "3b"):
            ends = {f"elbow{rod}.point2.axial", f"wrist{rod}.point1.axial"}
            assert len(ends & kept) == 1, rod
        assert why["shoulder1.point2.z"] == "acts on the tool as a combination of theta1.offset (+1)"
    if mech.name == "hexapod":  # 6 x (3 base + 3 platform joint coordinates) less the 6 + 6 the
        # instrument's pose and the tool absorb, the legs' offsets and scales, the tool, the instrument
        assert base.n_base == 24 + 6 + 6 + 6 + 6
        assert why["u1.frame1.u"] == "does not move the tool"  # a leg acts only by its length
        assert why["u1.point2.x"] == "acts on the tool as a combination of l1.offset (-1)"


def test_written_description_is_the_model(machine, tmp_path):
    """The description written for a change of every parameter loads, keeps the masses, and its
    tool is the changed model's at every pose (to rounding)."""
    _, mech, problem, theta, _ = machine
    delta = random_change(problem.params, np.random.default_rng(2))
    path = tmp_path / "changed.toml"
    write_description(problem.params, delta, str(path), {"software": "test", "cad": [1.0, 2.0]})
    written = load_mechanism(str(path))
    assert written.name == mech.name and np.array_equal(written.masses, mech.masses)
    assert np.allclose(written.inertias, mech.inertias, rtol=0, atol=0)
    from pkrt.models.calibration.parameters import GeometricParameters

    g = GeometricParameters(written)
    P1, R1 = PoseModel(g, theta[:20]).poses(np.zeros(g.n))
    P0, R0 = PoseModel(problem.params, theta[:20]).poses(delta)
    assert np.abs(P1 - P0).max() < 1e-10 and np.abs(R1 - R0).max() < 1e-10
    assert np.abs(P0 - PoseModel(problem.params, theta[:20]).poses(np.zeros(problem.n_geo))[0]).max() > 1e-4
    assert "[calibration]" in path.read_text() and load_description(str(path)).tool is not None


def test_a_random_truth_calibrates_to_the_noise(machine, tmp_path):
    """Every geometric parameter off by up to 0.5 mm / 2 mrad / 2e-3, the tracker's pose
    unknown: 40 poses chosen for observability fit it; at 60 other poses the true tool error is
    within 2x the instrument's noise and 20x below the description's; each identifiable
    parameter is within 3 of its standard deviations of the truth's equivalent."""
    _, mech, problem, theta, base = machine
    A = problem.scaled_jacobian(PoseModel(problem.params, theta))[:, :, base.base]
    chosen = select(A, 40)
    rest = np.setdiff1d(np.arange(len(theta)), chosen)[:60]
    rng = np.random.default_rng(21)
    assert observability(A[chosen])["o1"] > observability(A[rng.choice(len(theta), 40, replace=False)])["o1"]
    path = str(tmp_path / "truth.toml")
    write_description(problem.params, random_change(problem.params, rng), path)
    r = trial(problem, base, theta[chosen], theta[rest], load_mechanism(path), [1.3, -0.9, 0.6, 0.2, -0.3, 1.0],
              seed=4)
    assert r["after"]["position_m"] <= 2 * NOISE[0], r
    assert r["ratio"] >= 20, r
    if problem.orientation:
        assert r["after"]["orientation_rad"] <= 2 * NOISE[1] and r["ratio_orientation"] >= 20, r
    assert r["within_3"] == r["parameters"], r
    assert 0.5 < r["chi2_per_dof"] < 2.0 and r["at_bound"] == 0


def test_the_demo_traced_by_a_calibrated_machine(tmp_path):
    """The Orthoglide of the issue (a leg 0.3 mm short, a guide tilted 0.8 mrad, a platform
    joint 0.2 mm and an encoder zero 0.15 mm off) calibrated from 40 readings: its demo,
    planned on the calibrated model and followed exactly, puts the true tool within 2x the
    noise of the programmed path (the description's plan: ten times further)."""
    from pkrt.rt.bench.bench_calibrate import issue_change

    config = load_machine("orthoglide")
    mech = load_mechanism(config.model_path)
    problem = Problem(mech, False, *NOISE)
    theta, _ = candidate_poses(mech, 160, mech.ranges[:, 0] + 0.016, mech.ranges[:, 1] - 0.016, seed=8)
    base = problem.base_set(PoseModel(problem.params, theta[:80]))
    chosen = select(problem.scaled_jacobian(PoseModel(problem.params, theta))[:, :, base.base], 40)
    write_description(problem.params, issue_change(problem), str(tmp_path / "truth.toml"))
    truth = load_mechanism(str(tmp_path / "truth.toml"))
    pose = [1.1, 0.8, -0.4, -0.2, 0.1, 2.5]
    fit = calibrate(problem, base, readings(truth, theta[chosen], pose, seed=1))
    write_description(problem.params, fit.delta, str(tmp_path / "cal.toml"))
    true_frame = Frame(rpy_matrix(pose[3:]), np.asarray(pose[:3]))
    out = {}
    for name, model, frame in (("cal", load_mechanism(str(tmp_path / "cal.toml")), fit.frame),
                               ("cad", mech, fit.frame_cad)):
        plan = plan_demo(model, config.demo, 50.0)
        programmed = TaskKinematics(model).forward(plan.pos)
        true = TaskKinematics(truth).forward(plan.pos)
        mapped = (true - true_frame.t) @ true_frame.R @ frame.R.T + frame.t
        out[name] = float(np.sqrt(np.mean((mapped - programmed) ** 2)))  # per coordinate
    assert out["cal"] <= 2 * NOISE[0], out
    assert out["cad"] >= 10 * out["cal"], out


def test_refusals(machine, tmp_path):
    """Too few readings, poses that do not excite a parameter, a fit that ends on a bound."""
    _, mech, problem, theta, base = machine
    truth_path = str(tmp_path / "truth.toml")
    write_description(problem.params, random_change(problem.params, np.random.default_rng(9)), truth_path)
    truth = load_mechanism(truth_path)
    pose = [0.5, 0.5, 0.5, 0.0, 0.0, 0.0]
    few = base.n_base // problem.m
    with pytest.raises(CalibrationInputError, match="too few poses"):
        calibrate(problem, base, readings(truth, theta[:few], pose, orientation=problem.orientation))
    same = np.repeat(theta[:1], 3 * few, axis=0)  # one pose measured again and again
    with pytest.raises(CalibrationInputError, match="excite"):
        calibrate(problem, base, readings(truth, same, pose, orientation=problem.orientation))
    if mech.name == "orthoglide":  # a screw 5 % longer than any bound allows: named
        names = problem.params.names
        d = np.zeros(problem.n_geo)
        d[names.index("q2.scale")] = 0.05
        write_description(problem.params, d, truth_path)
        fit = calibrate(problem, base, readings(load_mechanism(truth_path), theta[:60], pose))
        assert "q2.scale" in [problem.names[j] for j in fit.at_bound]
