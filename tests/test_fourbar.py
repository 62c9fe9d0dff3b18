"""The four-bar's exact reduced model against an independent closed-form Lagrangian.

The reference is built here with sympy from the planar circle-intersection kinematics of
``shared/reference-models.md`` (no model code): C(theta) on the branch where C lies above the
line from A to Q, link angles, centres of mass, T = 1/2 sum (m |v|^2 + I_zz w^2) = 1/2 H thetadot^2,
V = -sum m g . x. Then H = d2T/dthetadot2, h = 1/2 H'(theta) thetadot^2 (so D = H'/2) and
p_ext = -dV/dtheta.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.assembly import Assembler
from pkrt.models.reduction.exact import ExactModel

THETA_SINGULAR = 1.849620  # rad, coupler and output aligned (|A - Q| = b + c)


def _closed_form():
    th = sp.symbols("theta", real=True)
    a, b, c = sp.Rational(1, 10), sp.Rational(15, 100), sp.Rational(97, 1000)
    masses = (sp.Rational(3, 10), sp.Rational(45, 100), sp.Rational(3, 10))
    lengths = (a, b, c)
    g = sp.Matrix([0, sp.Rational(-981, 100)])
    A = sp.Matrix([a * sp.cos(th), a * sp.sin(th)])
    Q = sp.Matrix([sp.Rational(1, 5), 0])
    AQ = Q - A
    d2 = AQ.dot(AQ)
    d = sp.sqrt(d2)
    u = AQ / d
    along = (b**2 - c**2 + d2) / (2 * d)  # distance from A to the foot of C on line AQ
    height = sp.sqrt(b**2 - along**2)  # > 0: C to the left of A -> Q, i.e. above line AQ
    C = A + along * u + height * sp.Matrix([-u[1], u[0]])
    angles = (th, sp.atan2(C[1] - A[1], C[0] - A[0]), sp.atan2(C[1] - Q[1], C[0] - Q[0]))
    coms = (A / 2, (A + C) / 2, (Q + C) / 2)
    H = 0
    p_ext = 0
    for m, l, x, phi in zip(masses, lengths, coms, angles):
        dx = x.diff(th)
        izz = m * l**2 / 12  # slender bar about its centre of mass, transverse axis
        H += m * dx.dot(dx) + izz * phi.diff(th) ** 2
        p_ext += m * g.dot(dx)  # -dV/dtheta with V = -sum m g . x
    D = H.diff(th) / 2
    f = lambda e: sp.lambdify(th, e, "numpy", cse=True)  # noqa: E731
    return f(H), f(D), f(p_ext), f(C), f(A)


@pytest.fixture(scope="module")
def reference():
    return _closed_form()


@pytest.fixture(scope="module")
def mech():
    return load_mechanism("fourbar")


def test_closed_form_matches_the_reference_point(reference):
    """The reference doc's C at theta = 0 checks the branch of the closed form itself."""
    C = np.asarray(reference[3](0.0), float).ravel()
    np.testing.assert_allclose(C, [0.215455, 0.0957609], atol=1e-6)


def test_H_h_p_ext_match_lagrangian(mech, reference):
    H_ref, D_ref, p_ref, C_ref, _ = reference
    model = ExactModel(mech)
    thetas = np.linspace(-1.75, 1.75, 71)
    got = np.array([[r.H[0, 0], r.D[0, 0], r.p_ext[0]] for r in (model(np.array([t])) for t in thetas)])
    want = np.array([[float(H_ref(t)), float(D_ref(t)), float(p_ref(t))] for t in thetas])
    # H > 0 everywhere: relative per point. D and p_ext change sign: relative to their scale.
    rel_H = np.abs(got[:, 0] - want[:, 0]) / want[:, 0]
    assert rel_H.max() < 1e-8, rel_H.max()
    for col in (1, 2):
        err = np.abs(got[:, col] - want[:, col]) / np.abs(want[:, col]).max()
        assert err.max() < 1e-8, (col, err.max())
    # h at a velocity, through the Reduced API
    r = model(np.array([0.7]))
    assert r.h(np.array([3.0]))[0] == pytest.approx(9.0 * float(D_ref(0.7)), rel=1e-8)
    # the scale of the values compared is not trivial (a wrong sign or factor would show)
    assert np.ptp(want[:, 1]) > 1e-3 and np.ptp(want[:, 2]) > 0.1


def test_assembly_on_the_branch_above_AQ(mech, reference):
    """The model's C (end of the coupler) equals the closed form's across the range."""
    _, _, _, C_ref, A_ref = reference
    asm = Assembler(mech)
    for t in np.linspace(-1.75, 1.75, 15):
        cfg = asm.solve(np.array([t]))
        C = mech.platform_point(cfg, "coupler", (0.075, 0.0, 0.0))
        A = mech.platform_point(cfg, "input", (0.05, 0.0, 0.0))
        np.testing.assert_allclose(C[:2], np.asarray(C_ref(t), float).ravel(), atol=1e-10)
        np.testing.assert_allclose(A[:2], np.asarray(A_ref(t), float).ravel(), atol=1e-10)
        assert abs(C[2]) < 1e-10
        # C above the line from A to Q
        AQ, AC = np.array([0.2, 0.0]) - A[:2], C[:2] - A[:2]
        assert AQ[0] * AC[1] - AQ[1] * AC[0] > 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_singularity_measure_falls_to_zero(mech, sign):
    asm = Assembler(mech)
    deltas = np.array([0.3, 0.1, 0.03, 0.01, 1e-3, 1e-4, 1e-5])
    sigma = np.array([mech.singularity_measure(asm.solve(np.array([th])), np.array([th]))
                      for th in sign * (THETA_SINGULAR - deltas)])
    assert np.all(np.diff(sigma) < 0), sigma
    assert sigma[-1] < 1e-2 * sigma[0]
    # a limit point: sigma ~ k sqrt(delta), so it reaches 0 at the singular angle
    k = sigma / np.sqrt(deltas)
    assert np.ptp(k[-3:]) < 0.01 * k[-1]
    # inside the tree domain the measure stays well above the model's threshold
    th = np.array([sign * 1.75])
    assert mech.singularity_measure(asm.solve(th), th) > 5 * mech.description.singular_threshold
