"""pkrt replay: run -> log -> replay (lockstep, real time, mass mismatch) and --offline, on a
four-bar machine on the simulated plant (trees built here, in seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pkrt.rt.cli import main
from pkrt.rt.runtime.record.logfile import read_log

from .realtime import judge

MACHINE = """\
[machine]
name = "fourbar-sim"
model = "fourbar"
tree = "fourbar.pkt"
rate_hz = 1000.0

[controller]
kind = "ct"
bandwidth_hz = 8.0
tau_max = 5.0

[limits]
velocity = 10.0
acceleration = 200.0
following_error = 0.2

[drives]
backend = "sim"
plant_tree = "fourbar-plant.pkt"
viscous = {viscous}
coulomb = {coulomb}
force_limit = 5.0
"""


def make_fourbar_machine(folder: Path, viscous: float = 0.01, coulomb: float = 0.005) -> dict:
    """Trees (controller: 64 boxes; plant: 256 boxes, finer), a machine configuration and a
    2 s trajectory CSV in ``folder``. Returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, boxes in (("fourbar.pkt", 64), ("fourbar-plant.pkt", 256)):
        if not (folder / name).exists():
            assert main(["build", "fourbar", "-o", str(folder / name), "--boxes", str(boxes),
                         "--jobs", "1", "--verify-samples", "300"]) == 0
    cfg = folder / f"fourbar-sim-{viscous}-{coulomb}.toml"
    cfg.write_text(MACHINE.format(viscous=viscous, coulomb=coulomb))
    t = np.linspace(0.0, 2.0, 401)
    theta = 0.8 * np.sin(2 * np.pi * 0.75 * t) * np.sin(np.pi * t / 2) ** 2
    traj = folder / "traj.csv"
    np.savetxt(traj, np.c_[t, theta], delimiter=",", header="t,theta", comments="")
    return {"machine": cfg, "traj": traj, "tree": folder / "fourbar.pkt",
            "plant_tree": folder / "fourbar-plant.pkt"}


def run_logged(machine, traj, log, lockstep=True, **overrides) -> dict:
    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import run_session

    config = load_machine(str(machine))
    drives = open_drives(config, overrides)
    try:
        return run_session(config, drives, trajectory=str(traj), lockstep=lockstep, log_path=str(log))
    finally:
        drives.close()


@pytest.fixture(scope="module")
def fourbar(tmp_path_factory):
    d = tmp_path_factory.mktemp("fourbar")
    m = make_fourbar_machine(d)
    m["log"] = d / "run.pkl"
    m["summary"] = run_logged(m["machine"], m["traj"], m["log"])
    assert m["summary"]["fault"] is None
    return m


