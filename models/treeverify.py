"""Exact-model sampling (parallel, deterministic) and verification of a tree against it.

``SampleEvaluator`` evaluates the exact reduced model at many configurations over processes.
Points are cut into fixed chunks that do not depend on the number of processes, and every
chunk starts its ExactModel from the reference assembly, so the results are bit-identical
whatever ``jobs`` is. ``verify_tree`` compares a tree with the exact model at seeded random
states and reports relative errors (see its docstring for the definitions and bounds).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from pkrt.rt.errors import UserError
from pkrt.rt.tree import (OUT_OF_DOMAIN, SPLINE, Tree, basis, eval_outputs, eval_tau, find_leaf, n_basis,
                          spline_face_jumps)

from .mechanism import AssemblyError, Mechanism
from .reduction import ExactModel, flatten_outputs, output_layout

MAX_SAMPLES = 10 ** 7  # verification states (memory: about 100 bytes per state and output)
CHUNK = 24  # points per chunk; fixed so results do not depend on the process count

# default verification bounds, per axis, as multiples of the actuator range (hi - lo)
VELOCITY_RANGES_PER_S = 2.0  # |theta_dot_i| <= 2 (hi_i - lo_i) / s
ACCELERATION_RANGES_PER_S2 = 20.0  # |theta_ddot_i| <= 20 (hi_i - lo_i) / s^2

_worker_model: ExactModel | None = None


def _init_worker(mech: Mechanism) -> None:
    global _worker_model
    _worker_model = ExactModel(mech)


def eval_chunk(model: ExactModel, thetas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact flat outputs (n, n_out) and singularity measures (n,) at thetas, in order,
    starting from the reference assembly. A point that cannot be assembled gets NaN outputs
    and a measure of 0."""
    mech = model.mech
    s = mech.n_act
    n_out = len(output_layout(s))
    F = np.full((len(thetas), n_out), np.nan)
    sing = np.zeros(len(thetas))
    model.assembler.reset()
    for i, th in enumerate(thetas):
        try:
            r = model(th)
            f = flatten_outputs(r.H, r.D, r.p_ext)
            sg = mech.singularity_measure(r.config, th)
        except (AssemblyError, np.linalg.LinAlgError):
            continue
        if np.all(np.isfinite(f)):
            F[i], sing[i] = f, sg
    return F, sing


def _worker_chunk(thetas: np.ndarray):
    return eval_chunk(_worker_model, thetas)


class SampleEvaluator:
    """Exact model over processes: ``evaluate(thetas)`` -> (F, sing). Use as a context
    manager; ``jobs=1`` runs in this process. Progress goes to a tqdm bar on stderr only when
    stderr is a terminal (or ``progress`` says otherwise)."""

    def __init__(self, mech: Mechanism, jobs: int | None = None, progress: bool | None = None,
                 desc: str = "exact model"):
        self.mech = mech
        cores = os.cpu_count() or 1
        # results do not depend on jobs: more processes than a few per core only cost forks
        self.jobs = max(1, min(jobs or cores, 4 * max(2, cores)))
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.desc = desc
        self.pool: ProcessPoolExecutor | None = None
        self.model: ExactModel | None = None
        self.n_evaluated = 0

    def __enter__(self) -> "SampleEvaluator":
        if self.jobs > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=ctx, initializer=_init_worker,
                                            initargs=(self.mech,))
        else:
            self.model = ExactModel(self.mech)
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def evaluate(self, thetas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """thetas (n, s), already in a spatially coherent order (warm starts follow it)."""
        thetas = np.asarray(thetas, float).reshape(-1, self.mech.n_act)
        n = len(thetas)
        chunks = [thetas[i:i + CHUNK] for i in range(0, n, CHUNK)]
        from tqdm import tqdm
        bar = tqdm(total=n, desc=self.desc, unit="pt", file=sys.stderr, disable=not self.progress,
                   leave=False)
        results: list = [None] * len(chunks)
        try:
            if self.pool is None:
                for k, c in enumerate(chunks):
                    results[k] = eval_chunk(self.model, c)
                    bar.update(len(c))
            else:
                futures = {self.pool.submit(_worker_chunk, c): k for k, c in enumerate(chunks)}
                from concurrent.futures import as_completed
                for fut in as_completed(futures):
                    k = futures[fut]
                    results[k] = fut.result()
                    bar.update(len(chunks[k]))
        finally:
            bar.close()
        self.n_evaluated += n
        n_out = len(output_layout(self.mech.n_act))
        if not results:
            return np.zeros((0, n_out)), np.zeros(0)
        return (np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results]))


def spatial_order(thetas: np.ndarray, lo: np.ndarray, hi: np.ndarray, cells: int = 8) -> np.ndarray:
    """A permutation visiting points cell by cell (cells per axis), so warm starts stay short."""
    u = (thetas - lo) / (hi - lo)
    cell = np.clip((u * cells).astype(int), 0, cells - 1)
    keys = [thetas[:, d] for d in reversed(range(thetas.shape[1]))]
    keys += [cell[:, d] for d in reversed(range(thetas.shape[1]))]
    return np.lexsort(keys)


