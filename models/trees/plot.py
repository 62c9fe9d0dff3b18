"""``pkrt tree plot``: a tree against the exact model, as the paper's Figure 5 and error maps.

Top: every coefficient (H, D, p_ext entries) along the diagonal of the tree's box, from the
lower corner (t = 0) to the upper one (t = 1), exact (solid) and tree (dashed). Middle: the
relative error along the diagonal, largest per group. Bottom: the largest relative coefficient
error over all outputs on 2-D slices through the box (axes 1 and 2; the other axes at the
centre, near the lower corner and near the upper corner). Relative errors use the scales of
``pkrt tree verify``: the larger of the header's ``output_scale`` and the largest |f| met
here. Everything goes through the public kernel, so any tree kind plots the same way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pkrt.rt.core.tree import OUT_OF_DOMAIN, Tree

from ..kinematics.mechanism import Mechanism
from ..reduction.exact import output_layout
from .outputs import output_groups, output_scale, tree_outputs
from .sampling import SampleEvaluator, spatial_order

PLOT_DPI = 80
PLOT_SIZE_PX = (1440, 1280)  # width, height
SLICE_INSET = 0.02  # the corner slices sit this fraction of the width inside the box


def _evaluate(ev: SampleEvaluator, theta: np.ndarray, lo, hi) -> np.ndarray:
    """Exact flat outputs at theta, in theta's order (evaluated in a spatial order)."""
    order = spatial_order(theta, lo, hi)
    F = np.empty((len(theta), len(output_layout(theta.shape[1]))))
    F[order] = ev.evaluate(theta[order])[0]
    return F


def slice_planes(tree: Tree) -> list[dict]:
    """The 2-D slices to map: axes (0, 1), the others at the centre, near the lower corner and
    near the upper corner (one slice, the whole box, for s = 2; none for s = 1)."""
    s, lo, hi = tree.s, tree.lo, tree.hi
    if s < 2:
        return []
    if s == 2:
        return [{"label": "whole box", "fixed": np.zeros(0)}]
    w = hi[2:] - lo[2:]
    return [{"label": "near the lower corner", "fixed": lo[2:] + SLICE_INSET * w},
            {"label": "through the centre", "fixed": (lo[2:] + hi[2:]) / 2},
            {"label": "near the upper corner", "fixed": hi[2:] - SLICE_INSET * w}]


def plot_data(tree: Tree, mech: Mechanism, points: int = 201, grid: int = 41,
              jobs: int | None = None, progress: bool | None = None) -> dict:
    """The series the plot shows.

    ``diagonal``: t (n,), theta (n, s), exact and tree flat outputs (n, n_out), rel (n, n_out)
    = |tree - exact| / scale (NaN where the tree is out of domain or the model fails).
    ``slices``: per plane, x and y (grid,) on axes 0 and 1, the fixed values of the others and
    err (grid, grid) = the largest rel over outputs (err[iy, ix]; NaN out of domain).
    ``scale``: per output, max of the header's output_scale and the largest |f| evaluated
    where the tree is in domain."""
    s, lo, hi = tree.s, tree.lo, tree.hi
    t = np.linspace(0.0, 1.0, points)
    diag = lo + (hi - lo) * t[:, None]
    planes = slice_planes(tree)
    x, y = np.linspace(lo[0], hi[0], grid), np.linspace(lo[1], hi[1], grid) if s > 1 else None
    slice_theta = []
    for p in planes:
        X, Y = np.meshgrid(x, y)
        th = np.empty((grid * grid, s))
        th[:, 0], th[:, 1] = X.ravel(), Y.ravel()
        th[:, 2:] = p["fixed"]
        slice_theta.append(th)
    theta = np.concatenate([diag] + slice_theta)
    with SampleEvaluator(mech, jobs, progress, desc="plot") as ev:
        F = _evaluate(ev, theta, lo, hi)
    Fh, status = tree_outputs(tree, theta)
    bad = (status == OUT_OF_DOMAIN) | ~np.all(np.isfinite(F), axis=1)
    stored = tree.header.get("output_scale")
    seen = (output_scale(F[~bad], s) if (~bad).any() or stored is None  # the domain's maxima
            else np.asarray(stored, float))
    scale = seen if stored is None else np.maximum(np.asarray(stored, float), seen)
    rel = np.abs(Fh - F) / scale
    rel[bad] = np.nan
    n = points
    out = {"names": output_layout(s), "scale": scale,
           "diagonal": {"t": t, "theta": diag, "exact": F[:n], "tree": Fh[:n], "rel": rel[:n]},
           "slices": []}
    for k, p in enumerate(planes):
        r = rel[n + k * grid * grid: n + (k + 1) * grid * grid]
        err = np.full(len(r), np.nan)
        ok = ~np.all(np.isnan(r), axis=1)
        err[ok] = np.nanmax(r[ok], axis=1)
        out["slices"].append({"label": p["label"], "fixed": p["fixed"], "x": x, "y": y,
                              "err": err.reshape(grid, grid)})
    return out


