"""Plot of a planned reference (``pkrt plan --plot``): the tool's path speed against its limit
curve (the speed at which the first actuator reaches its planning velocity limit, and the
programmed feed), and each actuator's force against its limit and planning limit (matplotlib,
Agg, PNG)."""

from __future__ import annotations

import numpy as np

from pkrt.rt.core.errors import OutputError


def plot_plan(plan, report: dict, names: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(plan.n) / plan.rate_hz
    speed, feed, tau = report["_speed"], report["_feed"], report["_tau"]
    lim = report["limits"]
    k = 1 - report["margin"]
    vl = np.asarray(lim["velocity"]) * k
    s = len(names)
    fig, ax = plt.subplots(1 + s, 1, figsize=(9, 2.4 * (1 + s)), sharex=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        cap = np.where(speed > 1e-9, speed * (vl / np.abs(plan.vel)).min(axis=1), np.nan)
    a = ax[0]
    if np.any(speed > 0):
        a.plot(t, speed, label="tool speed")
        a.plot(t, cap, "--", label="actuator velocity limit")
        if np.any(np.isfinite(feed)):
            a.plot(t, np.where(np.isfinite(feed), feed, np.nan), ":", label="programmed feed")
        a.set_ylim(0, 1.3 * max(np.nanmax(speed), 1e-9))
        a.set_ylabel("m/s")
    else:  # an actuator-space path: actuator speeds against their limits
        for j, n in enumerate(names):
            a.plot(t, np.abs(plan.vel[:, j]), label=f"|{n}| velocity")
        a.axhline(vl.max(), ls="--", color="k", label="planning limit")
    a.set_title(f"{report['duration_s']:.4f} s, margin {report['margin']:.0%}, forces from the {report['dynamics']}")
    a.legend(loc="upper right", fontsize=8)
    for j, n in enumerate(names):
        a = ax[1 + j]
        a.plot(t, tau[:, j], label=f"{n} force")
        for sign in (1, -1):
            a.axhline(sign * lim["force"][j], color="r", lw=0.8)
            a.axhline(sign * lim["force"][j] * k, color="r", lw=0.8, ls="--")
        a.set_ylabel("N or N m")
        a.legend(loc="upper right", fontsize=8)
    ax[-1].set_xlabel("t (s)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=90)
    except OSError as e:
        raise OutputError(f"--plot {path}: cannot write: {e.strerror or e}") from None
    finally:
        plt.close(fig)
