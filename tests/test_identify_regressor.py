"""The regressor of the reduced inverse dynamics and the base parameters (pkrt.models.identification.regressor,
pkrt.models.identification.baseparams), against the exact reduction and the DAE inverse dynamics."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pkrt.models.identification.baseparams import base_of_stack, base_parameters, random_states
from pkrt.models.kinematics.mechanism import compile_mechanism, load_mechanism
from pkrt.models.reduction.exact import ExactModel
from pkrt.models.identification.regressor import Regressor, body_from_parameters, body_parameters, model_parameters, parameter_names
from tests.dae_reference import dae_inverse_dynamics

MACHINES = ("orthoglide", "delta", "hexapod")


@pytest.fixture(scope="module", params=MACHINES)
def mech(request):
    return load_mechanism(request.param)


def _states(mech, n, seed):
    th, td, tdd = random_states(mech, n, seed)
    return list(zip(th, td, tdd))


def test_y_times_model_parameters_is_the_exact_tau(mech):
    reg, exact = Regressor(mech), ExactModel(mech)
    pi = model_parameters(mech.description, viscous=3.0, coulomb=2.0, offset=-0.5)
    worst = 0.0
    for th, td, tdd in _states(mech, 40, 1):
        tau = exact(th).tau(td, tdd)
        fr = 3.0 * td + 2.0 * np.tanh(td / 1e-3) - 0.5
        worst = max(worst, np.abs(reg(th, td, tdd) @ pi - (tau + fr)).max() / np.abs(tau + fr).max())
    assert worst < 1e-9, worst


def test_y_is_independent_of_the_inertial_parameters(mech):
    """Y of the nominal model times a different mass distribution (payload off the centre,
    masses changed per body) equals the exact tau of that other model: the truth-plant case."""
    rng = np.random.default_rng(3)
    desc = mech.description
    idle = {f.body for f in mech.idle}  # rods spinning freely: scaled only, else no longer idle
    bodies = []
    for b in desc.bodies:
        k = rng.uniform(0.8, 1.3)
        if b.name in idle:
            bodies.append(dataclasses.replace(b, mass=b.mass * k, inertia=b.inertia * k))
        else:
            bodies.append(dataclasses.replace(b, mass=b.mass * k, com=b.com + rng.normal(scale=0.01, size=3),
                                              inertia=b.inertia * rng.uniform(0.8, 1.3)))
    other = compile_mechanism(dataclasses.replace(desc, bodies=tuple(bodies)))
    reg, exact = Regressor(mech), ExactModel(other)
    pi = model_parameters(other.description)
    assert not np.allclose(pi, model_parameters(desc))
    for th, td, tdd in _states(mech, 10, 2):
        tau = exact(th).tau(td, tdd)
        assert np.abs(reg(th, td, tdd) @ pi - tau).max() < 1e-9 * np.abs(tau).max()


@pytest.mark.parametrize("name", ["orthoglide", "delta"])
def test_y_against_the_dae_inverse_dynamics(name):
    """Independent of the reduction: the saddle-point (Lagrange multiplier) inverse dynamics."""
    m = load_mechanism(name)
    reg, exact = Regressor(m), ExactModel(m)
    pi = model_parameters(m.description)
    for th, td, tdd in _states(m, 5, 4):
        ref = dae_inverse_dynamics(m, exact(th).config, th, td, tdd)
        assert np.linalg.norm(reg(th, td, tdd) @ pi - ref) < 1e-8 * np.linalg.norm(ref)


def test_body_parameters_round_trip():
    I = np.array([[0.02, 0.001, -0.002], [0.001, 0.03, 0.0005], [-0.002, 0.0005, 0.025]])
    p = body_parameters(1.7, np.array([0.1, -0.05, 0.2]), I)
    m, c, Ic = body_from_parameters(p)
    assert m == pytest.approx(1.7) and np.allclose(c, [0.1, -0.05, 0.2]) and np.allclose(Ic, I, atol=1e-15)
    assert p[4] == pytest.approx(0.02 + 1.7 * (0.05**2 + 0.2**2))  # Ixx about the origin
    assert p[5] == pytest.approx(0.001 - 1.7 * 0.1 * -0.05)  # Ixy: tensor entry


def test_base_parameters_rank_and_regrouping(mech):
    bp = base_parameters(mech)
    reg = Regressor(mech)
    # the count of base parameters is the numerical rank, with a clear gap in R's diagonal
    assert bp.n_base == bp.rank
    assert bp.diag[bp.rank - 1] / bp.diag[0] > 1e-5
    assert bp.rank == len(bp.diag) or bp.diag[bp.rank] / bp.diag[0] < 1e-11
    # at fresh states, for any parameters: Y pi = Y_base pi_base, and the zero columns stay zero
    rng = np.random.default_rng(7)
    pi = rng.normal(size=reg.n_params)
    for th, td, tdd in _states(mech, 5, 11):
        Y = reg(th, td, tdd)
        assert np.abs(Y @ pi - Y[:, bp.base] @ bp.project(pi)).max() < 1e-8 * np.abs(Y).max() * np.abs(pi).max()
        assert np.abs(Y[:, bp.zero]).max(initial=0.0) < 1e-10 * np.abs(Y).max()
    lines = bp.regrouping()
    assert len(lines) == bp.n_base + (1 if len(bp.zero) else 0)


def test_orthoglide_platform_shows_only_its_mass():
    """The platform only translates: its first moments and inertia cannot be identified."""
    m = load_mechanism("orthoglide")
    bp = base_parameters(m)
    names = parameter_names(m)
    for p in ("mx", "my", "mz", "Ixx", "Iyy", "Izz", "Ixy"):
        assert names.index(f"platform.{p}") in bp.zero
    used = {n for i in range(bp.n_base) for _, n in bp.combination(i)}
    assert "platform.m" in used


def test_base_of_stack_on_a_known_rank():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(50, 3))
    Y = np.c_[A, A[:, 0] - 2 * A[:, 1], np.zeros(50)]  # rank 3, one combination, one zero column
    bp = base_of_stack(Y, ["a", "b", "c", "d", "e"], 50)
    assert bp.rank == 3 and list(bp.zero) == [4]
    pi = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert np.allclose(Y @ pi, Y[:, bp.base] @ bp.project(pi))


def test_correlation_factor_of_filtered_noise():
    """White residuals: no inflation; a moving average of 4 white samples: the variance of a
    mean is 4 times the white estimate (1 + 2 (3/4 + 2/4 + 1/4))."""
    from pkrt.models.identification.estimate import correlation_factor

    rng = np.random.default_rng(0)
    e = rng.normal(size=(20000, 2))
    keep = np.ones(e.shape, dtype=bool)
    assert correlation_factor(e[keep], keep) < 1.05
    ma = np.stack([np.convolve(e[:, i], np.ones(4) / 4, mode="same") for i in range(2)], axis=1)
    assert correlation_factor(ma[keep], keep) == pytest.approx(4.0, rel=0.05)


def test_instruments_remove_the_bias_of_force_noise_that_moves_the_machine():
    """A mass m with viscous friction c under control: the force noise e acts on the machine
    (tau + e = m a + c v) and so moves it (a = a_ref + e / k): least squares on the measured
    acceleration shrinks m by many standard deviations; the reference's acceleration as the
    instrument recovers m and c within their intervals, which least squares' do not hold."""
    from pkrt.models.identification.estimate import fit

    rng = np.random.default_rng(3)
    n, m, c = 20000, 2.0, 5.0
    t = np.arange(n) * 1e-3
    a_ref, v = 3.0 * np.sin(2 * np.pi * t), 0.5 * np.cos(2 * np.pi * 0.7 * t)
    e = rng.normal(0.0, 2.0, n)
    a = a_ref + e / 4.0
    tau = m * a + c * v - e
    Y = np.stack([a, v], axis=1)[:, None, :]
    Z = np.stack([a_ref, v], axis=1)[:, None, :]
    keep = np.ones((n, 1), dtype=bool)
    truth = np.array([m, c])
    ls = fit(Y, tau[:, None], keep, ["m", "c"])
    iv = fit(Y, tau[:, None], keep, ["m", "c"], Zb=Z)
    assert ls.estimator == "least squares" and iv.estimator.startswith("instrumental")
    assert abs(ls.value[0] - m) > 10 * ls.std[0], (ls.value, ls.std)
    assert np.all(np.abs(iv.value - truth) < 4 * iv.std), (iv.value, iv.std)


def test_batch_equals_the_state_by_state_regressor(mech):
    """``Regressor.batch`` (one numba loop, chord Newton between neighbouring states, the rest
    vectorised) gives Y of ``Regressor.__call__`` along a trajectory and at scattered states
    (which it walks to in sub-steps)."""
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    t = np.linspace(0.0, 1.0, 120)[:, None]
    k = np.arange(1, mech.n_act + 1)
    th = 0.5 * (lo + hi) + 0.3 * (hi - lo) * np.sin(2 * np.pi * t * k)
    rng = np.random.default_rng(5)
    td, tdd = rng.normal(size=th.shape), rng.normal(size=th.shape)
    scattered = random_states(mech, 12, seed=9)
    for a, b, c in ((th, td, tdd), scattered):
        one = Regressor(mech).stack(a, b, c)
        many = Regressor(mech).batch(a, b, c)
        assert many.shape == one.shape
        assert np.abs(many - one).max() < 1e-9 * np.abs(one).max()
