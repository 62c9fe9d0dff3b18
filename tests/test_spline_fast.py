"""The fast spline path (table span lookup, power-form basis, padded rows) against the
reference path (binary search, Cox-de Boor, the file's coefficients) it replaced."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from pkrt.models.trees.shipped import MACHINES
from pkrt.models.trees.splines import fit, spline_tree
from pkrt.rt.core.splinepoly import MAX_BINS, pad_width, span_basis_polys
from pkrt.rt.core.tree import (CLAMPED, OK, SPLINE, eval_outputs, eval_model_w, eval_tau,
                               eval_tau_w,
                               knot_span, n_outputs, span_lookup)
from pkrt.rt.core.workspace import TreeWorkspace
from pkrt.rt.core.treefile import load_tree

from .test_spline_tree import header_for

SHIPPED = sorted(p.name for p in MACHINES.glob("*.pkt"))
SPLINES = [n for n in SHIPPED if load_tree(MACHINES / n).kind == SPLINE]


@njit(cache=False)
def _spans(T, a, xs, fast):
    out = np.empty(len(xs), np.int64)
    for k in range(len(xs)):
        out[k] = span_lookup(T, a, xs[k]) if fast else knot_span(T, a, xs[k])
    return out


def _axis_knots(tree, a):
    return tree.knots[tree.knot_start[a]:tree.knot_start[a] + tree.knot_count[a]]


def _special_points(tree, rng, n: int = 400) -> np.ndarray:
    """States on knot planes (and one ulp either side), on the root box's faces and outside
    it (clamped), mixed with random coordinates on the other axes."""
    pts = []
    for a in range(tree.s):
        t = np.unique(_axis_knots(tree, a))
        vals = np.concatenate([t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf),
                               [tree.lo[a] - 0.1, tree.hi[a] + 0.1]])
        for v in vals:
            for _ in range(max(1, n // len(vals))):
                p = tree.lo + (tree.hi - tree.lo) * rng.random(tree.s)
                p[a] = v
                pts.append(p)
    corners = np.array(np.meshgrid(*[(lo, hi) for lo, hi in zip(tree.lo, tree.hi)])).reshape(tree.s, -1).T
    return np.concatenate([np.array(pts), corners])


def _compare(tree, pts) -> tuple[float, int]:
    """Largest |fast - reference| over each output's largest |reference|; statuses equal."""
    nf = n_outputs(tree.s)
    new, old = np.empty((len(pts), nf)), np.empty((len(pts), nf))
    for k, p in enumerate(pts):
        s_new = eval_outputs(tree.arrays, p, new[k])
        s_old = eval_outputs(tree.reference_arrays, p, old[k])
        assert s_new == s_old, (p, s_new, s_old)
    scale = np.maximum(np.abs(old).max(axis=0), 1e-300)
    return float(np.max(np.abs(new - old) / scale)), len(pts)


@pytest.mark.parametrize("name", SPLINES)
def test_shipped_spline_fast_equals_reference(name):
    tree = load_tree(MACHINES / name)
    rng = np.random.default_rng(7)
    pts = np.concatenate([tree.lo + (tree.hi - tree.lo) * rng.random((10_000, tree.s)),
                          _special_points(tree, rng)])
    err, n = _compare(tree, pts)
    assert n > 10_000 and err < 1e-12


@pytest.mark.parametrize("name", SPLINES)
def test_shipped_spans_equal_binary_search(name):
    tree = load_tree(MACHINES / name)
    rng = np.random.default_rng(8)
    for a in range(tree.s):
        t = np.unique(_axis_knots(tree, a))
        xs = np.concatenate([t, np.nextafter(t, np.inf)[:-1], np.nextafter(t, -np.inf)[1:],
                             rng.uniform(tree.lo[a], tree.hi[a], 5000)])
        assert np.array_equal(_spans(tree.arrays, a, xs, True), _spans(tree.arrays, a, xs, False))


def test_clamped_and_nan_states_keep_their_status():
    tree = load_tree(MACHINES / "orthoglide.pkt")
    f, g = np.empty(n_outputs(3)), np.empty(n_outputs(3))
    for p, st in (((tree.lo + tree.hi) / 2, OK), (tree.hi + 1.0, CLAMPED), (tree.lo - 1.0, CLAMPED),
                  (np.array([np.nan, tree.lo[1], tree.hi[2]]), CLAMPED)):
        assert eval_outputs(tree.arrays, np.array(p, float), f) == st
        assert eval_outputs(tree.reference_arrays, np.array(p, float), g) == st
        assert np.allclose(f, g, rtol=1e-13, atol=0)


