"""Exact-model sampling (parallel, deterministic) and verification of a tree against it.

``SampleEvaluator`` evaluates the exact reduced model at many configurations over processes.
Points are cut into fixed chunks that do not depend on the number of processes, and every
chunk starts its ExactModel from the reference assembly, so the results are bit-identical
whatever ``jobs`` is. ``verify_tree`` compares a tree with the exact model at seeded states
(random, packed on the box's boundary, on its diagonal) and reports the distribution of the
relative errors and where the worst sit (see its docstring for the definitions and bounds).
Everything goes through the public kernels (``eval_outputs``, ``eval_tau``), so it works for
any tree kind; the faces between cells come from ``internal_faces``.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.tree import BOXES, OUT_OF_DOMAIN, SPLINE, Tree, eval_outputs, eval_tau, n_outputs, spline_face_jumps

from .mechanism import AssemblyError, Mechanism
from .reduction import (ExactModel, flatten_outputs, output_layout, quadratic_velocities,
                        unflatten_outputs)

MAX_SAMPLES = 10 ** 7  # verification states (memory: about 100 bytes per state and output)
CHUNK = 24  # points per chunk; fixed so results do not depend on the process count

# default verification bounds, per axis, as multiples of the actuator range (hi - lo)
VELOCITY_RANGES_PER_S = 2.0  # |theta_dot_i| <= 2 (hi_i - lo_i) / s
ACCELERATION_RANGES_PER_S2 = 20.0  # |theta_ddot_i| <= 20 (hi_i - lo_i) / s^2
STRESS_SAMPLES = 1000  # default states on the region's faces, edges and corners
DIAGONAL_SAMPLES = 201  # default states on the region's diagonal

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
    manager; ``jobs=1`` runs in this process. ``scheduler``: on a Dask cluster instead
    (``daskeval.DaskPool``: a scheduler's address, or ``local`` for a LocalCluster of ``jobs``
    worker processes), same chunks, same results. Progress goes to a tqdm bar on stderr only
    when stderr is a terminal (or ``progress`` says otherwise)."""

    def __init__(self, mech: Mechanism, jobs: int | None = None, progress: bool | None = None,
                 desc: str = "exact model", scheduler: str | None = None):
        self.mech = mech
        cores = os.cpu_count() or 1
        # results do not depend on jobs: more processes than a few per core only cost forks
        self.jobs = max(1, min(jobs or cores, 4 * max(2, cores)))
        self.scheduler, self.dask_workers = scheduler, jobs
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.desc = desc
        self.pool: ProcessPoolExecutor | None = None
        self.dask = None  # daskeval.DaskPool
        self.model: ExactModel | None = None
        self.n_evaluated = 0

    def __enter__(self) -> "SampleEvaluator":
        if self.scheduler is not None:
            try:
                from .daskeval import DaskPool
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] not in ("dask", "distributed"):
                    raise
                raise UserError("--scheduler needs dask.distributed: pip install 'pkrt[dask]'") from None
            self.dask = DaskPool(self.mech, self.scheduler, self.dask_workers)
        elif self.jobs > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=ctx, initializer=_init_worker,
                                            initargs=(self.mech,))
        else:
            self.model = ExactModel(self.mech)
        return self

    def __exit__(self, *exc) -> None:
        if self.dask is not None:
            self.dask.close()
            self.dask = None
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
            for k, r in self._completed(chunks):
                results[k] = r
                bar.update(len(chunks[k]))
        finally:
            bar.close()
        self.n_evaluated += n
        n_out = len(output_layout(self.mech.n_act))
        if not results:
            return np.zeros((0, n_out)), np.zeros(0)
        return (np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results]))

    def _completed(self, chunks: list[np.ndarray]):
        """(chunk index, eval_chunk result) per chunk, in completion order."""
        if self.dask is not None:
            yield from self.dask.run(chunks)
        elif self.pool is None:
            for k, c in enumerate(chunks):
                yield k, eval_chunk(self.model, c)
        else:
            from concurrent.futures import as_completed
            futures = {self.pool.submit(_worker_chunk, c): k for k, c in enumerate(chunks)}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()


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


