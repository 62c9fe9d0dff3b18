"""The runtime end to end in lockstep: tracking, model mismatch, and every fault kind
stopping the drives within the cycle with its reason logged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pkrt.drivers import open_drives
from pkrt.drivers.base import DriveState
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.runtime.machine.run import run_session
from pkrt.rt.runtime.machine.trajectory import plan_moves

from .plans import demo_reference as _demo


def _run(config, tree, **kw):
    overrides = kw.pop("overrides", {})
    drives = open_drives(config, overrides)
    inject = kw.pop("inject", None)
    if inject:
        drives.inject(*inject)
    if "trajectory" not in kw:
        kw["trajectory"] = _demo(config)
    r = run_session(config, drives, lockstep=True, tree=tree, **kw)
    return r, drives


@pytest.fixture(scope="module")
def demo_runs(config, tree):
    return {(c, ms): _run(config, tree, controller=c, overrides={"mass_scale": ms})[0]
            for c in ("ct", "pd") for ms in (1.0, 1.1)}


def test_computed_torque_tracks_10x_better_than_pd(demo_runs):
    ct, pd = demo_runs["ct", 1.0], demo_runs["pd", 1.0]
    for r in (ct, pd):
        assert r["fault"] is None and r["cycles"] == 5393 and r["overruns"] == 0
    print(f"\nRMS error: computed torque {ct['rms_error'] * 1e6:.2f} um, PD+gravity {pd['rms_error'] * 1e6:.2f} um, "
          f"ratio {pd['rms_error'] / ct['rms_error']:.1f}")
    assert ct["rms_error"] * 10 < pd["rms_error"]


def test_computed_torque_tracks_with_mass_mismatch(demo_runs):
    ct, pd = demo_runs["ct", 1.1], demo_runs["pd", 1.1]
    print(f"\n10% heavier plant: computed torque RMS {ct['rms_error'] * 1e6:.2f} um (max {ct['max_error'] * 1e6:.1f}),"
          f" PD+gravity RMS {pd['rms_error'] * 1e6:.2f} um")
    assert ct["fault"] is None
    assert ct["max_error"] < 1e-3  # still tracking: under a millimetre
    assert ct["rms_error"] < pd["rms_error"] / 2
    assert ct["rms_error"] > demo_runs["ct", 1.0]["rms_error"]  # the mismatch is visible


def test_lockstep_is_deterministic(config, tree):
    a, _ = _run(config, tree, duration=1.0)
    b, _ = _run(config, tree, duration=1.0)
    assert a["rms_error"] == b["rms_error"] and a["max_error"] == b["max_error"]


def _limits(config, **kw):
    return dataclasses.replace(config, limits=dataclasses.replace(config.limits, **kw))


FAULTS = {
    "nan": (dict(inject=("nan", 0.3)), "non-finite feedback"),
    "stale": (dict(inject=("stale", 0.3)), "stale feedback"),
    "freeze": (dict(inject=("freeze", 0.3)), "following error"),
    "velocity": (dict(push=dict(velocity=np.full(3, 0.02))), "velocity limit"),
    "position": (dict(push=dict(position=np.array([[-0.102, 0.06]] * 3))), "position limit"),
    "following": (dict(limits=dict(following_error=np.full(3, 2e-6))), "following error"),
}


@pytest.mark.parametrize("kind", list(FAULTS))
def test_fault_stops_within_the_cycle_and_is_logged(config, tree, tmp_path, kind):
    opts, text = FAULTS[kind]
    cfg = _limits(config, **opts["limits"]) if "limits" in opts else config
    if "push" in opts:  # hold still while an external force pushes the machine
        plan = plan_moves(np.array([[-0.1] * 3, [-0.1] * 3]), [1.0], config.rate_hz)
        drives = open_drives(config)
        drives.inject("push", 0.2, -300.0)
        cfg = _limits(config, following_error=np.full(3, 1.0), **opts["push"])
        r = run_session(cfg, drives, lockstep=True, tree=tree, trajectory=plan, log_path=str(tmp_path / "f.log"))
    else:
        r, drives = _run(cfg, tree, log_path=str(tmp_path / "f.log"), inject=opts.get("inject"))
    assert r["fault"] is not None and text in r["fault"], r["fault"]
    assert r["torque_off_cycle"] == r["fault_cycle"]
    assert drives.state is DriveState.FAULTED and not drives.torque_on
    assert r["cycles"] == r["fault_cycle"] + 1
    log = read_log(str(tmp_path / "f.log"))
    faults = [e for e in log.events if e["kind"] == "fault"]
    assert len(faults) == 1 and text in faults[0]["message"] and faults[0]["cycle"] == r["fault_cycle"]
    # the logged torque of the fault cycle is zero: the drives were off
    assert np.all(log.channels["tau"][-1] == 0.0)


def test_torque_saturation_is_counted(config, tree):
    cfg = dataclasses.replace(config, controller=dataclasses.replace(config.controller, tau_max=np.full(3, 75.0)))
    r, _ = _run(cfg, tree, duration=2.0)
    assert r["saturated_cycles"] > 0


def test_non_finite_torque_stops_the_run(config, tree):
    """A tree whose coefficients are NaN (the loader refuses such a file; here in memory):
    the controller flags the non-finite torque and the run stops in that cycle, torque off."""
    bad = dataclasses.replace(tree, spl_coef=np.full_like(tree.spl_coef, np.nan))
    drives = open_drives(config)
    r = run_session(config, drives, trajectory=_demo(config), lockstep=True, tree=bad, duration=0.5)
    assert r["fault"] == "controller produced a non-finite torque" and r["fault_cycle"] == 0
    assert not drives.torque_on


def test_out_of_domain_box_stops_the_run(config):
    """A box tree whose boxes are all marked out of domain (spline trees have no such mark:
    their builder refuses a model that is not in the domain over the whole box)."""
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.trees.build import build_tree
    from pkrt.models.trees.settings import BuildSettings
    boxes, _ = build_tree(load_mechanism(config.model_path), BuildSettings(boxes=1, verify_samples=0),
                          jobs=1, progress=False)
    bad = dataclasses.replace(boxes, leaf_ok=np.zeros(1, np.uint8))
    with pytest.raises(UserError, match="outside the model's domain"):
        _run(config, bad, duration=0.5)


@pytest.mark.realtime
def test_watchdog_on_missed_cycles_in_real_time(config, tree):
    import time

    def slow(k, t):
        if t >= 0.1:
            time.sleep(0.003)

    drives = open_drives(config)
    r = run_session(config, drives, trajectory=_demo(config), duration=0.5, tree=tree, on_cycle=slow,
                    realtime=False, pacing="skip")
    assert r["fault"] is not None and "watchdog" in r["fault"]
    assert r["overruns"] >= config.limits.watchdog_cycles
    assert r["torque_off_cycle"] == r["fault_cycle"]


def test_trajectory_beyond_limits_is_refused_before_moving(config, tree):
    plan = plan_moves(np.array([[-0.1] * 3, [0.1, -0.1, -0.1]]), [1.0], config.rate_hz)
    drives = open_drives(config)
    with pytest.raises(UserError, match=r"at t = [0-9.]+ s axis q1 above its upper limit"):
        run_session(config, drives, lockstep=True, tree=tree, trajectory=plan)
    assert drives.state is DriveState.UNCONFIGURED
    fast = plan_moves(np.array([[-0.1] * 3, [-0.2, -0.1, -0.1]]), [0.05], config.rate_hz)
    with pytest.raises(UserError, match="axis q1 exceeds the velocity limit"):
        run_session(config, drives, lockstep=True, tree=tree, trajectory=fast)


def test_sensor_options_degrade_tracking_but_run(config, tree):
    clean, _ = _run(config, tree, duration=2.0)
    for opt in ({"noise": 2e-6}, {"quantization": 2e-5}, {"delay_cycles": 2}):
        r, d = _run(config, tree, duration=2.0, overrides=opt)
        assert r["fault"] is None, (opt, r["fault"])
        assert r["rms_error"] > clean["rms_error"], opt
        key, val = next(iter(opt.items()))
        assert d.describe()[key] == val


def test_plant_never_uses_the_controller_tree(config):
    from pkrt.drivers.base import DriveConfigError

    with pytest.raises(DriveConfigError, match="controller's own tree"):
        open_drives(config, {"plant_tree": "orthoglide.pkt"})


def test_drives_that_cannot_be_enabled_leave_a_complete_log(tmp_path):
    from pkrt.drivers.base import DriveError

    cfg = load_machine("orthoglide-serial")
    drives = open_drives(cfg, {"port": str(tmp_path / "no-such-tty")})
    log = tmp_path / "failed.pktlog"
    with pytest.raises(DriveError, match="cannot open serial port"):
        run_session(cfg, drives, trajectory=_demo(cfg), duration=0.2, log_path=str(log))
    assert not drives.torque_on
    r = read_log(str(log))
    assert not r.truncated and "drives not enabled" in r.events[0]["message"]


@pytest.mark.parametrize("argv", [["--inject", "bogus@1"], ["--inject", "nan@x"], ["--inject", "nan@nan"],
                                  ["--telemetry", "127.0.0.1:notaport"], ["--telemetry", "127.0.0.1:70000"]])
def test_run_closes_the_drives_and_the_socket_on_bad_options(monkeypatch, argv, capsys):
    """Bad --inject / --telemetry values were found after the drives were opened, and left them
    open (a CAN bus or serial port stays claimed); the telemetry socket was never closed."""
    import pkrt.drivers
    from pkrt.rt.runtime.record import telemetry as tel_mod
    from pkrt.rt.cli import main

    opened, sockets = [], []
    real_open, real_tel = pkrt.drivers.open_drives, tel_mod.Telemetry

    def spy_open(*a, **kw):
        d = real_open(*a, **kw)
        opened.append(d)
        real_close = d.close
        d.closed = False

        def close():
            d.closed = True
            real_close()
        d.close = close
        return d

    class SpyTelemetry(real_tel):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            sockets.append(self._sock)

    monkeypatch.setattr(pkrt.drivers, "open_drives", spy_open)
    monkeypatch.setattr(tel_mod, "Telemetry", SpyTelemetry)
    assert main(["run", "--lockstep", "--no-log", "--duration", "0.05", *argv]) == 2
    assert capsys.readouterr().err.startswith("pkrt: error:")
    assert opened and all(d.closed for d in opened)
    # a good telemetry option: the run's socket is closed when the run ends
    assert main(["run", "--lockstep", "--no-log", "--duration", "0.05", "--telemetry", "127.0.0.1:9"]) == 0
    assert sockets and all(s.fileno() == -1 for s in sockets)


@pytest.mark.realtime
def test_realtime_factor_counts_skipped_periods(config, tree):
    """A real-time run that skips periods after overruns still covers loop time at the wall
    clock's pace: the factor was executed cycles * period / wall, below 1 by the skipped share."""
    import time

    def stall(k, t):
        if k % 50 == 25:
            time.sleep(0.0035)  # three or four periods late, not in a row (no watchdog)

    drives = open_drives(config)
    r = run_session(config, drives, trajectory=_demo(config), duration=0.5, tree=tree, on_cycle=stall,
                    realtime=False, pacing="skip")
    skipped = round(r["duration_s"] * config.rate_hz) + 1 - r["cycles"]
    assert r["fault"] is None and skipped >= 20, r
    assert r["realtime_factor"] == pytest.approx(1.0, abs=0.03), r["realtime_factor"]