@pytest.mark.parametrize("name", [n for n in SHIPPED if n in ("orthoglide.pkt", "delta.pkt")])
def test_tau_along_the_demo_equals_reference(name):
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.machine.config import load_machine

    machine = name.removesuffix(".pkt")
    tree = load_tree(MACHINES / name)
    demo = plan_reference(load_machine(machine), mech=load_mechanism(machine))
    s = tree.s
    ws = TreeWorkspace(tree)
    H, D, p, tau = np.empty((s, s)), np.empty((s, s * (s + 1) // 2)), np.empty(s), np.empty(s)
    taus_new, taus_old = np.empty((demo.n, s)), np.empty((demo.n, s))
    for k in range(demo.n):
        th, td, tdd = demo.pos[k].copy(), demo.vel[k].copy(), demo.acc[k].copy()
        assert ws.tau_of(tree, th, td, tdd) == eval_tau(tree.reference_arrays, th, td, tdd, H, D, p, tau)
        taus_new[k], taus_old[k] = ws.tau, tau
    assert demo.n > 100
    assert np.max(np.abs(taus_new - taus_old)) <= 1e-12 * np.max(np.abs(taus_old))


@pytest.mark.parametrize("s, counts", [(1, (40,)), (2, (7, 12)), (3, (6, 5, 9))])
def test_random_graded_grids_equal_reference(s, counts):
    """Strongly graded knots (intervals over 3 orders of magnitude: the bin table's cap)."""
    rng = np.random.default_rng(s)
    lo, hi = -1.0 + np.arange(s), 1.0 + np.arange(s)
    xs = []
    for a, n in enumerate(counts):
        inner = lo[a] + (hi[a] - lo[a]) * np.sort(rng.random(n - 2)) ** 6
        xs.append(np.unique(np.concatenate([[lo[a]], inner, [hi[a]]])))
    V = rng.standard_normal((*[len(x) for x in xs], n_outputs(s)))
    knots, C = fit(xs, V)
    tree = spline_tree(lo, hi, knots, C, header_for(s, lo, hi))
    err, _ = _compare(tree, np.concatenate([lo + (hi - lo) * rng.random((3000, s)),
                                            _special_points(tree, rng, 100)]))
    assert err < 1e-12
    widths = np.concatenate([np.diff(np.unique(k)) for k in knots])
    assert widths.max() / widths.min() > 100  # the test is about graded grids
    assert tree.arrays[14][:, 1].max() <= MAX_BINS + 1  # SPAN_AXIS bin counts capped


def test_span_polynomials_are_the_b_splines():
    from scipy.interpolate import BSpline

    t = np.array([0, 0, 0, 0, 0.1, 0.5, 0.6, 1.0, 1, 1, 1], float)
    for i in range(3, len(t) - 4):
        P = span_basis_polys(t, i)
        for u in (0.0, 0.3, 1.0):
            x = t[i] + u * (t[i + 1] - t[i])
            for k in range(4):
                ref = BSpline.basis_element(t[i - 3 + k:i + 2 + k], extrapolate=False)(x)
                ref = 0.0 if np.isnan(ref) else ref
                if x == t[i + 1]:  # basis_element is right-open: its limit from the left
                    ref = BSpline(t, np.eye(len(t) - 4)[i - 3 + k], 3)(x)
                assert abs(np.polyval(P[k, ::-1], u) - ref) < 1e-14
    assert [pad_width(n) for n in (3, 4, 27, 28, 81)] == [4, 4, 28, 28, 84]


def test_workspace_python_path_equals_dispatcher_for_any_input():
    tree = load_tree(MACHINES / "orthoglide.pkt")
    ws = TreeWorkspace(tree)
    H, D, p, tau = np.empty((3, 3)), np.empty((3, 6)), np.empty(3), np.empty(3)
    th = (tree.lo + tree.hi) / 2
    td, tdd = np.array([0.1, -0.2, 0.3]), np.array([1.0, 2.0, -3.0])
    eval_tau_w(tree.arrays, th, td, tdd, H, D, p, tau, np.zeros(ws.work.shape))
    wide = np.zeros((3, 2))
    wide[:, 0] = th  # a strided view: copied into contiguous vectors, same values
    compiled = (len(eval_tau_w.signatures), len(eval_model_w.signatures))
    for args in ((th, td, tdd), (wide[:, 0], td, tdd), (th, td[::-1][::-1].copy(), tdd),
                 (list(th), td.tolist(), tdd)):
        assert ws.tau_of(tree, *args) == OK and np.array_equal(ws.tau, tau)
    assert ws.model_of(tree, wide[:, 0]) == OK and np.array_equal(ws.H, H)
    assert ws.tau_of(tree, th, td, np.array([1, 2, -3])) == OK and np.array_equal(ws.tau, tau)  # integers
    # ... and numba compiled nothing new for them (a new layout costs a minute of compiling)
    assert (len(eval_tau_w.signatures), len(eval_model_w.signatures)) == compiled
    other = load_tree(MACHINES / "orthoglide.pkt")  # another tree object: the dispatcher path
    assert ws.tau_of(other, th, td, tdd) == OK and np.array_equal(ws.tau, tau)


def test_workspace_refuses_a_state_that_is_not_s_numbers():
    tree = load_tree(MACHINES / "orthoglide.pkt")
    ws = TreeWorkspace(tree)
    th, td = (tree.lo + tree.hi) / 2, np.zeros(3)
    other = load_tree(MACHINES / "orthoglide.pkt")
    bad = (np.zeros(2), np.zeros(4), np.zeros((3, 1)), np.zeros((1, 3)), "abc", 1.0, [1, 2],
           np.array(["a", "b", "c"]), np.zeros(3, complex))
    for x in bad:
        for call in (lambda: ws.tau_of(tree, th, x, td), lambda: ws.tau_of(tree, x, td, td),
                     lambda: ws.model_of(tree, x)):
            with pytest.raises(ValueError, match="a state vector must be 3 real numbers"):
                call()
    for x in bad[:2]:  # another tree object: the dispatcher's path, the kernel's shape check
        with pytest.raises(ValueError, match="a state vector must be 3 real numbers"):
            ws.tau_of(other, th, td, x)
    assert ws.tau_of(tree, th, td, td) == OK  # the workspace still works
