"""The planar five-bar (s = 2, redundant rows in its spatial description): the exact reduced
model against the full DAE inverse dynamics and against power balance."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.reduction.exact import ExactModel, quadratic_velocities
from tests.dae_reference import assert_power_balance, dae_inverse_dynamics, sine_motion


@pytest.fixture(scope="module")
def mech():
    return load_mechanism("fivebar")


def test_tau_equals_dae_inverse_dynamics(mech):
    model = ExactModel(mech)
    rng = np.random.default_rng(8)
    worst = 0.0
    for _ in range(25):
        th = rng.uniform(*mech.ranges.T)
        td = rng.uniform(-6.0, 6.0, 2)
        tdd = rng.uniform(-60.0, 60.0, 2)
        red = model(th)
        ref = dae_inverse_dynamics(mech, red.config, th, td, tdd)
        worst = max(worst, np.linalg.norm(red.tau(td, tdd) - ref) / np.linalg.norm(ref))
        # the gravity part and the velocity part alone
        ref0 = dae_inverse_dynamics(mech, red.config, th, np.zeros(2), np.zeros(2))
        np.testing.assert_allclose(-red.p_ext, ref0, rtol=1e-8, atol=1e-12)
        refv = dae_inverse_dynamics(mech, red.config, th, td, np.zeros(2)) - ref0
        np.testing.assert_allclose(red.D @ quadratic_velocities(td), refv, rtol=1e-8,
                                   atol=1e-8 * np.abs(refv).max())
    assert worst < 1e-8, worst


def test_D_columns_follow_the_reference_ordering(mech):
    """[td td] = (td1^2, td1 td2, td2^2): the column of td1 td2 is the mixed term."""
    red = ExactModel(mech)(np.array([1.8, 1.3]))
    ref0 = dae_inverse_dynamics(mech, red.config, red.theta, np.zeros(2), np.zeros(2))
    h = {}
    for key, td in (("11", [1.0, 0.0]), ("22", [0.0, 1.0]), ("12", [1.0, 1.0])):
        h[key] = dae_inverse_dynamics(mech, red.config, red.theta, np.array(td), np.zeros(2)) - ref0
    tol = 1e-10 * np.abs(red.D).max()
    np.testing.assert_allclose(red.D[:, 0], h["11"], rtol=0, atol=tol)
    np.testing.assert_allclose(red.D[:, 2], h["22"], rtol=0, atol=tol)
    np.testing.assert_allclose(red.D[:, 1], h["12"] - h["11"] - h["22"], rtol=0, atol=tol)
    # the three columns differ, so a swapped order would show
    assert min(np.abs(red.D[:, 0] - red.D[:, 1]).max(), np.abs(red.D[:, 1] - red.D[:, 2]).max(),
               np.abs(red.D[:, 0] - red.D[:, 2]).max()) > 0.1 * np.abs(red.D).max()


def test_power_balance_along_a_smooth_trajectory(mech):
    motion = sine_motion(np.array([1.9, 1.24]), np.array([0.25, 0.22]),
                         2 * np.pi * np.array([1.1, 0.8]), np.array([0.3, 1.7]))
    assert_power_balance(mech, ExactModel(mech), motion, np.linspace(0, 1.2, 25), min_watts=0.1)


def test_H_symmetric_positive_definite_in_the_box(mech):
    model = ExactModel(mech)
    lo, hi = mech.ranges.T
    for t1 in np.linspace(lo[0], hi[0], 7):
        for t2 in np.linspace(lo[1], hi[1], 7):
            H = model(np.array([t1, t2])).H
            np.testing.assert_array_equal(H, H.T)
            assert np.linalg.eigvalsh(H).min() > 0