@pytest.mark.realtime
def test_a_host_pause_delays_a_simulated_run_without_changing_it(config, tree):
    """The simulated plant pauses with the loop (default pacing ``delay``): a cycle held 3.5 ms
    is counted in ``host_delays`` and the schedule re-anchored; no period is skipped, the
    watchdog does not trip, and the result is the lockstep run's."""
    import time

    def stall(k, t):
        if k % 50 == 25:
            time.sleep(0.0035)

    plan = _demo(config)
    r = run_session(config, open_drives(config), trajectory=plan, duration=0.5, tree=tree, on_cycle=stall,
                    realtime=False)
    ref = run_session(config, open_drives(config), trajectory=plan, duration=0.5, tree=tree, lockstep=True)
    assert r["pacing"] == "delay" and r["fault"] is None, r["fault"]
    assert r["cycles"] == ref["cycles"] == round(r["duration_s"] * config.rate_hz) + 1
    d = r["host_delays"]
    assert d["count"] >= 10 and d["longest_ms"] >= 2.0, d
    assert 25 in [x[0] for x in d["at"]] and all(isinstance(x[1], float) for x in d["at"])
    assert r["rms_error"] == pytest.approx(ref["rms_error"], rel=1e-9)


@pytest.mark.parametrize("field,value", [("noise", "x"), ("noise", -1e-6), ("quantization", [1]),
                                         ("delay_cycles", -1), ("delay_cycles", "2"), ("delay_cycles", 1.5),
                                         ("seed", "a"), ("noise", float("nan"))])
