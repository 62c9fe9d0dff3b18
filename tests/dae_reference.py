"""Independent reference dynamics for the tests: the full DAE, solved directly.

Only the model's building blocks are used (M, g_iner, g_ext from ``Mechanism``; Phi_q,
Phi_theta from ``Mechanism.evaluate``; the drift gamma from ``Mechanism.drift``). None of the
reduction's own steps are: no choice of independent rows, no q_theta, no polarisation. All
constraint rows, redundant ones included, enter through least squares (SVD, rank-revealing).

Sign convention: M qdd + g_iner - g_ext + Phi_q^T lambda = 0 and tau = Phi_theta^T lambda
(theta is a massless coordinate that the actuators drive: 0 = tau - Phi_theta^T lambda).
"""

from __future__ import annotations

import numpy as np

# first-derivative central difference, 8th order
FD8 = np.array([1 / 280, -4 / 105, 1 / 5, -4 / 5, 0.0, 4 / 5, -1 / 5, 4 / 105, -1 / 280])


def velocities(mech, cfg, theta, theta_dot) -> np.ndarray:
    """qdot from Phi_q qdot = -Phi_theta theta_dot over ALL rows (least squares)."""
    _, Jq, Jt = mech.evaluate(cfg, theta)
    qdot, *_ = np.linalg.lstsq(Jq, -Jt @ theta_dot, rcond=None)
    assert np.abs(Jq @ qdot + Jt @ theta_dot).max() < 1e-12 * max(1.0, np.abs(qdot).max())
    return qdot


def dae_inverse_dynamics(mech, cfg, theta, theta_dot, theta_ddot) -> np.ndarray:
    """Actuator forces tau (N or N m) from the saddle-point system
    [[M, Phi_q^T], [Phi_q, 0]] [qdd; lambda] = [g_ext - g_iner; -Phi_theta thetadd - gamma],
    solved by least squares over all rows (singular with redundant rows, but consistent)."""
    theta, theta_dot, theta_ddot = (np.asarray(x, float) for x in (theta, theta_dot, theta_ddot))
    _, Jq, Jt = mech.evaluate(cfg, theta)
    qdot = velocities(mech, cfg, theta, theta_dot)
    gamma = mech.drift(cfg, qdot, theta, theta_dot)
    M = mech.mass_matrix(cfg)
    n, m = M.shape[0], Jq.shape[0]
    K = np.zeros((n + m, n + m))
    K[:n, :n] = M
    K[:n, n:] = Jq.T
    K[n:, :n] = Jq
    rhs = np.concatenate([mech.external_forces() - mech.gyroscopic(cfg, qdot), -Jt @ theta_ddot - gamma])
    sol, *_ = np.linalg.lstsq(K, rhs, rcond=1e-12)
    assert np.abs(K @ sol - rhs).max() < 1e-9 * max(1.0, np.abs(rhs).max())
    return Jt.T @ sol[n:]


def power_balance(mech, model, assembler, theta_of_t, times, h):
    """For each t: (theta_dot . tau from the reduced model, dE/dt from the full model's energy
    by an 8th-order central difference with step h). theta_of_t(t) -> (theta, td, tdd)."""
    power, rate = [], []
    for t in times:
        th, td, tdd = theta_of_t(t)
        power.append(td @ model(th).tau(td, tdd))
        E = []
        for k in range(-4, 5):
            thk, tdk, _ = theta_of_t(t + k * h)
            cfg = assembler.solve(thk)
            E.append(mech.energy(cfg, velocities(mech, cfg, thk, tdk)))
        rate.append(FD8 @ np.array(E) / h)
    return np.array(power), np.array(rate)


def sine_motion(c, a, w, ph):
    """theta(t) = c + a sin(w t + ph) per actuator, with its exact derivatives."""
    def theta_of_t(t):
        return (c + a * np.sin(w * t + ph), a * w * np.cos(w * t + ph), -a * w**2 * np.sin(w * t + ph))
    return theta_of_t


def assert_power_balance(mech, model, theta_of_t, times, min_watts, h=2e-3, rel=1e-7):
    """theta_dot . tau = dE/dt along the motion to ``rel`` of the peak power, which must be
    above ``min_watts`` (a real exchange of energy)."""
    from pkrt.models.kinematics.assembly import Assembler

    power, rate = power_balance(mech, model, Assembler(mech), theta_of_t, times, h)
    scale = np.abs(power).max()
    assert scale > min_watts, scale
    np.testing.assert_allclose(power, rate, rtol=0, atol=rel * scale)
