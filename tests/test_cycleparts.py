"""The cycle's per-part timing (rt/runtime/cycle/cycleparts.py) and the simulated plant stepped ahead
of its read (``Drives.advance``): parts add up to the compute, and a run gives the same result
as the old in-read stepping, noise, delay and injected faults included."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.drivers import open_drives
from pkrt.rt.app.reference import plan_reference
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.cycle.cycleparts import GROUPS, PARTS, ROWS, CycleParts
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.runtime.machine.runsetup import load_controller_tree
from pkrt.rt.runtime.machine.run import run_session

_CACHE: dict = {}


def _machine():
    if not _CACHE:
        config = load_machine("orthoglide")
        _CACHE.update(config=config, tree=load_controller_tree(config), demo=plan_reference(config))
    return _CACHE["config"], _CACHE["tree"], _CACHE["demo"]


def _lockstep(tmp_path, name, *, old_cycle=False, overrides=None, inject=(), **kw):
    config, tree, demo = _machine()
    drives = open_drives(config, overrides or {})
    for args in inject:
        drives.inject(*args)
    log = str(tmp_path / f"{name}.pktlog")
    r = run_session(config, drives, trajectory=demo, lockstep=True, tree=tree, log_path=log,
                    old_cycle=old_cycle, **kw)
    return r, drives, read_log(log)


def test_parts_recorded_exactly():
    """Known stamps: each part's duration binned, the groups summed, a part not reached 0 ns,
    the long tail in the coarse bins and its max exact."""
    p = CycleParts()
    for k in range(100):
        ts = p.ts
        ts[:9] = 1_000 + np.cumsum([0, 1_000, 200, 3_000, 400, 500, 600, 4_000, 10_000])
        if k == 99:  # one long cycle: its tree part 5 ms, no plant step (stamp not taken)
            ts[3:9] += 5_000_000 - 3_000
            ts[8] = 0
        p.commit()
    assert p.count == 100
    res = 0.05  # us: the fine bins' width
    assert p.percentiles_us("read")["p50"] == pytest.approx(1.0, abs=res)
    assert p.percentiles_us("tree")["p50"] == pytest.approx(3.0, abs=res)
    assert p.percentiles_us("tree")["max"] == 5000.0
    assert p.percentiles_us("tree")["p99.9"] == pytest.approx(5000.0, abs=2.0)  # a coarse bin (2 us)
    assert p.percentiles_us("plant")["p50"] == pytest.approx(10.0, abs=res)
    assert p.mean_us("plant") == pytest.approx(10.0 * 99 / 100)
    assert p.mean_us("compute") == pytest.approx((9.7 * 99 + 9.7 - 3.0 + 5000.0) / 100)
    assert p.percentiles_us("drives")["p50"] == pytest.approx(1.0 + 0.5 + 10.0, abs=res)
    summary = p.summary()
    assert set(summary["p50_p99_max_us"]) == set(ROWS)


def test_stage_time_moved_out_of_the_kernel_window():
    """Time the one kernel call spent staging the row (``ts[9]``) leaves the safety part for the
    stage part; tree, law, write and bookkeeping keep theirs, the compute is unchanged."""
    p = CycleParts()
    p.ts[:9] = np.cumsum([0, 1_000, 2_000, 3_000, 400, 500, 600, 4_000, 10_000])
    p.ts[9] = 1_500
    p.commit()
    got = {r: p.mean_us(r) for r in ("safety", "tree", "law", "write", "bookkeeping", "stage", "compute")}
    assert got == pytest.approx({"safety": 0.5, "tree": 3.0, "law": 0.4, "write": 0.5, "bookkeeping": 0.6,
                                 "stage": 5.5, "compute": 11.5})
    assert not p.ts.any()  # cleared for the next cycle


def test_parts_add_up_to_the_compute(tmp_path):
    """A lockstep run: every part measured on every cycle, the parts' sums are the compute's
    (integer ns: exactly, to the summary's rounding), the plant's step outside the compute."""
    r, _, _ = _lockstep(tmp_path, "parts")
    parts = r["cycle_parts"]
    assert parts["cycles"] == r["cycles"] > 5000
    mean = parts["mean_us"]
    assert sum(mean[p] for p in GROUPS["compute"]) == pytest.approx(mean["compute"], abs=0.01)
    assert mean["plant"] > 0.0 and "plant" not in GROUPS["compute"]
    assert sum(mean[p] for p in GROUPS["drives"]) == pytest.approx(mean["drives"], abs=0.01)
    for p in PARTS:
        p50, p99, mx = parts["p50_p99_max_us"][p]
        assert 0.0 < p50 <= p99 <= mx, p
    # the older summary's split, now from the same histograms
    assert r["controller_us"]["p50"] > 0 and r["drive_us"]["p50"] > r["controller_us"]["p50"] / 10
    assert r["realtime_factor_cpu"] > 0


@pytest.mark.parametrize("overrides", [{}, {"noise": 2e-6, "force_noise": 3.0, "delay_cycles": 2, "seed": 7}],
                         ids=["plain", "noise-delay"])
def test_plant_ahead_gives_the_old_result(tmp_path, overrides):
    """The plant stepped after write (new) and inside the next read (old): the same feedback
    sequence, so the same log, tracking error and final plant state, bit for bit."""
    new, dn, ln = _lockstep(tmp_path, "new", overrides=overrides)
    old, do, lo = _lockstep(tmp_path, "old", old_cycle=True, overrides=overrides)
    assert new["fault"] is None and old["fault"] is None
    assert new["rms_error"] == old["rms_error"] and new["max_error"] == old["max_error"]
    assert np.array_equal(dn.plant.x, do.plant.x)
    for ch in ("pos", "vel", "tau", "tau_model", "ref_pos", "flags"):
        assert np.array_equal(ln.get(ch), lo.get(ch)), ch
    assert old["cycle_parts"]["mean_us"]["plant"] == 0.0  # old: the step is inside read


@pytest.mark.parametrize("inject,why", [(("nan", 0.3), "non-finite feedback"), (("stale", 0.3), "stale feedback"),
                                        (("freeze", 0.3), "following error"), (("push", 0.2, -300.0), "")])
def test_injected_faults_same_cycle(tmp_path, inject, why):
    """Each injected fault stops the run at the same cycle with the same reason and the same
    log as with the old stepping; an injection during the run (at a cycle start, after the
    plant was stepped ahead) undoes that step, so it acts from the same read as before."""
    at = int(inject[1] * 1000)

    def late(drives):
        return lambda k, t: drives.inject(*inject) if k == at else None

    for mode in ("before", "during"):
        runs = []
        for old in (False, True):
            config, tree, demo = _machine()
            drives = open_drives(config)
            if mode == "before":
                drives.inject(*inject)
            log = str(tmp_path / f"{mode}{old}.pktlog")
            r = run_session(config, drives, trajectory=demo, lockstep=True, tree=tree, log_path=log, old_cycle=old,
                            on_cycle=late(drives) if mode == "during" else None)
            runs.append((r, read_log(log), drives))
        (rn, ln, dn), (ro, lo, do) = runs
        assert rn["fault"] == ro["fault"] and rn["fault_cycle"] == ro["fault_cycle"], mode
        assert why in (rn["fault"] or "")
        assert not dn.torque_on
        assert np.array_equal(ln.get("pos"), lo.get("pos"), equal_nan=True), mode
        assert np.array_equal(dn.plant.x, do.plant.x), mode


def test_advance_undone_by_a_read_at_another_time():
    """A read at another time than the step ahead was for (a skipped period) undoes it and steps
    from the same state: the same feedback as without stepping ahead."""
    config, _, demo = _machine()
    a, b = open_drives(config, {"force_noise": 2.0}), open_drives(config, {"force_noise": 2.0})
    tau = np.array([5.0, -3.0, 2.0])
    for d in (a, b):
        d.prepare(demo.pos[0].copy())
        d.configure()
        d.enable()
        d.read(0.0)
        d.write(tau)
    a.advance(0.001)
    fa, fb = a.read(0.003), b.read(0.003)
    assert np.array_equal(fa.position, fb.position) and np.array_equal(fa.velocity, fb.velocity)
    a.write(tau)
    b.write(tau)
    a.advance(0.004)
    assert np.array_equal(a.read(0.004).position, b.read(0.004).position)


def test_realtime_run_reports_parts():
    """A short real-time run (no real-time settings): the parts and the plant outside the
    compute in its summary, no fault."""
    config, tree, demo = _machine()
    r = run_session(config, open_drives(config), trajectory=demo, duration=0.3, tree=tree, realtime=False)
    assert r["fault"] is None
    parts = r["cycle_parts"]
    assert parts["cycles"] == r["cycles"]
    assert parts["p50_p99_max_us"]["plant"][0] > 0.0
    assert sum(parts["mean_us"][p] for p in GROUPS["compute"]) == pytest.approx(parts["mean_us"]["compute"], abs=0.01)


def test_run_text_shows_the_parts(tmp_path):
    """``pkrt run`` prints the parts in one line, the plant apart from the compute."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "run", "--lockstep", "--duration", "0.5", "--no-log"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "cycle parts us p50/p99" in x)
    for part in ("read", "safety", "tree", "law", "write", "bookkeeping", "stage", "plant step after write"):
        assert f"{part} " in line


def test_stage_row_refuses_a_short_row():
    """numba does not check bounds: a row too short for the layout is refused, not overrun
    (a row one value short corrupted the heap of every no-log run before this check)."""
    from pkrt.rt.runtime.cycle.staging import stage_row

    z = np.zeros(3)
    with pytest.raises(ValueError, match="4 \\+ 7 s"):
        stage_row(np.zeros(3 + 7 * 3), 0.0, z, z, z, z, z, z, True, z, 0.0, 0.0, 0, z)
    row = np.zeros(4 + 7 * 3)
    stage_row(row, 1.0, z + 1, z, z, z + 0.5, z, z, True, z, 2.0, 3.0, 4, z)
    assert row[0] == 1.0 and row[-3:].tolist() == [2.0, 3.0, 4.0] and row[1] == 1.0


def test_fused_call_bound_to_the_loops_arrays():
    """``Controller.checked`` goes through the entry point ``bind`` resolved only for the bound
    arrays and rows of the bound rings, with the dispatcher's results; anything else (a copy of
    a row, a foreign vector, rings that do not own their memory) takes the dispatcher."""
    from pkrt.rt.runtime.cycle.controller import Controller, checked_control
    from pkrt.rt.runtime.cycle.safety import Supervisor

    config, tree, demo = _machine()
    ctrl = Controller(tree, "ct", 400.0, 40.0, 500.0)
    sup = Supervisor(config.limits, ["q1", "q2", "q3"], ["m"] * 3)
    s = tree.s
    pos, vel = demo.pos[100].copy(), np.array([0.01, -0.02, 0.03])
    rings = tuple(a[:8].copy() for a in (demo.pos, demo.vel, demo.acc))
    err_ring, row = np.zeros((8, s)), np.zeros(4 + 7 * s)

    def call(rp, rv, ra, e):
        return ctrl.checked(pos, vel, rp, rv, ra, sup.limits, 1.0, row, e)

    ctrl.bind(pos, vel, sup.limits, row, rings, err_ring)
    assert ctrl._bound is not None
    bound_path = ctrl._bound[0]
    rows = tuple(r[3] for r in rings)
    want = checked_control(ctrl.arrays, ctrl.kind, pos, vel, *(r.copy() for r in rows), ctrl.gains, sup.limits,
                           ctrl.ws, ctrl.obs, 0, 1.0, np.zeros_like(row), np.zeros(s))
    tau_want = ctrl.tau.copy()
    got = call(*rows, err_ring[3])
    assert got[:4] == want[:4] and np.array_equal(ctrl.tau, tau_want)
    assert np.array_equal(err_ring[3], rows[0] - pos)
    got = call(*(r.copy() for r in rows), np.zeros(s))  # not rows of the rings: the dispatcher
    assert got[:4] == want[:4] and np.array_equal(ctrl.tau, tau_want)
    assert ctrl._bound[0] is bound_path  # the binding stays for the loop's next cycle
    used = []  # which calls take the entry point: a recorder in its place
    ctrl._bound = ((lambda *a: used.append(a[4]) or bound_path(*a)), *ctrl._bound[1:])
    call(*rows, err_ring[3])
    call(*(r.copy() for r in rows), err_ring[3])
    call(*rows, np.zeros(s))
    assert len(used) == 1 and used[0] is rows[0]
    ctrl.bind(pos, vel, sup.limits, row, tuple(r[::1, :] for r in rings), err_ring)  # views: not bound
    assert ctrl._bound is None
    assert call(*rows, err_ring[3])[:4] == want[:4]
