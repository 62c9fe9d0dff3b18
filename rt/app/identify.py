"""Identification from run logs, wired together: the logs read into samples (runtime), the
regressor, base parameters, the fit and the consistent standard parameters (models), the
identified model and machine configuration written, the report and its plot. ``pkrt
identify`` and the ``identify`` benchmark call ``identify_logs``. Units: SI (m or rad, N or
N m, s)."""

from __future__ import annotations

import datetime as _dt
import time

import numpy as np



def identify_logs(config, logs: list[str], out: str, machine_out: str, **options):
    """The whole identification from run logs (see the module ``pkrt.models.identification.estimate``); writes
    the model and the machine configuration. Returns a namespace: ``report`` (the JSON report)
    and the pieces (samples, Y, bp, est, pi, test, use) for benchmarks. BLAS on one thread
    (its matrices are small; threads only contend)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        return _identify(config, logs, out, machine_out, **options)


ESTIMATORS = ("auto", "iv", "ls")  # auto: instruments when every log has its reference, else least squares


def _identify(config, logs: list[str], out: str, machine_out: str, *, window: float | None = None,
              decimate: int | None = None, held_out: float = 0.25, v_min=None, plot: str | None = None,
              estimator: str = "auto"):
    from types import SimpleNamespace

    from pkrt.models.identification.baseparams import base_parameters
    from pkrt.models.identification.estimate import consistent, fit, friction_values, write_model
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.identification.regressor import Regressor, model_parameters

    from pkrt.rt.core.friction import V_EPS
    from pkrt.rt.core.errors import UserError
    from pkrt.rt.runtime.logs.identifylog import WINDOW_S, IdentifyInputError, load_samples

    if estimator not in ESTIMATORS:
        raise UserError(f"estimator {estimator!r}: expected one of {', '.join(ESTIMATORS)}")
    t0 = time.perf_counter()
    c0 = time.process_time()
    mech = load_mechanism(config.model_path)
    samples = load_samples(logs, mech.actuator_names, mech.name, mech.ranges, window or WINDOW_S, decimate=decimate)
    reg = Regressor(mech)
    Y = reg.batch(samples.theta, samples.theta_dot, samples.theta_ddot)
    t_reg = time.perf_counter() - t0
    bp = base_parameters(mech, reg=Regressor(mech))
    labels = [bp.label(i) for i in range(bp.n_base)]
    Yb = Y[:, :, bp.base]
    # held out: the last fraction of each log
    test = np.zeros(samples.n, dtype=bool)
    for li in np.unique(samples.log_index):
        k = np.flatnonzero(samples.log_index == li)
        test[k[int(round(len(k) * (1 - held_out))):]] = True
    vpeak = np.abs(samples.theta_dot).max(axis=0)
    v_min = v_min if v_min is not None else np.maximum(0.02 * vpeak, 5 * V_EPS)
    use = samples.steady & (np.abs(samples.theta_dot) >= v_min)
    if estimator == "iv" and samples.ref is None:
        raise IdentifyInputError("--estimator iv: a log has no reference (ref_pos) to build the instruments from; "
                                 "use --estimator ls")
    Zb = None
    if estimator != "ls" and samples.ref is not None:  # the reference's regressor: the instruments
        tz = time.perf_counter()
        Zb = reg.batch(*samples.ref)[:, :, bp.base][~test]
        t_reg += time.perf_counter() - tz
    pi0 = model_parameters(mech.description, config.controller.viscous, config.controller.coulomb)
    fixed = (bp.weak, bp.weak @ bp.project(pi0)) if bp.weak is not None and len(bp.weak) else None
    est = fit(Yb[~test], samples.tau[~test], use[~test], labels, Zb=Zb, fixed=fixed)
    pi, sdp = consistent(mech, bp, est, pi0)
    # held-out residual, with the estimate and with the consistent parameters
    keep = use[test]
    pred_base = np.einsum("nsr,r->ns", Yb[test], est.value)
    pred_cons = np.einsum("nsp,p->ns", Y[test], pi)
    pred_orig = np.einsum("nsp,p->ns", Y[test], pi0)
    meas = samples.tau[test]

    def rms(pred):
        return [float(np.sqrt(np.mean((meas[:, i] - pred[:, i])[keep[:, i]] ** 2))) if keep[:, i].any() else None
                for i in range(mech.n_act)]

    fr = friction_values(pi, mech.n_bodies, mech.n_act)
    provenance = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "software": "pkrt identify", "from_model": mech.description.path,
        "from_model_sha256": mech.content_hash,
        "logs": [{"path": s["log"], "sha256": s["sha256"], "cycles": s["cycles"]} for s in samples.sources],
        "samples_fit": int((~test).sum()), "samples_held_out": int(test.sum()),
        "base_parameters": bp.n_base, "estimator": est.estimator, "condition_number": est.cond,
        "max_rsd_percent": float(100 * est.rsd.max()),
        "held_out_rms": rms(pred_cons), "residual_sigma": est.sigma.tolist(),
        "friction": fr, "reproduces_estimate": sdp["reproduces_estimate"],
    }
    write_model(mech, pi, out, provenance, keep={mech.body_names.index(b) for b in sdp["bodies_kept_at_original"]})
    _write_machine(config, out, machine_out, fr)
    report = {
        "machine": config.path, "model": mech.description.path, "output": out, "machine_out": machine_out,
        "logs": samples.sources, "filter": samples.filter, "samples": samples.n,
        "samples_fit": int((~test).sum()), "samples_held_out": int(test.sum()), "rows_fit": est.rows,
        "v_min": np.broadcast_to(v_min, mech.n_act).tolist(),
        "base": [{"name": labels[i], "value": float(est.value[i]), "std": float(est.std[i]),
                  "rsd_percent": float(100 * est.rsd[i]), "model": float(bp.project(pi0)[i]),
                  "consistent": float(bp.project(pi)[i])} for i in range(bp.n_base)],
        "not_identifiable": [bp.names[j] for j in bp.zero], "estimator": est.estimator,
        "condition_number": est.cond, "residual_sigma": est.sigma.tolist(),
        "held_out_rms": {"identified": rms(pred_base), "consistent": rms(pred_cons), "original_model": rms(pred_orig)},
        "consistent": sdp, "friction": fr, "axes": mech.actuator_names,
        "seconds": {"regressor": t_reg, "total": time.perf_counter() - t0, "cpu": time.process_time() - c0},
    }
    from pkrt.models.kinematics.mechanism import load_mechanism as _load
    from pkrt.rt.app.residualfloor import noise_floor

    tr = time.perf_counter()
    report["residual_floor"] = noise_floor(_load(out), logs, fr["viscous"], fr["coulomb"], config.protect.gain)
    report["seconds"].update(residual_floor=time.perf_counter() - tr, total=time.perf_counter() - t0,
                             cpu=time.process_time() - c0)
    if plot:
        _plot(plot, samples, test, meas, pred_cons, pred_orig, est, labels, mech.actuator_names)
        report["plot"] = plot
    return SimpleNamespace(report=report, mech=mech, samples=samples, Y=Y, Zb=Zb, bp=bp, est=est, pi=pi, pi0=pi0,
                           test=test, use=use)


def _write_machine(config, model_out: str, path: str, fr: dict) -> None:
    """A copy of the machine configuration on the identified model (its tree to be built with
    ``pkrt build``), friction feedforward from the identification, paths made absolute."""
    from pkrt.rt.app.machinefile import write_machine_copy

    write_machine_copy(config, model_out, path, "identified", "pkrt identify",
                       {"viscous": fr["viscous"], "coulomb": fr["coulomb"]})


def _plot(path, samples, test, meas, pred, pred0, est, labels, axes) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = meas.shape[1]
    fig, ax = plt.subplots(s + 1, 1, figsize=(10, 2.2 * (s + 1) + 2), squeeze=False)
    t = samples.t[test]
    for i in range(s):
        a = ax[i, 0]
        a.plot(t, meas[:, i], "k-", lw=1, label="measured (filtered)")
        a.plot(t, pred[:, i], "r--", lw=1, label="identified model")
        a.plot(t, pred0[:, i], "b:", lw=1, label="original model")
        a.set_ylabel(f"{axes[i]} force")
        if i == 0:
            a.set_title("held-out data")
            a.legend(loc="upper right", fontsize=7)
    a = ax[s, 0]
    rel = est.std / np.maximum(np.abs(est.value), 1e-300)
    x = np.arange(len(labels))
    a.errorbar(x, np.ones_like(x, dtype=float), yerr=1.96 * np.minimum(rel, 1.0), fmt="o", ms=3)
    a.set_ylim(0, 2)
    a.set_xticks(x)
    a.set_xticklabels([f"{k + 1}" for k in x], fontsize=6)
    a.set_ylabel("value / estimate, 95 %")
    a.set_xlabel("base parameter (numbers as in the report)")
    ax[-1, 0].set_xlabel("base parameter (numbers as in the report)")
    ax[s - 1, 0].set_xlabel("t (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
