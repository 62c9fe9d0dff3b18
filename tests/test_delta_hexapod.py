"""The Delta and the Gough-Stewart platform against independent computations: the closed forms
of ``shared/reference-models.md`` (sections 3 and 4), the full DAE inverse dynamics (with and
without the idle-freedom locks), power balance, H over the box, idle freedoms."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.models.kinematics import mechanism as mm
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.assembly import Assembler
from pkrt.models.reduction.exact import ExactModel
from pkrt.models.kinematics.taskspace import TaskKinematics, rpy_matrix, tool_pose
from tests.dae_reference import assert_power_balance, dae_inverse_dynamics, sine_motion

# -- Delta (section 3) ----------------------------------------------------------------------
RD, LA, LB, RP = 0.20, 0.30, 0.80, 0.05
PHI = np.deg2rad([0.0, 120.0, 240.0])
U = np.stack([np.cos(PHI), np.sin(PHI), np.zeros(3)], axis=1)
EZ = np.array([0.0, 0.0, 1.0])


def delta_elbow(i, th):
    return RD * U[i] + LA * (np.cos(th) * U[i] - np.sin(th) * EZ)


def delta_ik(P):
    """Per chain: |P + r u_i - E_i(theta_i)| = Lb, i.e. a cos th + b sin th = K with
    D = P + r u_i - A_i, a = D.u_i, b = -D_z; elbows outside: th = atan2(b, a) - acos(K / rho)."""
    th = np.empty(3)
    for i in range(3):
        D = P + RP * U[i] - RD * U[i]
        a, b = D @ U[i], -D[2]
        K = (D @ D + LA**2 - LB**2) / (2 * LA)
        th[i] = np.arctan2(b, a) - np.arccos(K / np.hypot(a, b))
    return th


def delta_fk(theta):
    """Intersection of the spheres |P - c_i| = Lb, c_i = E_i - r u_i, below the base."""
    c = np.array([delta_elbow(i, theta[i]) - RP * U[i] for i in range(3)])
    A = 2 * (c[0] - c[1:])  # 2 (c1 - ci) . P = |c1|^2 - |ci|^2
    rhs = c[0] @ c[0] - np.sum(c[1:] ** 2, axis=1)
    P0 = np.linalg.lstsq(A, rhs, rcond=None)[0]
    n = np.cross(A[0], A[1])
    n /= np.linalg.norm(n)
    d = P0 - c[0]
    bq, cq = 2 * d @ n, d @ d - LB**2
    roots = np.array([(-bq + sg * np.sqrt(bq * bq - 4 * cq)) / 2 for sg in (1, -1)])
    P = P0[None] + roots[:, None] * n[None]
    return P[np.argmin(P[:, 2])]


@pytest.fixture(scope="module")
def delta():
    return load_mechanism("delta")


def test_delta_closed_forms_reference_values():
    assert delta_fk(np.zeros(3)) == pytest.approx([0, 0, -0.661437828], abs=1e-9)
    assert delta_fk(np.ones(3)) == pytest.approx([0, 0, -0.98905], abs=1e-5)
    assert delta_fk(np.full(3, -0.3)) == pytest.approx([0, 0, -0.58170], abs=1e-5)
    rng = np.random.default_rng(0)
    for _ in range(20):
        th = rng.uniform(-0.3, 1.0, 3)
        np.testing.assert_allclose(delta_ik(delta_fk(th)), th, atol=1e-12)


def test_delta_forward_kinematics(delta):
    asm = Assembler(delta)
    axes = [np.linspace(-0.3, 1.0, 4)] * 3
    plat = delta.body_names.index("platform")
    for th in np.array(np.meshgrid(*axes, indexing="ij")).reshape(3, -1).T:
        cfg = asm.solve(th)
        np.testing.assert_allclose(tool_pose(delta, cfg), delta_fk(th), rtol=0, atol=1e-10)
        np.testing.assert_allclose(cfg.R[plat], np.eye(3), atol=1e-10)  # the platform only translates


def test_delta_inverse_kinematics_by_the_constraint_solver(delta):
    tk = TaskKinematics(delta)
    rng = np.random.default_rng(1)
    for _ in range(20):
        P = delta_fk(rng.uniform(-0.3, 1.0, 3))
        tk.start_at(P)
        np.testing.assert_allclose(tk.theta, delta_ik(P), rtol=0, atol=1e-10)


def test_delta_idle_freedoms_are_the_six_rod_spins(delta):
    assert len(delta.idle) == 6
    assert sorted(f.body for f in delta.idle) == [f"rod{i}{s}" for i in (1, 2, 3) for s in "ab"]
    for f in delta.idle:  # each about the rod's own axis (x of its frame)
        np.testing.assert_allclose(f.axis, [1, 0, 0], atol=1e-9)
    assert delta.n_joint_rows == 51 and delta.n_redundant == 0 and delta.n_coords == 60


def _unlocked(mech):
    """The same mechanism without the idle-freedom lock rows (joints only)."""
    passive, active = mm._stack_primitives(mech.description)
    return mm._build(mech.description, passive + active, len(passive), mech.ref_config)


def _random_states(mech, rng, k, vel, accel):
    for _ in range(k):
        yield rng.uniform(*mech.ranges.T), rng.uniform(-vel, vel, mech.n_act), rng.uniform(-accel, accel, mech.n_act)


@pytest.mark.parametrize("name,vel,accel", [("delta", 3.0, 60.0), ("hexapod", 0.3, 5.0)])
def test_tau_equals_dae_inverse_dynamics(name, vel, accel):
    mech = load_mechanism(name)
    free = _unlocked(mech) if mech.idle else None
    model = ExactModel(mech)
    rng = np.random.default_rng(5)
    worst = 0.0
    for th, td, tdd in _random_states(mech, rng, 12, vel, accel):
        red = model(th)
        tau = red.tau(td, tdd)
        ref = dae_inverse_dynamics(mech, red.config, th, td, tdd)
        worst = max(worst, np.linalg.norm(tau - ref) / np.linalg.norm(ref))
        if free is not None:
            # without the locks (the rods free to spin): the same forces, since the spins carry
            # no inertia; the lock is legitimate
            ref2 = dae_inverse_dynamics(free, red.config, th, td, tdd)
            assert np.linalg.norm(tau - ref2) / np.linalg.norm(ref2) < 1e-8
    assert worst < 1e-8, worst


@pytest.mark.parametrize("name,c,a", [
    ("delta", np.array([0.35, 0.3, 0.4]), np.array([0.4, 0.35, 0.3])),
    ("hexapod", np.zeros(6), np.array([0.05, 0.04, 0.05, 0.03, 0.05, 0.04]))])
def test_power_balance_along_a_smooth_motion(name, c, a):
    mech = load_mechanism(name)
    s = mech.n_act
    motion = sine_motion(c, a, 2 * np.pi * np.linspace(0.7, 1.3, s), np.linspace(0.0, 2.0, s))
    assert_power_balance(mech, ExactModel(mech), motion, np.linspace(0, 1.0, 11), min_watts=1.0)


def test_delta_H_spd_over_the_box_and_circulant_at_zero(delta):
    model = ExactModel(delta)
    axes = [np.linspace(-0.3, 1.0, 5)] * 3
    for th in np.array(np.meshgrid(*axes, indexing="ij")).reshape(3, -1).T:
        H = model(th).H
        np.testing.assert_array_equal(H, H.T)
        assert np.linalg.eigvalsh(H).min() > 0.01  # kg m^2: at least the arms' own inertia
    H = model(np.zeros(3)).H
    d, o = np.diag(H), H[[0, 1, 0], [1, 2, 2]]
    assert np.ptp(d) < 1e-12 * d[0] and np.ptp(o) < 1e-12 * d[0]
    assert abs(o[0]) > 1e-3  # the platform couples the chains
    # 120 degrees about z maps chain i to i + 1: H(perm theta) = Pm H(theta) Pm^T
    Pm = np.roll(np.eye(3), 1, axis=0)
    th = np.array([0.1, 0.5, -0.2])
    np.testing.assert_allclose(model(Pm @ th).H, Pm @ model(th).H @ Pm.T, rtol=1e-10, atol=1e-13)


# -- hexapod (section 4) --------------------------------------------------------------------
B_ANG, P_ANG = np.deg2rad([-10, 10, 110, 130, 230, 250]), np.deg2rad([310, 50, 70, 170, 190, 290])
BJ = 0.5 * np.stack([np.cos(B_ANG), np.sin(B_ANG), np.zeros(6)], axis=1)
PJ = 0.3 * np.stack([np.cos(P_ANG), np.sin(P_ANG), np.zeros(6)], axis=1)
L0 = 0.866133170
HOME = np.array([0, 0, 0.8, 0, 0, 0.0])


def hexapod_ik(pose):
    """l_j = |P + R p_j - B_j|, theta_j = l_j - l0 (l0 computed, checked against the value)."""
    R = rpy_matrix(pose[3:])
    return np.linalg.norm(pose[:3] + PJ @ R.T - BJ, axis=1) - np.linalg.norm(HOME[:3] + PJ - BJ, axis=1)


def hexapod_fk(theta, pose=HOME):
    """Newton on the closed-form leg lengths from a nearby pose (analytic Jacobian)."""
    pose = np.array(pose, float)
    for _ in range(50):
        R = rpy_matrix(pose[3:])
        leg = pose[:3] + PJ @ R.T - BJ
        n = leg / np.linalg.norm(leg, axis=1)[:, None]
        r = hexapod_ik(pose) - theta
        if np.abs(r).max() < 1e-15:
            break
        r_, p_, y_ = pose[3:]
        E = np.array([[np.cos(y_) * np.cos(p_), -np.sin(y_), 0], [np.sin(y_) * np.cos(p_), np.cos(y_), 0],
                      [-np.sin(p_), 0, 1]])
        # dl_j = n_j . (dP + w x R p_j), w = E rpy_dot
        J = np.hstack([n, np.array([[np.cross(E[:, k], R @ PJ[j]) @ n[j] for k in range(3)]
                                    for j in range(6)])])
        pose = pose - np.linalg.solve(J, r)
    return pose


@pytest.fixture(scope="module")
def hexapod():
    return load_mechanism("hexapod")


def test_hexapod_home_leg_length_and_no_idle_freedom(hexapod):
    assert np.linalg.norm(HOME[:3] + PJ[0] - BJ[0]) == pytest.approx(L0, abs=1e-9)
    assert np.ptp(np.linalg.norm(HOME[:3] + PJ - BJ, axis=1)) < 1e-15
    assert hexapod.idle == () and hexapod.n_coords == 78 and hexapod.n_joint_rows == 72
    np.testing.assert_allclose(tool_pose(hexapod, hexapod.ref_config), HOME, atol=1e-12)


def test_hexapod_forward_kinematics(hexapod):
    asm = Assembler(hexapod)
    rng = np.random.default_rng(3)
    thetas = [rng.uniform(-0.08, 0.08, 6) for _ in range(20)]
    thetas += [np.array([0.08, -0.08] * 3), np.array([-0.08, 0.08] * 3)]  # the corners: yaw ~35 deg
    for th in thetas:
        pose = tool_pose(hexapod, asm.solve(th))
        np.testing.assert_allclose(hexapod_ik(pose), th, rtol=0, atol=1e-10)
        np.testing.assert_allclose(pose, hexapod_fk(th), rtol=0, atol=1e-10)
    assert abs(np.rad2deg(tool_pose(hexapod, asm.solve(thetas[-1]))[5])) > 30


def test_hexapod_inverse_kinematics_by_the_constraint_solver(hexapod):
    tk = TaskKinematics(hexapod)
    rng = np.random.default_rng(4)
    for _ in range(15):
        pose = HOME + rng.uniform(-1, 1, 6) * [0.04, 0.04, 0.04, 0.08, 0.08, 0.15]
        th = hexapod_ik(pose)
        if np.abs(th).max() > 0.08:
            continue
        tk.start_at(pose)
        np.testing.assert_allclose(tk.theta, th, rtol=0, atol=1e-10)


def test_hexapod_H_spd_over_the_box(hexapod):
    model = ExactModel(hexapod)
    rng = np.random.default_rng(6)
    corners = np.array(np.meshgrid(*[[-0.08, 0.08]] * 6, indexing="ij")).reshape(6, -1).T
    smallest = np.inf
    for th in np.vstack([corners[::4], rng.uniform(-0.08, 0.08, (16, 6))]):
        H = model(th).H
        np.testing.assert_array_equal(H, H.T)
        smallest = min(smallest, np.linalg.eigvalsh(H).min())
    assert smallest > 0.5  # kg: the pistons at least


# -- command line ---------------------------------------------------------------------------

def test_model_check_reports_idle_freedoms_and_tool(capsys):
    import json

    from pkrt.rt.cli import main

    assert main(["model", "check", "delta", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["idle_freedoms"] == 6 and r["mobility"] == 3 and r["coordinates"] == 60
    assert r["constraints"] == 51 and r["redundant_constraints"] == 0
    assert sorted(x["body"] for x in r["idle"]) == ["rod1a", "rod1b", "rod2a", "rod2b", "rod3a", "rod3b"]
    assert r["tool"]["body"] == "platform" and r["tool"]["coordinates"] == ["x", "y", "z"]
    assert r["tool"]["reference_pose"] == pytest.approx([0, 0, -0.661437828], abs=1e-9)
    assert main(["model", "check", "hexapod", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["idle_freedoms"] == 0 and r["idle"] == [] and r["mobility"] == 6 and r["constraints"] == 72
    assert r["tool"]["coordinates"] == ["x", "y", "z", "roll", "pitch", "yaw"]
    assert main(["model", "check", "delta"]) == 0
    out = capsys.readouterr().out
    assert "idle freedoms 6 (zero inertia about the axis; locked by one row each): rod1a about [1. 0. 0.]" in out
    assert "tool: point [0. 0. 0.] on platform; at the reference x 0, y 0, z -0.661438" in out
    assert main(["model", "check", "fourbar"]) == 0
    out = capsys.readouterr().out
    assert "idle freedoms 0" in out and "tool: none" in out


def test_model_eval_delta_and_hexapod(capsys):
    import json

    from pkrt.rt.cli import main

    assert main(["model", "eval", "delta", "--theta", "-0.1,0.2,0.5", "--theta-dot", "1,-1,0.5",
                 "--theta-ddot=-3,2,1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    red = ExactModel(load_mechanism("delta"))(np.array([-0.1, 0.2, 0.5]))
    np.testing.assert_allclose(r["tau"], red.tau([1, -1, 0.5], [-3, 2, 1]), rtol=1e-12)
    assert main(["model", "eval", "hexapod", "--theta", "0,0,0,0,0,0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert np.array(r["H"]).shape == (6, 6) and np.array(r["D"]).shape == (6, 21)
    # at home the legs are symmetric in pairs: gravity loads every leg, all push up (p_ext < 0)
    assert np.all(np.array(r["p_ext"]) < 0)
    assert main(["model", "eval", "hexapod", "--theta", "0,0,0"]) == 2
    assert "expected 6 comma-separated value(s)" in capsys.readouterr().err
