"""Kinematics: assembly, branch continuity across large steps, failures, redundancy, mobility.

Closed forms and constraint Jacobians are written here from the reference geometry
(``shared/reference-models.md``), independently of the model code.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from pkrt.models.kinematics.mechanism import AssemblyError, Config, load_mechanism
from pkrt.models.kinematics.assembly import Assembler
from pkrt.rt.cli import main

L_ORTHO = 0.31


@pytest.fixture(scope="module")
def fourbar():
    return load_mechanism("fourbar")


@pytest.fixture(scope="module")
def fivebar():
    return load_mechanism("fivebar")


@pytest.fixture(scope="module")
def orthoglide():
    return load_mechanism("orthoglide")


# -- closed forms ----------------------------------------------------------------------------

def circle_point(p1, r1, p2, r2):
    """Intersection of circles (p1, r1), (p2, r2) to the left of the direction p1 -> p2."""
    d = p2 - p1
    dist = np.hypot(*d)
    u = d / dist
    along = (r1**2 - r2**2 + dist**2) / (2 * dist)
    return p1 + along * u + np.sqrt(r1**2 - along**2) * np.array([-u[1], u[0]])


def fourbar_C(theta):
    A = 0.1 * np.array([np.cos(theta), np.sin(theta)])
    return circle_point(A, 0.15, np.array([0.2, 0.0]), 0.097)  # C above the line A -> Q


def fivebar_P(theta):
    B1 = np.array([-0.05, 0.0]) + 0.15 * np.array([np.cos(theta[0]), np.sin(theta[0])])
    B2 = np.array([0.05, 0.0]) + 0.15 * np.array([np.cos(theta[1]), np.sin(theta[1])])
    return circle_point(B1, 0.2, B2, 0.2)  # P above the elbows


def orthoglide_theta(P):
    """Inverse kinematics closed form: theta_i = P_i + sqrt(L^2 - sum_{j != i} P_j^2) - L."""
    return np.array([P[i] + np.sqrt(L_ORTHO**2 - (P @ P - P[i] ** 2)) - L_ORTHO for i in range(3)])


def orthoglide_on_branch(P, theta):
    return np.sum(P / (L_ORTHO + theta)) < 1.0


# -- redundancy and mobility, from Jacobians written here --------------------------------------

def _skew(r):
    return np.array([[0, -r[2], r[1]], [r[2], 0, -r[0]], [-r[1], r[0], 0]])


class VelocityJacobian:
    """Rows of the velocity constraints of joints between bodies with world-frame twists
    (v_b, w_b) per body; body -1 is ground."""

    def __init__(self, n_bodies):
        self.n = 6 * n_bodies
        self.rows = []

    def _row(self):
        self.rows.append(np.zeros(self.n))
        return self.rows[-1]

    def point(self, i, xi, j, xj, p):
        """v_i + w_i x (p - x_i) = v_j + w_j x (p - x_j) (3 rows)."""
        block = np.zeros((3, self.n))
        for b, x, sgn in ((i, xi, 1.0), (j, xj, -1.0)):
            if b >= 0:
                block[:, 6 * b:6 * b + 3] = sgn * np.eye(3)
                block[:, 6 * b + 3:6 * b + 6] = -sgn * _skew(p - x)
        self.rows += list(block)

    def perpendicular(self, i, a, j, c):
        """d/dt (a . c) = 0 for a fixed in body i, c fixed in body j (world vectors now)."""
        r = self._row()
        n = np.cross(a, c)
        if i >= 0:
            r[6 * i + 3:6 * i + 6] = n
        if j >= 0:
            r[6 * j + 3:6 * j + 6] = -n

    def slide(self, i, j, e):
        """Relative translation of j on i only along e, no relative rotation (i = ground)."""
        assert i < 0
        u = np.cross(e, [1.0, 0, 0] if abs(e[0]) < 0.9 else [0, 1.0, 0])
        u /= np.linalg.norm(u)
        for d in (u, np.cross(e, u)):
            r = self._row()
            r[6 * j:6 * j + 3] = d
        for k in range(3):
            r = self._row()
            r[6 * j + 3 + k] = 1.0

    def revolute_z(self, i, xi, j, xj, p):
        self.point(i, xi, j, xj, p)
        self.perpendicular(i, np.array([1.0, 0, 0]), j, np.array([0, 0, 1.0]))
        self.perpendicular(i, np.array([0, 1.0, 0]), j, np.array([0, 0, 1.0]))

    def rank(self):
        J = np.array(self.rows)
        sv = np.linalg.svd(J, compute_uv=False)
        return J.shape[0], int(np.sum(sv > 1e-9 * sv[0]))


def test_fourbar_redundancy_independent(fourbar):
    """Planar four-bar in spatial coordinates: 18 coordinates, 20 rows, rank 17: 3 redundant
    (spatial Grubler 18 - 20 = -2 against the true mobility 1), not 2."""
    th = 0.3
    O, Q = np.zeros(2), np.array([0.2, 0.0])
    A = 0.1 * np.array([np.cos(th), np.sin(th)])
    C = fourbar_C(th)
    P = lambda v: np.array([v[0], v[1], 0.0])  # noqa: E731
    x = [P((O + A) / 2), P((A + C) / 2), P((Q + C) / 2)]
    J = VelocityJacobian(3)
    J.revolute_z(-1, None, 0, x[0], P(O))
    J.revolute_z(0, x[0], 1, x[1], P(A))
    J.revolute_z(1, x[1], 2, x[2], P(C))
    J.revolute_z(-1, None, 2, x[2], P(Q))
    rows, rank = J.rank()
    assert (rows, rank) == (20, 17)
    assert fourbar.n_passive == rows
    assert len(fourbar.independent) == rank
    assert fourbar.n_redundant == rows - rank == 3
    assert fourbar.n_coords - rank == fourbar.n_act == 1


def test_fivebar_redundancy_independent(fivebar):
    th = np.array([1.9, np.pi - 1.9])
    A = [np.array([-0.05, 0.0]), np.array([0.05, 0.0])]
    B = [A[k] + 0.15 * np.array([np.cos(th[k]), np.sin(th[k])]) for k in range(2)]
    Pe = fivebar_P(th)
    P = lambda v: np.array([v[0], v[1], 0.0])  # noqa: E731
    x = [P((A[0] + B[0]) / 2), P((A[1] + B[1]) / 2), P((B[0] + Pe) / 2), P((B[1] + Pe) / 2)]
    J = VelocityJacobian(4)
    J.revolute_z(-1, None, 0, x[0], P(A[0]))
    J.revolute_z(-1, None, 1, x[1], P(A[1]))
    J.revolute_z(0, x[0], 2, x[2], P(B[0]))
    J.revolute_z(1, x[1], 3, x[3], P(B[1]))
    J.revolute_z(2, x[2], 3, x[3], P(Pe))
    rows, rank = J.rank()
    assert (rows, rank) == (25, 22)
    assert (fivebar.n_passive, len(fivebar.independent), fivebar.n_redundant) == (25, 22, 3)
    assert fivebar.n_coords - rank == fivebar.n_act == 2


def test_orthoglide_redundancy_independent(orthoglide):
    """3-PUU at theta = 0 (P = 0, legs along the axes): 42 coordinates, 39 rows, rank 39."""
    e = np.eye(3)
    r, L = 0.05, L_ORTHO
    J = VelocityJacobian(7)
    # bodies in file order: slider1, leg1, slider2, leg2, slider3, leg3, platform
    platform = 6
    axes = [(e[2], e[1]), (e[0], e[2]), (e[1], e[0])]  # (a_i, b_i)
    for i in range(3):
        slider, leg = 2 * i, 2 * i + 1
        B = (r + L) * e[i]
        Cp = r * e[i]
        xs, xl = B, (B + Cp) / 2
        a, b = axes[i]
        J.slide(-1, slider, e[i])
        J.point(slider, xs, leg, xl, B)  # slider-side U: a in the slider, b in the leg
        J.perpendicular(slider, a, leg, b)
        J.point(leg, xl, platform, np.zeros(3), Cp)  # platform side: b in the leg, a in the platform
        J.perpendicular(leg, b, platform, a)
    rows, rank = J.rank()
    assert (rows, rank) == (39, 39)
    assert (orthoglide.n_passive, len(orthoglide.independent), orthoglide.n_redundant) == (39, 39, 0)
    assert orthoglide.n_coords - rank == orthoglide.n_act == 3


# -- assembly --------------------------------------------------------------------------------

def test_config_step_is_the_rotation_vector_exponential():
    rng = np.random.default_rng(3)
    R0 = Rotation.random(4, random_state=4).as_matrix()
    cfg = Config(rng.normal(size=(4, 3)), R0)
    for scale in (1.0, 1e-3, 1e-6, 1e-9, 0.0):
        dq = rng.normal(size=24) * scale
        new = cfg.step(dq)
        d = dq.reshape(4, 6)
        np.testing.assert_allclose(new.X, cfg.X + d[:, :3], rtol=0, atol=1e-15)
        want = Rotation.from_rotvec(d[:, 3:]).as_matrix() @ R0
        np.testing.assert_allclose(new.R, want, rtol=0, atol=2e-15)
    np.testing.assert_array_equal(cfg.R, R0)  # step returns a new configuration


def test_assembly_residual_and_orthonormal_rotations(orthoglide):
    asm = Assembler(orthoglide)
    rng = np.random.default_rng(5)
    lo, hi = orthoglide.ranges.T
    for _ in range(40):  # a long walk: rotations must not drift off SO(3)
        th = rng.uniform(lo, hi)
        cfg = asm.solve(th)
        phi, _, _ = orthoglide.evaluate(cfg, th)
        assert np.abs(phi).max() < 1e-12
    RtR = np.einsum("bji,bjk->bik", cfg.R, cfg.R)
    np.testing.assert_allclose(RtR, np.broadcast_to(np.eye(3), RtR.shape), atol=1e-13)


def test_q_theta_is_the_derivative_of_the_assembly(orthoglide):
    """Prediction matrix q_theta (eq. 11) against central differences of assembled positions."""
    asm = Assembler(orthoglide)
    th = np.array([-0.1, 0.02, -0.2])
    qt = asm.q_theta(asm.solve(th), th)
    h = 1e-3
    for k in range(3):
        dth = np.zeros(3)
        dth[k] = h
        X = {j: asm.solve(th + j * dth).X for j in (-2, -1, 1, 2)}
        dX = (8 * (X[1] - X[-1]) - (X[2] - X[-2])) / (12 * h)  # (bodies, 3), O(h^4)
        np.testing.assert_allclose(dX, qt.reshape(-1, 6, 3)[:, :3, k], rtol=0, atol=1e-8)
        assert np.abs(dX).max() > 0.1


def test_fourbar_branch_across_large_steps(fourbar):
    asm = Assembler(fourbar)
    for th in (1.75, -1.75, 1.7, 0.0, -1.6, 1.75):  # steps up to the whole range
        cfg = asm.solve(np.array([th]))
        C = fourbar.platform_point(cfg, "output", (0.0485, 0.0, 0.0))
        np.testing.assert_allclose(C[:2], fourbar_C(th), atol=1e-10)


def test_fivebar_branch_across_large_steps(fivebar):
    asm = Assembler(fivebar)
    lo, hi = fivebar.ranges.T
    for th in ([hi[0], lo[1]], [lo[0], hi[1]], [hi[0], hi[1]], [lo[0], lo[1]], [1.9, 1.2415927]):
        th = np.array(th)
        cfg = asm.solve(th)
        P = fivebar.platform_point(cfg, "distal1", (0.1, 0.0, 0.0))
        np.testing.assert_allclose(P[:2], fivebar_P(th), atol=1e-10)


def test_orthoglide_branch_across_large_steps(orthoglide):
    """Jumps from corner to corner of the box stay on the working branch (the mirror assembly
    P = (2L/3)(1, 1, 1) at theta = 0 satisfies B_i . e_i > C_i . e_i too)."""
    asm = Assembler(orthoglide)
    corners = [np.array(c) for c in ([-0.26] * 3, [0.06] * 3, [0.06, -0.26, 0.06],
                                     [-0.26, 0.06, -0.26], [0.0] * 3)]
    for th in corners:
        P = orthoglide.platform_point(asm.solve(th), "platform")
        np.testing.assert_allclose(orthoglide_theta(P), th, rtol=0, atol=1e-10)
        assert orthoglide_on_branch(P, th)
    np.testing.assert_allclose(orthoglide.platform_point(asm.solve(np.full(3, -0.26)), "platform"),
                               np.full(3, -0.16075311), atol=1e-8)
    np.testing.assert_allclose(orthoglide.platform_point(asm.solve(np.full(3, 0.06)), "platform"),
                               np.full(3, 0.08319468), atol=1e-8)


def test_large_step_equals_small_steps(orthoglide):
    a, b = Assembler(orthoglide), Assembler(orthoglide)
    target = np.array([0.05, -0.25, -0.1])
    for t in np.linspace(0, 1, 41)[1:]:
        cfg_small = a.solve(t * target)
    cfg_big = b.solve(target)
    np.testing.assert_allclose(cfg_big.X, cfg_small.X, atol=1e-12)
    np.testing.assert_allclose(cfg_big.R, cfg_small.R, atol=1e-12)


# -- failures --------------------------------------------------------------------------------

def test_fourbar_beyond_the_limit_fails_clearly(fourbar):
    asm = Assembler(fourbar)
    with pytest.raises(AssemblyError) as e:
        asm.solve(np.array([1.9]))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("cannot assemble fourbar at theta = [1.9]: Newton residual ")
    assert "condition number" in msg
    # the assembler is still usable, and still on its branch
    cfg = asm.solve(np.array([1.0]))
    np.testing.assert_allclose(fourbar.platform_point(cfg, "output", (0.0485, 0, 0))[:2],
                               fourbar_C(1.0), atol=1e-10)


def test_orthoglide_out_of_reach_fails_clearly(orthoglide):
    asm = Assembler(orthoglide)
    with pytest.raises(AssemblyError, match=r"cannot assemble orthoglide at theta = \[0.06, 0.06, 0.2\]: "
                                            r"Newton residual [0-9.e+-]+ after 25 iterations, Jacobian "
                                            r"inverse condition number [0-9.e+-]+$"):
        asm.solve(np.array([0.06, 0.06, 0.2]))


def test_cannot_assemble_through_the_cli(capsys):
    code = main(["model", "eval", "orthoglide", "--theta", "0.06,0.06,0.2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("pkrt: error: cannot assemble orthoglide at theta = [0.06, 0.06, 0.2]")
    assert "residual" in lines[0] and "condition number" in lines[0]


def test_mobility_and_singularity_reported(fourbar, fivebar, orthoglide):
    for mech in (fourbar, fivebar, orthoglide):
        assert mech.n_coords - len(mech.independent) == mech.n_act
        sigma = mech.singularity_measure(mech.ref_config, mech.theta_ref)
        assert sigma > mech.description.singular_threshold


@pytest.mark.parametrize("theta", [[0.0, 0.0], [0.0, np.nan, 0.0], [0.0, np.inf, 0.0], [[0.0, 0.0, 0.0, 0.0]]])
def test_bad_theta_is_refused_before_the_kernels(orthoglide, theta):
    asm = Assembler(orthoglide)
    with pytest.raises(AssemblyError, match=r"cannot assemble orthoglide at theta = .*: expected 3 finite value\(s\)"):
        asm.solve(theta)
    from pkrt.models.reduction.exact import reduce_at

    with pytest.raises(AssemblyError, match="expected 3 finite"):
        reduce_at(orthoglide, orthoglide.ref_config, theta)


def test_lu_kernels_match_numpy_and_detect_singularity():
    from pkrt.models.kinematics.constraints import lu_factor, lu_solve

    rng = np.random.default_rng(9)
    A = rng.normal(size=(12, 12))
    A[:, 3] *= 1e-6  # needs pivoting
    B = rng.normal(size=(12, 4))
    LU, piv = A.copy(), np.empty(12, dtype=np.int64)
    assert lu_factor(LU, piv)
    X = B.copy()
    lu_solve(LU, piv, X)
    np.testing.assert_allclose(X, np.linalg.solve(A, B), rtol=1e-9)
    S = A.copy()
    S[:, 7] = 0.0  # a coordinate no row constrains: the elimination meets an exact zero pivot
    assert not lu_factor(S, piv)


@pytest.mark.parametrize("theta", ["1e308", "-1e308", "1e12"])
def test_model_eval_theta_far_outside_the_ranges_is_a_usage_error(theta, capsys):
    """A huge --theta gave an OverflowError traceback (1e308: the walk's sub-step count) or a
    walk of ~1e13 sub-steps; a theta more than a range width outside the ranges is refused."""
    code = main(["model", "eval", "fourbar", f"--theta={theta}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pkrt: error: --theta: ") and "range" in lines[0], err
    # slightly outside still evaluates, with a warning
    assert main(["model", "eval", "fourbar", "--theta", "-1.8", "--json"]) == 0
    assert "warning" in capsys.readouterr().out