def test_sim_sensor_settings_are_validated(config, field, value):
    """The sim backend's sensor settings went through float()/int() unchecked: a string gave a
    traceback, a negative delay or noise was silently taken."""
    from pkrt.rt.core.schema import ConfigError

    with pytest.raises(ConfigError, match=rf"\[drives\], field '{field}'"):
        open_drives(config, {field: value})


def test_a_log_write_failure_is_reported_in_the_summary(config, tree, tmp_path, monkeypatch):
    """The writer thread records a failed write (disk full) in ``error``; the run's summary
    dropped it, so a run whose log lost its data looked complete."""
    from pkrt.rt.runtime.record import logfile

    real = logfile._pack

    def failing(rec):
        if rec.get("type") == "block":
            raise OSError(28, "No space left on device")
        return real(rec)

    monkeypatch.setattr(logfile, "_pack", failing)
    r, _ = _run(config, tree, duration=0.3, log_path=str(tmp_path / "full.pktlog"))
    assert r["fault"] is None
    assert "No space left on device" in (r.get("log_error") or "")


def test_ctrl_c_takes_torque_off_and_says_when(config, tree, tmp_path):
    """Ctrl-C in the loop: the drives were disabled on the way out, but the summary's
    torque_off_cycle stayed None, as if torque had never been taken off."""
    def interrupt(k, t):
        if k == 100:
            raise KeyboardInterrupt

    drives = open_drives(config)
    r = run_session(config, drives, trajectory=_demo(config), lockstep=True, tree=tree, duration=0.3,
                    on_cycle=interrupt,
                    log_path=str(tmp_path / "int.pktlog"))
    assert r["fault"] == "interrupted by the user" and r["fault_cycle"] == 100
    assert r["torque_off_cycle"] == 100 and not drives.torque_on
    log = read_log(str(tmp_path / "int.pktlog"))
    assert not log.truncated and log.events[0]["cycle"] == 100


