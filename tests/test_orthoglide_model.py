"""The Orthoglide's kinematics and exact reduced model against independent computations:
closed forms of ``shared/reference-models.md``, the full DAE inverse dynamics, power balance."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.assembly import Assembler
from pkrt.models.reduction.exact import ExactModel, reduce_at
from tests.dae_reference import assert_power_balance, dae_inverse_dynamics, sine_motion, velocities

L, r = 0.31, 0.05


@pytest.fixture(scope="module")
def mech():
    return load_mechanism("orthoglide")


def ik(P):
    """theta_i = P_i + sqrt(L^2 - sum_{j != i} P_j^2) - L."""
    return np.array([P[i] + np.sqrt(L**2 - (P @ P - P[i] ** 2)) - L for i in range(3)])


def fk_diagonal(t):
    """theta = t (1, 1, 1) -> P = p (1, 1, 1), the root of 3p^2 - 2p(t + L) + (t + L)^2 - L^2 = 0
    on the working branch (the other root is the mirror assembly)."""
    u = t + L
    return (u - np.sqrt(3 * L**2 - 2 * u**2)) / 3


def grid(mech, n):
    lo, hi = mech.ranges.T
    axes = [np.linspace(lo[i], hi[i], n) for i in range(3)]
    return np.array(np.meshgrid(*axes, indexing="ij")).reshape(3, -1).T


def test_forward_kinematics_closed_forms(mech):
    asm = Assembler(mech)
    for th in grid(mech, 5):
        cfg = asm.solve(th)
        P = mech.platform_point(cfg, "platform")
        np.testing.assert_allclose(ik(P), th, rtol=0, atol=1e-10)
        assert np.sum(P / (L + th)) < 1.0  # the working branch
        np.testing.assert_allclose(cfg.R[mech.body_names.index("platform")], np.eye(3), atol=1e-10)
        for i in range(3):  # leg closure |C_i - B_i| = L, slider centres at B_i
            B = mech.platform_point(cfg, f"slider{i + 1}")
            np.testing.assert_allclose(B, (r + L + th[i]) * np.eye(3)[i], atol=1e-12)
            assert abs(np.linalg.norm(P + r * np.eye(3)[i] - B) - L) < 1e-10
    for t in np.linspace(-0.26, 0.06, 9):
        P = mech.platform_point(asm.solve(np.full(3, t)), "platform")
        np.testing.assert_allclose(P, np.full(3, fk_diagonal(t)), rtol=0, atol=1e-10)
    assert fk_diagonal(-0.26) == pytest.approx(-0.16075311, abs=1e-8)
    assert fk_diagonal(0.06) == pytest.approx(0.08319468, abs=1e-8)


def test_inverse_kinematics_closed_form(mech):
    """Platform points chosen first; the model assembled at the closed-form theta puts the
    platform there."""
    rng = np.random.default_rng(11)
    asm = Assembler(mech)
    lo, hi = mech.ranges.T
    done = 0
    while done < 30:
        P = rng.uniform(-0.15, 0.08, 3)
        th = ik(P)
        if np.any(th < lo) or np.any(th > hi):
            continue
        np.testing.assert_allclose(mech.platform_point(asm.solve(th), "platform"), P, rtol=0, atol=1e-10)
        done += 1


def test_H_symmetric_positive_definite_in_the_box(mech):
    model = ExactModel(mech)
    smallest = np.inf
    for th in grid(mech, 6):
        H = model(th).H
        np.testing.assert_array_equal(H, H.T)
        smallest = min(smallest, np.linalg.eigvalsh(H).min())
    # at least the sliders' mass (2.5 kg) on every axis
    assert smallest > 2.5


def test_H_matches_all_rows_projection(mech):
    """H = Q^T M Q with Q from all constraint rows by least squares (no row selection)."""
    asm = Assembler(mech)
    rng = np.random.default_rng(2)
    for _ in range(10):
        th = rng.uniform(*mech.ranges.T)
        cfg = asm.solve(th)
        _, Jq, Jt = mech.evaluate(cfg, th)
        Q, *_ = np.linalg.lstsq(Jq, -Jt, rcond=None)
        H = Q.T @ mech.mass_matrix(cfg) @ Q
        np.testing.assert_allclose(reduce_at(mech, cfg, th).H, H, rtol=1e-10, atol=0)


def test_H_circulant_at_zero_and_cyclic_symmetry(mech):
    model = ExactModel(mech)
    H = model(np.zeros(3)).H
    d, o = np.diag(H), H[[0, 1, 0], [1, 2, 2]]
    assert np.ptp(d) < 1e-12 * d[0]
    assert np.ptp(o) < 1e-12 * d[0]
    # (at theta = 0 each actuator moves the platform along its own axis: H is even diagonal)
    # x -> y -> z -> x maps the machine onto itself: H(perm theta) = Pm H(theta) Pm^T
    Pm = np.roll(np.eye(3), 1, axis=0)
    rng = np.random.default_rng(4)
    for _ in range(5):
        th = rng.uniform(*mech.ranges.T)
        Hth = model(th).H
        assert np.abs(Hth[np.triu_indices(3, 1)]).min() > 1e-3  # the legs couple the axes here
        np.testing.assert_allclose(model(Pm @ th).H, Pm @ Hth @ Pm.T, rtol=1e-10, atol=1e-12)


def test_tau_equals_dae_inverse_dynamics(mech):
    model = ExactModel(mech)
    rng = np.random.default_rng(7)
    worst = 0.0
    for _ in range(25):
        th = rng.uniform(*mech.ranges.T)
        td = rng.uniform(-1.5, 1.5, 3)
        tdd = rng.uniform(-25, 25, 3)
        red = model(th)
        tau = red.tau(td, tdd)
        ref = dae_inverse_dynamics(mech, red.config, th, td, tdd)
        worst = max(worst, np.linalg.norm(tau - ref) / np.linalg.norm(ref))
        # the velocity-only and gravity-only parts separately (h and p_ext)
        np.testing.assert_allclose(red.h(td) - red.p_ext,
                                   dae_inverse_dynamics(mech, red.config, th, td, np.zeros(3)),
                                   rtol=1e-8, atol=1e-8 * np.abs(red.p_ext).max())
    assert worst < 1e-8, worst


def test_power_balance_along_a_smooth_trajectory(mech):
    motion = sine_motion(np.array([-0.1, -0.12, -0.08]), np.array([0.12, 0.1, 0.11]),
                         2 * np.pi * np.array([1.0, 1.3, 0.7]), np.array([0.0, 1.0, 2.0]))
    # 10 W: a real exchange of energy, gravity and inertia both
    assert_power_balance(mech, ExactModel(mech), motion, np.linspace(0, 1.0, 21), min_watts=10.0)


def test_velocities_are_consistent(mech):
    """qdot from least squares over all rows equals q_theta theta_dot of the reduction."""
    model = ExactModel(mech)
    th, td = np.array([-0.2, 0.03, -0.1]), np.array([0.4, -0.9, 1.2])
    red = model(th)
    np.testing.assert_allclose(velocities(mech, red.config, th, td), red.q_theta @ td, rtol=0, atol=1e-12)
