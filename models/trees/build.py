"""Build reduced-dynamics trees from the exact model: a tree of boxes (``boxes``) or a graded
tensor cubic spline (``splines``), sampled over processes or a Dask cluster, then verified
(``verify``) into its header."""

from __future__ import annotations

import dataclasses
import time

from pkrt.rt.core.tree import Tree

from ..kinematics.mechanism import Mechanism
from .boxes import build_boxes
from .samples import Samples
from .sampling import SampleEvaluator
from .settings import BuildSettings, tree_header
from .splines import build_spline
from .verify import verify_tree

def build_tree(mech: Mechanism, settings: BuildSettings, jobs: int | None = None,
               progress: bool | None = None, scheduler: str | None = None) -> tuple[Tree, dict]:
    """Build, verify and return (tree, stats). Deterministic for any ``jobs`` and
    ``scheduler`` (a Dask scheduler's address or ``local``: see ``SampleEvaluator``)."""
    s = mech.n_act
    settings.check(s)
    settings.root_box(mech)  # a bad --region: one line before any sampling
    t0 = time.perf_counter()
    thr = mech.description.singular_threshold if settings.sing_threshold is None else settings.sing_threshold
    with SampleEvaluator(mech, jobs, progress, desc="build", scheduler=scheduler) as ev:
        smp = Samples(mech, ev, *settings.root_box(mech))
        if settings.kind == "spline":
            tree = _spline_tree(mech, settings, smp, thr)
        else:
            tree = build_boxes(mech, settings, smp, thr)
        return _finish(tree, mech, settings, ev, t0)


def _spline_tree(mech: Mechanism, settings: BuildSettings, smp: Samples, thr: float) -> Tree:
    """A spline tree (``splines.build_spline``) with its header."""
    tree, facts = build_spline(mech, smp, thr, settings.boxes, settings.tol, settings.max_bytes)
    header = tree_header(mech, settings, facts.pop("output_scale"), {
        "kind": "spline", "max_bytes": settings.max_bytes if settings.tol is not None else None,
        "sing_threshold": thr, "design": "not-a-knot cubic interpolation on a tensor grid; "
        "held out: interval midpoints on the grid lines, corner-cell centres",
        **facts, "samples": len(smp.f), "samples_failed": 0})
    return dataclasses.replace(tree, header=header)


def _finish(tree: Tree, mech: Mechanism, settings: BuildSettings, ev: SampleEvaluator,
            t0: float) -> tuple[Tree, dict]:
    """Verify (into the header) and return (tree, stats)."""
    build_time = time.perf_counter() - t0
    if settings.verify_samples > 0:
        tree.header["verification"] = verify_tree(tree, mech, settings.verify_samples,
                                                  settings.seed, evaluator=ev)
    stats = {"build_seconds": build_time, "total_seconds": time.perf_counter() - t0,
             "exact_evaluations": ev.n_evaluated, "tree_bytes_in_memory": tree.nbytes}
    return tree, stats



__all__ = ["build_tree"]