def test_sim_plant_integrates_skipped_periods_at_its_step(config):
    """After an overrun the loop skips periods and reads the plant again several periods
    later: the plant took that whole gap in one call of ``substeps`` RK4 steps (a 40 ms gap:
    20 ms steps, 80 um off); it must integrate a gap as the periods it spans."""
    def mk():
        d = open_drives(config)
        d.prepare(np.full(3, -0.1))
        d.configure()
        d.enable()
        return d

    a, b = mk(), mk()
    tau = np.array([60.0, -40.0, 80.0])
    for d in (a, b):
        d.read(0.0)
        d.write(tau)
    for k in range(1, 41):
        a.read(k * 1e-3)
    b.read(0.040)
    np.testing.assert_allclose(b.feedback.position, a.feedback.position, rtol=0, atol=1e-12)
    np.testing.assert_allclose(b.feedback.velocity, a.feedback.velocity, rtol=0, atol=1e-10)


def test_controller_gains_are_named_rows_of_the_kernel_array(config, tree):
    """The kernel takes one (7, s) array (no per-call unboxing); ``Gains`` names its rows."""
    from pkrt.rt.runtime.cycle.controller import COULOMB, KP, Controller, Gains

    c = config.controller
    ctrl = Controller(tree, "ct", c.kp, c.kd, c.tau_max, c.viscous, c.coulomb)
    g = ctrl.named_gains
    assert isinstance(g, Gains) and ctrl.gains.shape == (len(Gains._fields), tree.s)
    assert np.array_equal(g.kp, c.kp) and np.array_equal(g.coulomb, c.coulomb) and np.array_equal(g.tau_max, c.tau_max)
    assert np.shares_memory(g.kp, ctrl.gains) and np.array_equal(ctrl.gains[KP], c.kp)
    assert np.array_equal(ctrl.gains[COULOMB], c.coulomb)


def test_pinning_the_loop_moves_the_other_threads_off_its_cpu():
    """With the loop pinned, the process' other threads (the log writer ...) run on the other
    CPUs: unpinned, the log writer ran on the loop's CPU while it slept, was preempted holding
    the GIL and delayed the loop's wake-up. restore_realtime gives them every CPU back."""
    import os
    import threading

    from pkrt.rt.runtime.cycle.loop import apply_realtime, restore_realtime

    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("one CPU: nowhere to move the other threads")
    cpu = max(cpus)
    done = threading.Event()
    th = threading.Thread(target=done.wait, name="pkrt-test-worker", daemon=True)
    th.start()
    try:
        rep = apply_realtime(0, cpu, False, gc_freeze=False)
        try:
            assert os.sched_getaffinity(0) == {cpu}
            assert os.sched_getaffinity(th.native_id) == cpus - {cpu}
            assert "pkrt-test-worker" in rep["other_threads"] and rep["other_threads"].startswith("applied")
        finally:
            restore_realtime(rep)
        assert os.sched_getaffinity(0) == cpus and os.sched_getaffinity(th.native_id) == cpus
    finally:
        done.set()
        th.join()