def output_groups(s: int) -> dict[str, slice]:
    """Slices of the flat outputs: H, D, p_ext."""
    m = s * (s + 1) // 2
    return {"H": slice(0, m), "D": slice(m, m + s * m), "p_ext": slice(m + s * m, m + s * m + s)}


def output_scale(F: np.ndarray, s: int, floor: float = 1e-6) -> np.ndarray:
    """Per output: largest |f| over the finite rows of F, floored at ``floor`` times the
    largest of its group (so structurally zero outputs do not divide by round-off)."""
    finite = np.all(np.isfinite(F), axis=1)
    big = np.abs(F[finite]).max(axis=0) if finite.any() else np.ones(F.shape[1])
    out = big.copy()
    for sl in output_groups(s).values():
        g = big[sl].max() if big[sl].size else 0.0
        out[sl] = np.maximum(big[sl], floor * g if g > 0 else 1.0)
    return out


def tree_outputs(tree: Tree, thetas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tree outputs (n, n_out) and status codes (n,) at thetas (offline helper)."""
    T = tree.arrays
    F = np.empty((len(thetas), tree.coef.shape[1]))
    st = np.empty(len(thetas), dtype=np.int64)
    for i, th in enumerate(np.ascontiguousarray(thetas, dtype=float)):
        st[i] = eval_outputs(T, th, F[i])
    return F, st


def leaf_value(tree: Tree, leaf: int, theta: np.ndarray) -> np.ndarray:
    """The polynomial of one leaf at theta (no leaf search), flat outputs."""
    u = np.empty(n_basis(tree.s))
    basis(tree.arrays, leaf, np.ascontiguousarray(theta, dtype=float), u)
    return tree.coef[leaf] @ u


def face_jumps(tree: Tree, scale: np.ndarray, per_face: int = 3) -> tuple[float, int, list]:
    """Largest relative jump of any output across internal leaf faces (spline trees: across
    the interior knot planes, ``pkrt.rt.tree.spline_face_jumps``).

    For each leaf's upper face on each axis that is not on the root boundary, points on a
    per_face^(s-1) grid inside the face are evaluated with this leaf's polynomial and with the
    leaf on the other side (found by the tree search at the face). Jumps are |f1 - f2| / scale.
    Returns (max jump, faces checked, theta of the max)."""
    s, T = tree.s, tree.arrays
    if tree.kind == SPLINE:  # the pieces on both sides of every interior knot plane
        worst, faces, at = spline_face_jumps(T, np.asarray(scale, float), per_face)
        return float(worst), int(faces), at.tolist() if worst > 0 else []
    fr = (np.arange(per_face) + 0.5) / per_face
    grid = np.array(np.meshgrid(*([fr] * (s - 1)), indexing="ij")).reshape(s - 1, -1).T \
        if s > 1 else np.zeros((1, 0))
    worst, where, faces = 0.0, [], 0
    th = np.empty(s)
    for leaf in range(tree.n_leaves):
        if not tree.leaf_ok[leaf]:
            continue
        blo, bhi = tree.leaf_box[leaf]
        for d in range(s):
            if bhi[d] >= tree.hi[d]:
                continue
            others = [k for k in range(s) if k != d]
            faces += 1
            for g in grid:
                p = blo.copy()
                p[d] = bhi[d]
                for j, k in enumerate(others):
                    p[k] = blo[k] + (bhi[k] - blo[k]) * g[j]
                other, status = find_leaf(T, p, th)
                if status == OUT_OF_DOMAIN:
                    continue
                jump = np.max(np.abs(leaf_value(tree, leaf, p) - leaf_value(tree, other, p)) / scale)
                if jump > worst:
                    worst, where = float(jump), p.tolist()
    return worst, faces, where


def parse_region(tree: Tree, region) -> tuple[np.ndarray, np.ndarray]:
    """Region as (lo, hi) per axis from 2 numbers (all axes) or 2 s numbers (lo1, hi1, ...)."""
    if region is None:
        return tree.lo.copy(), tree.hi.copy()
    r = np.asarray(region, float)
    s = tree.s
    if r.size == 2:
        r = np.tile(r, s)
    if r.size != 2 * s:
        raise UserError(f"--region needs 2 or {2 * s} numbers (lo,hi per axis), got {r.size}")
    lo, hi = r[0::2], r[1::2]
    if not np.all(lo < hi) or np.any(lo < tree.lo) or np.any(hi > tree.hi):
        raise UserError(f"--region must have lo < hi inside the tree's box "
                        f"{np.c_[tree.lo, tree.hi].tolist()}, got {np.c_[lo, hi].tolist()}")
    return lo, hi


def verify_tree(tree: Tree, mech: Mechanism, samples: int = 2000, seed: int = 0,
                region=None, jobs: int | None = None, progress: bool | None = None,
                evaluator: SampleEvaluator | None = None, diagonal: bool = False) -> dict:
    """Compare a tree with the exact model at ``samples`` seeded random states.

    theta is uniform in the region (default: the tree's root box); theta_dot and theta_ddot
    are uniform within +/-VELOCITY_RANGES_PER_S and +/-ACCELERATION_RANGES_PER_S2 times the
    actuator range per second (per second squared). Errors are relative to scales:
    coefficient errors |f_hat - f| / scale_o with scale_o the largest |f_o| over the domain
    (the tree header's ``output_scale``), tau errors |tau_hat_i - tau_i| / max |tau_i| over
    the samples. Samples the tree reports out of domain or the model cannot assemble are
    counted, not compared. ``diagonal``: theta on the region's diagonal from its lower to
    its upper corner (evenly spaced, the paper's Figure 5) instead of uniform random.
    """
    if not 1 <= samples <= MAX_SAMPLES:
        raise UserError(f"--samples must be in 1..{MAX_SAMPLES}, got {samples}")
    s = tree.s
    rlo, rhi = parse_region(tree, region)
    rng = np.random.default_rng(seed)
    width = tree.hi - tree.lo
    vmax, amax = VELOCITY_RANGES_PER_S * width, ACCELERATION_RANGES_PER_S2 * width
    theta = rlo + (rhi - rlo) * rng.random((samples, s))
    if diagonal:
        theta = rlo + (rhi - rlo) * np.linspace(0.0, 1.0, samples)[:, None]
    td = vmax * (2 * rng.random((samples, s)) - 1)
    tdd = amax * (2 * rng.random((samples, s)) - 1)
    order = spatial_order(theta, rlo, rhi)
    theta, td, tdd = theta[order], td[order], tdd[order]

    if evaluator is None:
        with SampleEvaluator(mech, jobs, progress, desc="verify") as ev:
            F, sing = ev.evaluate(theta)
    else:
        F, sing = evaluator.evaluate(theta)
    Fh, status = tree_outputs(tree, theta)
    scale = np.asarray(tree.header.get("output_scale") or output_scale(F, s), float)

    exact_ok = np.all(np.isfinite(F), axis=1)
    tree_ok = status != OUT_OF_DOMAIN
    both = exact_ok & tree_ok
    rel = np.abs(Fh[both] - F[both]) / scale
    names = output_layout(s)
    report: dict = {
        "samples": samples, "seed": seed,
        "sampling": "diagonal" if diagonal else "uniform random",
        "region": np.c_[rlo, rhi].tolist(),
        "velocity_bound": vmax.tolist(), "acceleration_bound": amax.tolist(),
        "compared": int(both.sum()),
        "out_of_domain_samples": int((~tree_ok).sum()),
        "exact_failed_samples": int((~exact_ok).sum()),
        "tree_in_domain_but_exact_failed": int((tree_ok & ~exact_ok).sum()),
    }
    if rel.size:
        i, o = np.unravel_index(int(np.argmax(rel)), rel.shape)
        report["max_rel_coef_error"] = float(rel.max())
        report["worst_output"] = names[o]
        report["worst_theta"] = theta[both][i].tolist()
        report["mean_rel_coef_error"] = float(rel.mean())
        report["group_max_rel_error"] = {g: float(rel[:, sl].max()) for g, sl in output_groups(s).items()}
        # tau = H tdd + D [td td] - p_ext, exact and from the tree kernel
        tau = np.empty((samples, s))
        tau_h = np.empty((samples, s))
        H, D, p = np.empty((s, s)), np.empty((s, s * (s + 1) // 2)), np.empty(s)
        from .reduction import quadratic_velocities, unflatten_outputs
        for k in np.flatnonzero(both):
            He, De, pe = unflatten_outputs(F[k], s)
            tau[k] = He @ tdd[k] + De @ quadratic_velocities(td[k]) - pe
            out = np.empty(s)
            eval_tau(tree.arrays, theta[k], td[k], tdd[k], H, D, p, out)
            tau_h[k] = out
        tscale = np.abs(tau[both]).max(axis=0)
        tscale = np.where(tscale > 0, tscale, 1.0)
        report["max_rel_tau_error"] = float((np.abs(tau_h[both] - tau[both]) / tscale).max())
    else:
        report["max_rel_coef_error"] = None
        report["max_rel_tau_error"] = None
    jump, faces, at = face_jumps(tree, scale)
    report["max_face_jump"] = jump
    report["faces_checked"] = faces
    report["worst_face_theta"] = at
    return report


__all__ = ["SampleEvaluator", "eval_chunk", "verify_tree", "face_jumps", "output_scale",
           "output_groups", "tree_outputs", "spatial_order", "parse_region",
           "VELOCITY_RANGES_PER_S", "ACCELERATION_RANGES_PER_S2"]