def replay_json(capsys, *argv) -> dict:
    capsys.readouterr()  # drop earlier output (tree builds)
    code = main(["replay", *map(str, argv), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_lockstep_replay_reproduces_torques_exactly(fourbar, capsys):
    # exact: the log was written by this session's run (same code, same machine, same
    # floating-point operations); it is no stored value from another machine
    r = replay_json(capsys, fourbar["log"])
    assert r["mode"] == "lockstep" and r["reference"]["sample_exact"]
    assert r["same_tree"] is True
    d = r["difference"]
    assert d["cycles_compared"] == fourbar["summary"]["cycles"] == 2001
    assert d["identical_torques"] is True
    assert d["axes"]["theta"] == {"pos_rms": 0.0, "pos_max": 0.0, "tau_rms": 0.0, "tau_max": 0.0,
                                  "tau_model_rms": 0.0, "tau_model_max": 0.0,
                                  "pos_unit": "rad", "tau_unit": "N m"}
    assert r["replay"]["rms_error"] == r["original"]["rms_error"]


def test_mass_mismatch_is_reported(fourbar, tmp_path, capsys):
    out = tmp_path / "replay.pkl"
    r = replay_json(capsys, fourbar["log"], "--mass-scale", "1.1", "--log", out)
    assert r["plant_overrides"]["mass_scale"] == 1.1
    d = r["difference"]["axes"]["theta"]
    assert not r["difference"]["identical_torques"]
    assert d["tau_rms"] > 1e-3 and d["pos_max"] > 1e-4  # N m, rad: a 10 % heavier plant
    assert r["replay"]["rms_error"] > r["original"]["rms_error"]
    # the kept replay log agrees with the reported numbers
    new, orig = read_log(out), read_log(fourbar["log"])
    diff = new.channels["tau"] - orig.channels["tau"]
    assert d["tau_max"] == pytest.approx(np.abs(diff).max(), rel=1e-12)
    # text output names the difference
    assert main(["replay", str(fourbar["log"]), "--mass-scale", "1.1"]) == 0
    assert "commanded torques differ" in capsys.readouterr().out


@pytest.mark.realtime
def test_realtime_replay(fourbar, capsys):
    r = replay_json(capsys, fourbar["log"], "--realtime")
    assert r["mode"] == "realtime" and r["difference"]["cycles_compared"] > 0
    if r["replay"]["overruns"] == 0:  # same cycle code, same plant steps: same torques
        assert r["difference"]["identical_torques"]


def test_offline_recovers_torques_within_tree_error(tmp_path, capsys):
    """No friction in the plant: the model alone explains the commanded torques, to within the
    controller tree's stated error (relative to the largest torque)."""
    m = make_fourbar_machine(tmp_path, viscous=0.0, coulomb=0.0)
    log = tmp_path / "nofric.pkl"
    assert run_logged(m["machine"], m["traj"], log)["fault"] is None
    r = replay_json(capsys, log, "--offline")
    assert r["same_tree_as_run"] is True
    f = r["filter"]
    assert f["window"] == 21 and f["polyorder"] == 3 and 30 < f["cutoff_hz"] < 80
    assert r["cycles_used"] == 2001 - 20
    res = r["residual"]["theta"]
    stated = r["tree_stated_error"]["max_rel_tau_error"]
    assert 0 < stated < 0.05
    assert res["max"] < stated * res["max_abs_tau"], (res, stated)
    assert res["max_abs_tau"] > 0.3  # N m: the motion is not trivial
    # the plant's own tree (the exact physics of this plant, stated error ~2e-4): still within it
    r2 = replay_json(capsys, log, "--offline", "--tree", m["plant_tree"])
    res2, stated2 = r2["residual"]["theta"], r2["tree_stated_error"]["max_rel_tau_error"]
    assert stated2 < stated and res2["max"] < stated2 * res2["max_abs_tau"], (res2, stated2)
    # relative RMS well under 1e-4 (without the zero-order-hold alignment it is ~9e-4 here)
    assert res2["rms"] < 1e-4 * res2["max_abs_tau"]


def test_offline_fits_the_plant_friction(fourbar, capsys):
    r = replay_json(capsys, fourbar["log"], "--offline")
    res = r["residual"]["theta"]
    fit = res["friction_fit"]
    assert fit["viscous"] == pytest.approx(0.01, rel=0.1)  # N m s/rad, the plant's
    assert fit["coulomb"] == pytest.approx(0.005, rel=0.1)  # N m
    assert fit["rms_after"] < 0.1 * res["rms"]
    assert main(["replay", str(fourbar["log"]), "--offline"]) == 0
    assert "savitzky-golay" in capsys.readouterr().out


def test_exported_reference_runs_again(fourbar, tmp_path, capsys):
    """A trajectory recorded from a run is accepted back as --traj and gives the same reference."""
    traj = tmp_path / "ref.csv"
    assert main(["log", "export", str(fourbar["log"]), "--traj", str(traj)]) == 0
    log2 = tmp_path / "again.pkl"
    s = run_logged(fourbar["machine"], traj, log2)
    a, b = read_log(fourbar["log"]), read_log(log2)
    assert s["fault"] is None and b.n_cycles == a.n_cycles
    np.testing.assert_allclose(b.channels["ref_pos"], a.channels["ref_pos"], atol=1e-12)
    np.testing.assert_allclose(b.channels["tau"], a.channels["tau"], atol=0.02)


def test_replay_errors(fourbar, tmp_path, capsys):
    log = fourbar["log"]
    assert main(["replay", str(log), "--offline", "--mass-scale", "1.1"]) == 2
    assert "--offline takes no" in capsys.readouterr().err
    assert main(["replay", str(log), "--window", "10", "--offline"]) == 2
    assert "--window must be odd" in capsys.readouterr().err
    assert main(["replay", str(log), "--mass-scale", "-1"]) == 2
    assert "--mass-scale must be positive" in capsys.readouterr().err
    assert main(["replay", str(log), "--mass-scale", "inf"]) == 2  # was a plant blow-up fault, exit 1
    assert "--mass-scale must be positive" in capsys.readouterr().err
    before = Path(log).read_bytes()
    assert main(["replay", str(log), "--log", str(log)]) == 2  # the replay's log overwrote the original
    assert "--log" in capsys.readouterr().err and Path(log).read_bytes() == before
    assert main(["replay", str(log), "--lockstep", "--realtime"]) == 2
    capsys.readouterr()
    assert main(["replay", str(log), "--machine", "orthoglide"]) == 2
    assert "the log has 1 axes" in capsys.readouterr().err
    # a log whose machine file is gone: clear message, exit 2
    from pkrt.rt.runtime.record.logfile import LogWriter

    orphan = tmp_path / "orphan.pkl"
    w = LogWriter(orphan, {"machine_path": str(tmp_path / "gone.toml"), "rate_hz": 1000.0},
                  [("t", 1, "s"), ("ref_pos", 1, "rad"), ("pos", 1, "rad"), ("tau", 1, "N m")])
    for i in range(50):
        w.row[:] = (i * 1e-3, 0.0, 0.0, 0.0)
        w.commit()
    w.close({})
    assert main(["replay", str(orphan)]) == 2
    err = capsys.readouterr().err
    assert "give --machine" in err and "Traceback" not in err
    not_a_log = tmp_path / "x.pkl"
    not_a_log.write_bytes(b"\x00\x01garbage")
    assert main(["replay", str(not_a_log)]) == 2
    assert "not a pkrt log" in capsys.readouterr().err


def test_orthoglide_demo_replays_exactly_and_reports_mass_mismatch(tmp_path, capsys):
    """The built-in Orthoglide on its simulated plant (1.5 s of the demo)."""
    from pkrt.drivers import open_drives
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import run_session

    config = load_machine("orthoglide")
    log = tmp_path / "og.pkl"
    drives = open_drives(config, {})
    try:
        s = run_session(config, drives, trajectory=plan_reference(config), duration=1.5, lockstep=True,
                        log_path=str(log))
    finally:
        drives.close()
    assert s["fault"] is None and s["cycles"] == 1501
    r = replay_json(capsys, log)
    assert r["difference"]["identical_torques"] and r["same_tree"] is True
    r = replay_json(capsys, log, "--mass-scale", "0.9")
    for ax in ("q1", "q2", "q3"):
        d = r["difference"]["axes"][ax]
        assert d["tau_rms"] > 0.1 and d["pos_max"] > 1e-6  # N, m


def test_compare_aligns_rows_by_loop_time(tmp_path):
    """A real-time original that skipped periods 3 and 4 is compared cycle for cycle."""
    from pkrt.rt.runtime.record.logfile import LogWriter
    from pkrt.rt.runtime.logs.replay import compare_logs

    def write(path, ks, offset):
        w = LogWriter(path, {"rate_hz": 100.0, "axes": ["a"]},
                      [("t", 1, "s"), ("pos", 1, "m"), ("tau", 1, "N")])
        for k in ks:
            w.row[:] = (k / 100.0, 0.1 * k, k + offset)
            w.commit()
        w.close({})
        return read_log(path)

    orig = write(tmp_path / "o.pkl", [0, 1, 2, 5, 6, 7], 0.0)
    new = write(tmp_path / "n.pkl", range(8), 0.5)
    d = compare_logs(orig, new)
    assert d["cycles_compared"] == 6
    assert d["axes"]["a"]["pos_max"] == 0.0 and d["axes"]["a"]["tau_max"] == 0.5


class LateClock:
    """The loop's clock for a run whose late cycles are known: time stands at each deadline
    (as in lockstep) except that ``late(s)``, called in a cycle, makes that cycle end ``s``
    seconds later; the loop (paced ``skip``) then skips the periods it overran, as after a
    host pause, on any host, every time."""

    lockstep = False  # the loop's real-time path: next_cycle skips periods

    def __init__(self):
        self.t = self.t0 = 0.0  # loop time (s); t0 is set by the loop and not used

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> float:
        late, self.t = max(0.0, self.t - t), max(self.t, t)
        return late

    def late(self, s: float) -> None:
        self.t += s


def test_replay_of_a_log_with_skipped_periods_stays_aligned(fourbar, tmp_path, capsys):
    """A real-time run that overran skips periods: its rows have gaps in loop time. The replay
    must rebuild the reference in loop time (not play the rows back to back). The run's five
    late cycles (3.5 ms at cycles 200, 600, ..., periods k+1..k+3 skipped) are made on the
    loop's clock (``LateClock``), not hoped for from the host: the log has exactly these gaps."""
    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import Session, StopSignals

    config = load_machine(str(fourbar["machine"]))
    log = tmp_path / "gaps.pkl"
    clock = LateClock()
    stalls = [200, 600, 1000, 1400, 1800]

    def stall(k, t):
        if k in stalls:
            clock.late(0.0035)  # three periods and a half late

    with StopSignals() as stop:
        session = Session(config, open_drives(config), stop, trajectory=str(fourbar["traj"]), duration=None,
                          lockstep=False, log_path=str(log), controller=None, telemetry=None, on_cycle=stall,
                          tree=None, realtime=False, pacing="skip")
        session.clock = clock
        r = session.run()
    assert r["fault"] is None and r["overruns"] == len(stalls) and not r["lockstep"]
    k = np.rint(read_log(log).channels["t"] * 1000.0).astype(int)  # the loop cycle of each row
    gaps = np.flatnonzero(np.diff(k) != 1)
    assert k[gaps].tolist() == stalls and (k[gaps + 1] - k[gaps]).tolist() == [4] * len(stalls)
    assert main(["replay", str(log), "--lockstep", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reference"]["sample_exact"] is False
    for ax in out["difference"]["axes"].values():
        assert ax["pos_max"] < 1e-3, ax  # aligned: the difference is the skipped periods' effect only


def test_replay_of_a_faulted_log_compares_the_cycles_before_the_fault(fourbar, tmp_path, capsys):
    """The fault row of a faulted run holds the bad reading (NaN) and a torque of 0 (torque
    off): comparing it made the position difference NaN (null in JSON) and the torques differ,
    though the lockstep replay reproduces every controlled cycle exactly."""
    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import run_session

    config = load_machine(str(fourbar["machine"]))
    drives = open_drives(config)
    drives.inject("nan", 0.5)
    log = tmp_path / "nan.pkl"
    try:
        r = run_session(config, drives, trajectory=str(fourbar["traj"]), lockstep=True, log_path=str(log))
    finally:
        drives.close()
    assert r["fault_cycle"] == 500
    out = replay_json(capsys, log, "--lockstep")
    d = out["difference"]
    assert d["cycles_compared"] == 500
    assert d["identical_torques"] is True
    assert d["axes"]["theta"]["pos_max"] == 0.0 and d["axes"]["theta"]["tau_max"] == 0.0


def test_replay_of_a_log_that_lost_its_first_block_stays_aligned(fourbar, tmp_path, capsys):
    """A log whose first rows are missing (a bad first block) starts at loop cycle k0 > 0;
    the replay starts there at its own cycle 0, so the comparison must shift it by k0 (it
    compared the replay's cycle k with the original's cycle k: a k0-period time shift)."""
    from pkrt.rt.runtime.record.logfile import LogWriter

    orig = read_log(fourbar["log"])
    k0 = 300
    header = {k: v for k, v in orig.header.items() if k not in ("format", "version", "created", "software",
                                                                  "block_cycles")}
    cut = tmp_path / "cut.pkl"
    w = LogWriter(cut, header, [(n, orig.widths[n], orig.units[n]) for n in orig.channels])
    for r in range(k0, orig.n_cycles):
        for n, a in orig.channels.items():
            w.views[n][...] = a[r]
        w.commit()
    w.close(orig.summary)
    out = replay_json(capsys, cut, "--lockstep")
    d = out["difference"]
    assert d["cycles_compared"] == orig.n_cycles - k0
    # the replay starts at rest where the original was moving: a short transient, not a shift
    assert d["axes"]["theta"]["pos_max"] < 0.02, d


def test_replay_runs_at_the_logged_rate(fourbar, tmp_path, capsys):
    """A run at --rate 500 on a 1 kHz machine: the replay ran at the machine's 1 kHz and
    compared its cycle k (t = k / 1000) with the original's cycle k (t = k / 500)."""
    import dataclasses

    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import run_session

    config = dataclasses.replace(load_machine(str(fourbar["machine"])), rate_hz=500.0)
    drives = open_drives(config)
    log = tmp_path / "r500.pkl"
    try:
        r = run_session(config, drives, trajectory=str(fourbar["traj"]), lockstep=True, log_path=str(log))
    finally:
        drives.close()
    assert r["fault"] is None and r["cycles"] == 1001
    out = replay_json(capsys, log, "--lockstep")
    assert out["reference"]["sample_exact"] is True
    d = out["difference"]
    assert d["cycles_compared"] == 1001 and d["identical_torques"] is True


@pytest.mark.realtime
def test_replay_of_a_realtime_log_that_stopped_moving_mid_motion(fourbar, tmp_path, capsys, host_probe):
    """A real-time run with skipped periods that the watchdog stopped mid-motion: the
    reference was rebuilt by a *clamped* spline (zero velocity forced at the end), whose
    acceleration spike made the replay refuse the reference as beyond the limits."""
    import time

    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import run_session

    config = load_machine(str(fourbar["machine"]))
    log = tmp_path / "wd.pkl"

    def stall(k, t):
        if k % 300 == 150 or k >= 1100:
            time.sleep(0.0035)  # now and then, then every cycle: the watchdog stops the run

    def run():
        log.unlink(missing_ok=True)
        return run_session(config, open_drives(config), trajectory=str(fourbar["traj"]), log_path=str(log),
                           on_cycle=stall, realtime=False, pacing="skip")  # the watchdog on (not the sim's default)

    def found(r) -> list[tuple[float, str]]:  # a watchdog that a loaded host trips earlier is as good
        ok = r["fault"] is not None and "watchdog" in r["fault"] and r["fault_cycle"] < 1990  # mid-motion
        return [] if ok else [(r["fault_time"] or time.monotonic(), f"fault at cycle {r['fault_cycle']}: {r['fault']}")]

    r = judge(run, host_probe, find=found)
    assert r["fault"] is not None and "watchdog" in r["fault"] and r["overruns"] >= 5
    capsys.readouterr()
    assert main(["replay", str(log), "--lockstep", "--json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["reference"]["sample_exact"] is False
    for ax in out["difference"]["axes"].values():
        assert ax["pos_max"] < 1e-3, ax
