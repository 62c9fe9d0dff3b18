"""The plot of ``pkrt calibrate --plot``: each reading's position error with the description
and with the calibrated geometry (fit and held-out poses), and the base parameters' changes
with their 95 % intervals."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_calibration(path: str, report: dict, fit, test: np.ndarray, res_test, res_test_cad) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 1, figsize=(11, 8))
    a = ax[0]
    idx = np.arange(len(test))
    fit_idx, test_idx = idx[~test], idx[test]
    norm = lambda r: 1e6 * np.linalg.norm(r[:, :3], axis=1)  # noqa: E731
    a.semilogy(fit_idx, norm(fit.residual_cad), "o", mfc="none", color="tab:blue", label="description (fit poses)")
    a.semilogy(fit_idx, norm(fit.residual), "o", color="tab:blue", label="calibrated (fit poses)")
    if res_test is not None:
        a.semilogy(test_idx, norm(res_test_cad), "s", mfc="none", color="tab:red", label="description (held out)")
        a.semilogy(test_idx, norm(res_test), "s", color="tab:red", label="calibrated (held out)")
    a.axhline(1e6 * report["noise"]["position_m"] * np.sqrt(3), color="k", ls=":", lw=1,
              label="instrument noise (3-D RMS)")
    a.set_xlabel("reading")
    a.set_ylabel("position error (um)")
    a.set_title(f"{Path(report['model']).name}: {report['fit_poses']} poses fitted, {report['held_out_poses']} held out")
    a.legend(fontsize=7, loc="upper right")
    a = ax[1]
    est = report["estimated"]
    x = np.arange(len(est))
    val = 1e3 * np.array([p["change"] for p in est])  # mm, mrad, 1e-3 of scale
    err = 1e3 * 1.96 * np.array([p["std"] for p in est])
    a.errorbar(x, val, yerr=err, fmt="o", ms=3)
    a.axhline(0.0, color="k", lw=0.5)
    a.set_xticks(x)
    a.set_xticklabels([p["name"] for p in est], rotation=90, fontsize=6)
    a.set_ylabel("change from the description\n(mm, mrad, 1e-3), 95 %")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