def tree_taus(tree: Tree, theta: np.ndarray, td: np.ndarray, tdd: np.ndarray) -> np.ndarray:
    """tau (n, s) from the tree's eval_tau kernel at the states (theta, td, tdd)."""
    s = tree.s
    H, D, p = np.empty((s, s)), np.empty((s, s * (s + 1) // 2)), np.empty(s)
    out = np.empty((len(theta), s))
    for k in range(len(theta)):
        eval_tau(tree.arrays, theta[k], td[k], tdd[k], H, D, p, out[k])
    return out


def exact_taus(F: np.ndarray, td: np.ndarray, tdd: np.ndarray, s: int) -> np.ndarray:
    """tau = H tdd + D [td td] - p_ext (n, s) from exact flat outputs F (n, n_out)."""
    out = np.empty((len(F), s))
    for k in range(len(F)):
        H, D, p = unflatten_outputs(F[k], s)
        out[k] = H @ tdd[k] + D @ quadratic_velocities(td[k]) - p
    return out


# -- faces between cells: where a piecewise fit may step ----------------------------------------

def internal_faces(tree: Tree) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Faces between cells as (axis d, lo, hi): the face is lo <= theta <= hi with
    lo[d] = hi[d] the face's position on axis d. Box trees: every leaf's upper face on every
    axis where it is not on the root box's boundary. A tree kind without leaf boxes exposes its
    cell boundaries as ``tree.knots`` (per axis, sorted, lo and hi included): every interior
    knot plane, cell by cell."""
    faces = []
    if tree.kind == BOXES:
        for blo, bhi in tree.leaf_box:
            for d in range(tree.s):
                if bhi[d] < tree.hi[d]:
                    lo, hi = blo.copy(), bhi.copy()
                    lo[d] = bhi[d]
                    faces.append((d, lo, hi))
        return faces
    knots = spline_knot_planes(tree)
    cells = [list(zip(k[:-1], k[1:])) for k in knots]
    for d in range(tree.s):
        others = [k for k in range(tree.s) if k != d]
        for x in knots[d][1:-1]:
            for combo in itertools.product(*(cells[k] for k in others)):
                lo, hi = np.empty(tree.s), np.empty(tree.s)
                lo[d] = hi[d] = x
                for k, (a, b) in zip(others, combo):
                    lo[k], hi[k] = a, b
                faces.append((d, lo, hi))
    return faces


def spline_knot_planes(tree: Tree) -> list[np.ndarray]:
    """A spline tree's cell boundaries per axis (its distinct knots, lo and hi included)."""
    return [np.unique(tree.knots[a:a + n]) for a, n in zip(tree.knot_start, tree.knot_count)]


FACE_CHUNK = 4096  # face points evaluated at a time (4096 x 153 outputs x 8 B = 5 MB per array)


def face_jumps(tree: Tree, scale: np.ndarray, per_face: int = 3) -> tuple[float, int, list, str | None]:
    """Largest relative jump of any output across internal faces, measured through the
    public kernel: on a per_face^(s-1) grid inside each face, the tree is evaluated one
    rounding step below and one above the face's position (so the search lands in either
    cell whatever its tie rule); jump = |f_above - f_below| / scale. Points where either side
    is out of domain are skipped. Returns (max jump, faces checked, theta of the max, output)."""
    if tree.kind == SPLINE:  # both polynomial pieces at every interior knot plane, exactly
        worst, n, at = spline_face_jumps(tree.arrays, np.asarray(scale, float), per_face)
        return float(worst), int(n), at.tolist() if worst > 0 else [], None
    s = tree.s
    faces = internal_faces(tree)
    if not faces:
        return 0.0, 0, [], None
    fr = (np.arange(per_face) + 0.5) / per_face
    grid = np.array(list(itertools.product(fr, repeat=s - 1))) if s > 1 else np.zeros((1, 0))
    pts, axis = [], []
    for d, lo, hi in faces:
        others = [k for k in range(s) if k != d]
        p = np.repeat(lo[None, :], len(grid), axis=0)
        p[:, others] = lo[others] + (hi[others] - lo[others]) * grid
        pts.append(p)
        axis.append(np.full(len(grid), d))
    P, A = np.concatenate(pts), np.concatenate(axis)
    best: tuple[float, list, str | None] | None = None
    for c in range(0, len(P), FACE_CHUNK):  # bounded memory: s = 6 has 3^5 points per face
        Pc, Ac = P[c:c + FACE_CHUNK], A[c:c + FACE_CHUNK]
        rows = np.arange(len(Pc))
        below, above = Pc.copy(), Pc.copy()
        below[rows, Ac] = np.nextafter(Pc[rows, Ac], -np.inf)
        above[rows, Ac] = np.nextafter(Pc[rows, Ac], np.inf)
        Fb, sb = tree_outputs(tree, below)
        Fa, sa = tree_outputs(tree, above)
        ok = (sb != OUT_OF_DOMAIN) & (sa != OUT_OF_DOMAIN)
        if not ok.any():
            continue
        J = np.abs(Fa[ok] - Fb[ok]) / scale
        i, o = np.unravel_index(int(np.argmax(J)), J.shape)
        if best is None or J[i, o] > best[0]:  # the first maximum, as one argmax over all
            best = (float(J[i, o]), Pc[ok][i].tolist(), output_layout(s)[o])
    if best is None:
        return 0.0, len(faces), [], None
    return best[0], len(faces), best[1], best[2]


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


# -- where to look: random states, the box's boundary, the diagonal -----------------------------

def stress_points(lo: np.ndarray, hi: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n thetas packed on the boundary of [lo, hi], where piecewise fits err most: the 2^s
    corners first, then equal shares with s - 1 coordinates (edges), ..., 1 coordinate
    (faces) pinned at a bound (for s = 1: at an end), the others uniform. Half the pinned
    coordinates sit exactly on the bound, half a log-uniform 1e-4..1e-1 of the width inside."""
    s, w = len(lo), hi - lo
    corners = np.array(list(itertools.product(*zip(lo, hi))))[:n]
    rest = n - len(corners)
    levels = list(range(max(s - 1, 1), 0, -1))  # pinned coordinates per point
    parts = [corners]
    for j, k in enumerate(levels):
        m = rest // len(levels) + (1 if j < rest % len(levels) else 0)
        if m <= 0:
            continue
        u = rng.random((m, s))
        pinned = np.argsort(rng.random((m, s)), axis=1)[:, :k]
        upper = rng.integers(0, 2, (m, k)).astype(bool)
        inset = np.where(rng.random((m, k)) < 0.5, 0.0, 10.0 ** rng.uniform(-4, -1, (m, k)))
        rows = np.arange(m)[:, None]
        u[rows, pinned] = np.where(upper, 1.0 - inset, inset)
        parts.append(lo + w * u)
    return np.concatenate(parts) if parts else np.zeros((0, s))


def _quantiles(e: np.ndarray) -> dict:
    return {"p50": float(np.percentile(e, 50)), "p99": float(np.percentile(e, 99)),
            "max": float(e.max())}


def verify_tree(tree: Tree, mech: Mechanism, samples: int = 2000, seed: int = 0,
                region=None, jobs: int | None = None, progress: bool | None = None,
                evaluator: SampleEvaluator | None = None, diagonal: bool = False,
                stress: int = STRESS_SAMPLES, diagonal_samples: int = DIAGONAL_SAMPLES,
                worst: int = 5) -> dict:
    """Compare a tree with the exact model at seeded states.

    States: ``samples`` with theta uniform in the region (default: the tree's root box), plus
    ``stress`` on the region's faces, edges and corners (``stress_points``), plus
    ``diagonal_samples`` evenly spaced on its diagonal from the lower to the upper corner (the
    paper's Figure 5). ``diagonal``: only the diagonal, with ``samples`` points. theta_dot and
    theta_ddot are uniform within +/-VELOCITY_RANGES_PER_S and +/-ACCELERATION_RANGES_PER_S2
    times the actuator range per second (per second squared).

    Errors are relative to scales: coefficient errors |f_hat - f| / scale_o with scale_o the
    largest |f_o| known in the domain, i.e. the larger of the tree header's ``output_scale``
    (from the build samples) and the maximum over the states compared here; tau errors
    |tau_hat_i - tau_i| / max |tau_i| over the compared states. The error of a state is its
    largest over outputs (axes); the report gives their p50, p99 and maximum, the maximum per
    set and per group, and the ``worst`` states. Jumps across cell faces: ``face_jumps``, same
    scales. States the tree reports out of domain or the model cannot assemble are counted,
    not compared.
    """
    _check_counts(samples, stress, diagonal_samples)
    s = tree.s
    rlo, rhi = parse_region(tree, region)
    rng = np.random.default_rng(seed)
    width = tree.hi - tree.lo
    vmax, amax = VELOCITY_RANGES_PER_S * width, ACCELERATION_RANGES_PER_S2 * width
    diag = lambda n: rlo + (rhi - rlo) * np.linspace(0.0, 1.0, n)[:, None]  # noqa: E731
    if diagonal:
        sets = {"diagonal": diag(samples)}
    else:
        sets = {"random": rlo + (rhi - rlo) * rng.random((samples, s)),
                "stress": stress_points(rlo, rhi, stress, rng),
                "diagonal": diag(diagonal_samples)}
    theta = np.concatenate(list(sets.values()))
    set_id = np.concatenate([np.full(len(v), k) for k, v in enumerate(sets.values())])
    n = len(theta)
    td = vmax * (2 * rng.random((n, s)) - 1)
    tdd = amax * (2 * rng.random((n, s)) - 1)
    order = spatial_order(theta, rlo, rhi)
    theta, td, tdd, set_id = theta[order], td[order], tdd[order], set_id[order]

    if evaluator is None:
        with SampleEvaluator(mech, jobs, progress, desc="verify") as ev:
            F, sing = ev.evaluate(theta)
    else:
        F, sing = evaluator.evaluate(theta)
    Fh, status = tree_outputs(tree, theta)
    exact_ok = np.all(np.isfinite(F), axis=1)
    tree_ok = status != OUT_OF_DOMAIN
    both = exact_ok & tree_ok
    # the domain's maxima: states in out-of-domain cells (near a singularity) do not count
    stored = tree.header.get("output_scale")
    seen = output_scale(F[both], s) if both.any() or stored is None else np.asarray(stored, float)
    scale = seen if stored is None else np.maximum(np.asarray(stored, float), seen)
    report: dict = {
        "samples": samples, "seed": seed,
        "sampling": "diagonal" if diagonal else "uniform random + stress (faces, edges, corners) + diagonal",
        "sets": {k: len(v) for k, v in sets.items()},
        "region": np.c_[rlo, rhi].tolist(),
        "velocity_bound": vmax.tolist(), "acceleration_bound": amax.tolist(),
        "compared": int(both.sum()),
        "out_of_domain_samples": int((~tree_ok).sum()),
        "exact_failed_samples": int((~exact_ok).sum()),
        "tree_in_domain_but_exact_failed": int((tree_ok & ~exact_ok).sum()),
        "output_scale": "max of the tree header's and of the states evaluated",
        "scale_above_stored": (float(np.max(seen / np.asarray(stored, float)))
                               if stored is not None else None),
        "coef_scale": scale.tolist(),
    }
    if not both.any():
        report.update(max_rel_coef_error=None, max_rel_tau_error=None)
    else:
        compared = _Compared(theta[both], set_id[both], list(sets), worst)
        report.update(compared.coef_errors(np.abs(Fh[both] - F[both]) / scale, s))
        report.update(compared.tau_errors(tree, F[both], td[both], tdd[both], s))
    jump, faces, at, out = face_jumps(tree, scale)
    report["max_face_jump"] = jump
    report["faces_checked"] = faces
    report["worst_face_theta"] = at
    report["worst_face_output"] = out
    return report


def _check_counts(samples: int, stress: int, diagonal_samples: int) -> None:
    if not 1 <= samples <= MAX_SAMPLES:
        raise UserError(f"--samples must be in 1..{MAX_SAMPLES}, got {samples}")
    for name, v in (("--stress", stress), ("--diagonal-samples", diagonal_samples)):
        if not 0 <= v <= MAX_SAMPLES:
            raise UserError(f"{name} must be in 0..{MAX_SAMPLES}, got {v}")


@dataclass
class _Compared:
    """The states compared (``th``), the set each is from (``sid``: index into ``set_names``)
    and how many of the worst to report."""
    th: np.ndarray
    sid: np.ndarray
    set_names: list[str]
    worst: int

    def per_set(self, err: np.ndarray) -> dict:
        """The largest error of each set (None for a set with no state compared)."""
        return {g: float(err[self.sid == k].max()) if (self.sid == k).any() else None
                for k, g in enumerate(self.set_names)}

    def coef_errors(self, rel: np.ndarray, s: int) -> dict:
        """The report's coefficient errors from ``rel`` (n, n_out), relative errors."""
        th, sid, names = self.th, self.sid, output_layout(s)
        per_state, per_output = rel.max(axis=1), rel.argmax(axis=1)
        i = int(np.argmax(per_state))
        group_of = {o: g for g, sl in output_groups(s).items() for o in range(n_outputs(s))[sl]}
        return {
            "max_rel_coef_error": float(per_state[i]),
            "worst_output": names[per_output[i]],
            "worst_theta": th[i].tolist(),
            "mean_rel_coef_error": float(rel.mean()),
            "group_max_rel_error": {g: float(rel[:, sl].max()) for g, sl in output_groups(s).items()},
            "coef_error": _quantiles(per_state),
            "set_max_rel_coef_error": self.per_set(per_state),
            "worst_coef_states": [
                {"theta": th[k].tolist(), "set": self.set_names[sid[k]], "error": float(per_state[k]),
                 "output": names[per_output[k]], "group": group_of[int(per_output[k])]}
                for k in np.argsort(-per_state, kind="stable")[:self.worst]],
        }

    def tau_errors(self, tree: Tree, F: np.ndarray, td: np.ndarray, tdd: np.ndarray, s: int) -> dict:
        """The report's torque errors at the compared states (exact outputs ``F``, velocities
        ``td``, accelerations ``tdd``), relative to each axis's largest |tau|."""
        th, sid = self.th, self.sid
        tau = exact_taus(F, td, tdd, s)
        tau_h = tree_taus(tree, th, td, tdd)
        tscale = np.abs(tau).max(axis=0)
        tscale = np.where(tscale > 0, tscale, 1.0)
        trel = np.abs(tau_h - tau) / tscale
        t_state, t_axis = trel.max(axis=1), trel.argmax(axis=1)
        return {
            "max_rel_tau_error": float(t_state.max()),
            "tau_error": _quantiles(t_state),
            "tau_scale": tscale.tolist(),
            "set_max_rel_tau_error": self.per_set(t_state),
            "worst_tau_states": [
                {"theta": th[k].tolist(), "set": self.set_names[sid[k]], "error": float(t_state[k]),
                 "axis": int(t_axis[k]), "theta_dot": td[k].tolist(),
                 "theta_ddot": tdd[k].tolist()}
                for k in np.argsort(-t_state, kind="stable")[:self.worst]],
        }


__all__ = ["SampleEvaluator", "eval_chunk", "verify_tree", "face_jumps", "internal_faces",
           "output_scale", "output_groups", "tree_outputs", "tree_taus", "exact_taus",
           "stress_points", "spatial_order", "parse_region", "VELOCITY_RANGES_PER_S",
           "ACCELERATION_RANGES_PER_S2", "STRESS_SAMPLES", "DIAGONAL_SAMPLES"]
