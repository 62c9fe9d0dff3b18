"""Reduced-dynamics tree: immutable flat arrays and the numba kernels that evaluate them.

A tree covers the root box [lo, hi] of actuator space (SI: m or rad per axis). Node 0 is the
root. An inner node n splits along ``node_dim[n]`` at ``node_split[n]``: theta[dim] < split goes
to ``node_child[n, 0]``, otherwise to ``node_child[n, 1]``. A leaf has ``node_dim = -1`` and its
leaf index in ``node_child[n, 0]``. Leaf l covers ``leaf_box[l, 0] <= theta <= leaf_box[l, 1]``
and holds, per output o, quadratic coefficients ``coef[l, o, :]`` over the basis
u(z) = (1, z_1..z_s, z_j z_k for j <= k row by row), z = (2 theta - lo_l - hi_l) / (hi_l - lo_l)
in [-1, 1]. ``leaf_ok[l] = 0`` marks a leaf out of the model's domain (cannot be assembled or
too close to a singularity).

Outputs f, in order (``pkrt.models.reduction.output_layout``): H upper triangle row by row,
D row by row (s x s(s+1)/2), p_ext. Equation of motion: H thetadd + D [td td] - p_ext = tau.

The ``*_w`` kernels take a scratch array of ``work_size(s)`` floats and allocate nothing (use
them, or ``TreeWorkspace``, on the online path); ``eval_outputs``, ``eval_model`` and
``eval_tau`` are the same with the scratch allocated per call.

Reference counting: the ``*_w`` kernels are compiled without numba's runtime (``_nrt=False``)
and are called, not inlined. They allocate nothing, so they need no runtime; with it, every
array taken out of the tree tuple or sliced from ``work`` (and every argument of an inlined
kernel) costs an atomic incref/decref call per evaluation that numba cannot prune across the
loops, about a third of the time of an evaluation. ``eval_model_w`` and ``eval_tau_w`` run
the same body with s = 3 as a constant when theta has 3 entries (the Orthoglide), so LLVM
unrolls the small loops. The arithmetic, and its order, is unchanged.

Kernel status codes: OK = 0, CLAMPED = 1 (theta was outside the root box and was clamped),
OUT_OF_DOMAIN = 2 (the leaf is marked out of domain). Status is never silent: callers check it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

OK, CLAMPED, OUT_OF_DOMAIN = 0, 1, 2


def n_basis(s: int) -> int:
    return 1 + s + s * (s + 1) // 2


def n_outputs(s: int) -> int:
    m = s * (s + 1) // 2
    return m + s * m + s


@dataclass(frozen=True)
class Tree:
    """Immutable tree arrays (Pinocchio-style model); ``header`` holds the file metadata."""
    lo: np.ndarray  # (s,) float64
    hi: np.ndarray  # (s,) float64
    node_dim: np.ndarray  # (n_nodes,) int32, -1 for a leaf
    node_split: np.ndarray  # (n_nodes,) float64
    node_child: np.ndarray  # (n_nodes, 2) int32
    leaf_box: np.ndarray  # (n_leaves, 2, s) float64
    leaf_ok: np.ndarray  # (n_leaves,) uint8
    coef: np.ndarray  # (n_leaves, n_out, n_basis) float64
    header: dict = field(default_factory=dict, compare=False)

    @property
    def s(self) -> int:
        return len(self.lo)

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_ok)

    @property
    def arrays(self) -> tuple:
        """The tuple every kernel takes as its first argument."""
        return (self.lo, self.hi, self.node_dim, self.node_split, self.node_child,
                self.leaf_box, self.leaf_ok, self.coef)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


@njit(cache=True, inline="always")
def find_leaf(T, theta, th):
    """Clamp theta into the root box (into th) and return (leaf, status)."""
    lo, hi, node_dim, node_split, node_child = T[0], T[1], T[2], T[3], T[4]
    status = OK
    for i in range(theta.shape[0]):
        x = theta[i]
        if not (x >= lo[i]):  # also catches NaN
            x = lo[i]
            status = CLAMPED
        elif x > hi[i]:
            x = hi[i]
            status = CLAMPED
        th[i] = x
    n = 0
    while node_dim[n] >= 0:
        d = node_dim[n]
        if th[d] < node_split[n]:
            n = node_child[n, 0]
        else:
            n = node_child[n, 1]
    leaf = node_child[n, 0]
    if T[6][leaf] == 0:
        status = OUT_OF_DOMAIN
    return leaf, status


@njit(cache=True, inline="always")
def basis(T, leaf, th, u):
    """Quadratic basis u at th in the box-normalised coordinates of a leaf."""
    box = T[5]
    s = th.shape[0]
    u[0] = 1.0
    for i in range(s):
        u[1 + i] = (2.0 * th[i] - box[leaf, 0, i] - box[leaf, 1, i]) / (box[leaf, 1, i] - box[leaf, 0, i])
    c = 1 + s
    for j in range(s):
        for k in range(j, s):
            u[c] = u[1 + j] * u[1 + k]
            c += 1


def work_size(s: int) -> int:
    """Length of the scratch array the ``*_w`` kernels take: th (s), u (n_basis), [td td]."""
    return s + n_basis(s) + s * (s + 1) // 2


@njit(cache=True, _nrt=False)  # see "Reference counting" above
def eval_outputs_w(T, theta, f, work):
    """Fill the flat outputs f at theta using ``work`` (work_size(s)) as scratch; return the
    status. Allocates nothing."""
    s = theta.shape[0]
    nb = 1 + s + s * (s + 1) // 2
    th = work[:s]
    u = work[s:s + nb]
    leaf, status = find_leaf(T, theta, th)
    basis(T, leaf, th, u)
    cl = T[7][leaf]  # this leaf's (n_out, n_basis) block: 2-d indexing is much faster
    for o in range(f.shape[0]):
        acc = 0.0
        for b in range(nb):
            acc += cl[o, b] * u[b]
        f[o] = acc
    return status


@njit(cache=True, inline="always")
def _model_s(T, theta, H, D, p_ext, work, s):
    """eval_model_w with s = theta.shape[0] passed in (a constant in the s = 3 path)."""
    m = s * (s + 1) // 2
    nb = 1 + s + m
    th = work[:s]
    u = work[s:s + nb]
    leaf, status = find_leaf(T, theta, th)
    basis(T, leaf, th, u)
    cl = T[7][leaf]  # this leaf's (n_out, n_basis) block: 2-d indexing is much faster
    o = 0
    for j in range(s):
        for k in range(j, s):
            acc = 0.0
            for b in range(nb):
                acc += cl[o, b] * u[b]
            H[j, k] = acc
            H[k, j] = acc
            o += 1
    for i in range(s):
        for c in range(m):
            acc = 0.0
            for b in range(nb):
                acc += cl[o, b] * u[b]
            D[i, c] = acc
            o += 1
    for i in range(s):
        acc = 0.0
        for b in range(nb):
            acc += cl[o, b] * u[b]
        p_ext[i] = acc
        o += 1
    return status


@njit(cache=True, _nrt=False)  # see "Reference counting" above
def eval_model_w(T, theta, H, D, p_ext, work):
    """Fill preallocated H (s, s), D (s, s(s+1)/2), p_ext (s,) using ``work`` as scratch;
    return the status. Allocates nothing."""
    if theta.shape[0] == 3:  # s a compile-time constant: LLVM unrolls the small loops
        return _model_s(T, theta, H, D, p_ext, work, 3)
    return _model_s(T, theta, H, D, p_ext, work, theta.shape[0])


@njit(cache=True, inline="always")
def quad_velocities(td, out):
    """[td td] = (td1^2, td1 td2, ..., ts^2), upper triangle, row by row."""
    s = td.shape[0]
    c = 0
    for j in range(s):
        for k in range(j, s):
            out[c] = td[j] * td[k]
            c += 1


@njit(cache=True, inline="always")
def _tau_s(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work, s):
    """eval_tau_w with s = theta.shape[0] passed in (a constant in the s = 3 path)."""
    m = s * (s + 1) // 2
    status = _model_s(T, theta, H, D, p_ext, work, s)
    w = work[s + 1 + s + m:]
    quad_velocities(theta_dot, w)
    for i in range(s):
        acc = -p_ext[i]
        for j in range(s):
            acc += H[i, j] * theta_ddot[j]
        for c in range(m):
            acc += D[i, c] * w[c]
        tau[i] = acc
    return status


@njit(cache=True, _nrt=False)  # see "Reference counting" above
def eval_tau_w(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work):
    """tau = H thetadd + D [td td] - p_ext, filling H, D, p_ext too, using ``work`` as
    scratch; return the status. Allocates nothing (the online path)."""
    if theta.shape[0] == 3:  # s a compile-time constant: LLVM unrolls the small loops
        return _tau_s(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work, 3)
    return _tau_s(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work, theta.shape[0])


@njit(cache=True)
def _scratch(s):
    return np.empty(2 * s + 1 + s * (s + 1))  # work_size(s)


@njit(cache=True)
def eval_outputs(T, theta, f):
    """As eval_outputs_w with a scratch array allocated per call (offline use)."""
    return eval_outputs_w(T, theta, f, _scratch(theta.shape[0]))


@njit(cache=True)
def eval_model(T, theta, H, D, p_ext):
    """As eval_model_w with a scratch array allocated per call (prefer eval_model_w online)."""
    return eval_model_w(T, theta, H, D, p_ext, _scratch(theta.shape[0]))


@njit(cache=True)
def eval_tau(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau):
    """As eval_tau_w with a scratch array allocated per call (prefer eval_tau_w online)."""
    return eval_tau_w(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau,
                      _scratch(theta.shape[0]))


class TreeWorkspace:
    """Preallocated outputs for one tree (the per-cycle data of the Model/Data split)."""

    def __init__(self, tree: Tree):
        s = tree.s
        self.H = np.zeros((s, s))
        self.D = np.zeros((s, s * (s + 1) // 2))
        self.p_ext = np.zeros(s)
        self.tau = np.zeros(s)
        self.work = np.zeros(work_size(s))

    def tau_of(self, tree: Tree, theta, theta_dot, theta_ddot) -> int:
        """Fill H, D, p_ext and tau at a state; return the status. Allocates nothing."""
        return eval_tau_w(tree.arrays, theta, theta_dot, theta_ddot, self.H, self.D, self.p_ext,
                          self.tau, self.work)

    def model_of(self, tree: Tree, theta) -> int:
        """Fill H, D, p_ext at theta; return the status. Allocates nothing."""
        return eval_model_w(tree.arrays, theta, self.H, self.D, self.p_ext, self.work)