def _max(a) -> float | None:
    a = np.asarray(a, float)
    return float(np.nanmax(a)) if np.any(np.isfinite(a)) else None


def plot_tree(tree: Tree, data: dict, out_path, title: str) -> dict:
    """Write the PNG (PLOT_SIZE_PX) from ``plot_data``; return a summary of what it shows."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    names, d = data["names"], data["diagonal"]
    n_out, s = len(names), tree.s
    cols = min(n_out, 7)
    rows = -(-n_out // cols)
    n_slices = len(data["slices"])
    fig = plt.figure(figsize=(PLOT_SIZE_PX[0] / PLOT_DPI, PLOT_SIZE_PX[1] / PLOT_DPI), dpi=PLOT_DPI)
    heights = [1.0] * rows + [1.6] + ([2.4] if n_slices else [])
    outer = fig.add_gridspec(len(heights), 1, height_ratios=heights, hspace=0.55,
                             left=0.05, right=0.97, top=0.94, bottom=0.05)
    top = outer[:rows].subgridspec(rows, cols, hspace=0.6, wspace=0.35)
    t = d["t"]
    for o, name in enumerate(names):
        a = fig.add_subplot(top[o // cols, o % cols])
        a.plot(t, d["exact"][:, o], lw=1.4, color="black", label="exact")
        tr = np.where(np.isnan(d["rel"][:, o]), np.nan, d["tree"][:, o])
        a.plot(t, tr, lw=1.2, ls="--", color="tab:red", label="tree")
        a.set_title(name, fontsize=9, pad=2)
        a.tick_params(labelsize=7)
        a.grid(alpha=0.3)
        if o == 0:
            a.legend(fontsize=7, loc="best")
    a = fig.add_subplot(outer[rows])
    for g, sl in output_groups(s).items():
        e = d["rel"][:, sl]
        ok = ~np.all(np.isnan(e), axis=1)
        ge = np.full(len(t), np.nan)
        ge[ok] = np.nanmax(e[ok], axis=1)
        a.semilogy(t, np.maximum(ge, 1e-17), lw=1.3, label=f"{g} (max {_max(ge) or 0:.2e})")
    a.set_title("relative coefficient error along the diagonal |tree - exact| / scale, largest per group",
                fontsize=10)
    a.set_xlabel("t along the diagonal: theta = lo + t (hi - lo)  (0: lower corner, 1: upper corner)")
    a.grid(alpha=0.3, which="both")
    a.legend(fontsize=8, loc="upper center")
    summary = {"diagonal_max_rel_coef_error": _max(d["rel"]), "slices": []}
    if n_slices:
        finite = [sl["err"][np.isfinite(sl["err"])] for sl in data["slices"]]
        top_err = max((float(f.max()) for f in finite if f.size), default=1.0)
        norm = LogNorm(vmin=max(top_err * 1e-4, 1e-16), vmax=max(top_err, 1e-15))
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")  # out of domain
        bottom = outer[rows + 1].subgridspec(1, n_slices, wspace=0.3)
        for k, sl in enumerate(data["slices"]):
            a = fig.add_subplot(bottom[0, k])
            err = np.clip(sl["err"], norm.vmin, None)
            im = a.imshow(err, origin="lower", aspect="auto", cmap=cmap, norm=norm,
                          extent=(sl["x"][0], sl["x"][-1], sl["y"][0], sl["y"][-1]))
            fixed = ", ".join(f"theta{j + 3} = {v:.4g}" for j, v in enumerate(sl["fixed"]))
            m = _max(sl["err"])
            if m is not None:
                iy, ix = np.unravel_index(int(np.nanargmax(sl["err"])), sl["err"].shape)
                a.plot(sl["x"][ix], sl["y"][iy], "x", color="red", ms=9, mew=2)
            a.set_title(f"{sl['label']}{': ' + fixed if fixed else ''}\nmax {m or 0:.2e} (x)",
                        fontsize=9)
            a.set_xlabel("theta1")
            a.set_ylabel("theta2")
            summary["slices"].append({"label": sl["label"], "fixed": sl["fixed"].tolist(),
                                      "max_rel_coef_error": m})
        fig.colorbar(im, ax=fig.axes[-n_slices:], shrink=0.9,
                     label="largest relative coefficient error")
    fig.suptitle(title, fontsize=13)
    fig.savefig(out_path, dpi=PLOT_DPI, format="png")
    plt.close(fig)
    return summary


def default_title(path: str, tree: Tree) -> str:
    b = tree.header.get("build", {})
    cells = (f"spline, {'x'.join(map(str, tree.grid_points))} grid points" if tree.kind_name == "spline"
             else f"{tree.n_leaves} boxes")
    return (f"{Path(path).name}: {tree.header['model']['name']}, {cells} "
            f"({b.get('mode', '?')}), exact (solid) vs tree (dashed) along the box's diagonal")


__all__ = ["plot_data", "plot_tree", "slice_planes", "default_title", "PLOT_SIZE_PX", "PLOT_DPI"]
