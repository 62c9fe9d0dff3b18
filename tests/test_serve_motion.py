"""A served machine's motion sources in lockstep on the simulated Delta, driven in the loop's
thread (``Machine.run(on_cycle=...)``: each command at a known cycle): feed hold and resume on
the Adept cycle (reference on the path, forces within limits, the same end as an uninterrupted
run), jog release distance, soft limits, override, live targets."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.rt.app.serve import Served
from pkrt.rt.runtime.cycle.controller import FLAG_SATURATED
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.runtime.machine.settings import ServeSettings, soft_limits
from pkrt.rt.runtime.machine.states import State


def served(tmp_path, name="run", settings=None, machine="delta"):
    return Served(machine, socket_path=str(tmp_path / f"{name}.sock"), lockstep=True,
                  log_path=str(tmp_path / f"{name}.pktlog"), settings=settings)


class Script:
    """Commands at given cycles (``at``), or when a condition first holds (``when``)."""

    def __init__(self):
        self.at: dict[int, list[dict]] = {}
        self.when: list[tuple] = []
        self.replies: list[tuple[int, dict, object]] = []

    def __call__(self, m) -> None:
        for cmd in self.at.pop(m.cycles, []):
            self.replies.append((m.cycles, cmd, m.submit(cmd)))
        for w in list(self.when):
            cond, cmd = w
            if cond(m):
                self.when.remove(w)
                self.replies.append((m.cycles, cmd, m.submit(cmd)))

    def check_ok(self):
        for k, cmd, p in self.replies:
            r = p.wait(0)
            assert r["ok"], (k, cmd.get("cmd"), r)


@pytest.fixture(scope="module")
def adept():
    return adept_of("delta")


def adept_of(machine: str):
    """A machine's demo (three Adept cycles from and back to home) planned once, and the task
    path it follows sampled at 10 kHz (chords 0.04 um off the curve): (config, plan, task
    kinematics, dense path)."""
    from pkrt.models.kinematics.taskspace import TaskKinematics, adept_cycle, join, line
    from pkrt.rt.app.reference import machine_mechanism, plan_reference
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.core.plan import concatenate

    config = load_machine(machine)
    plan = plan_reference(config, "demo")
    mech = machine_mechanism(config)
    kin = TaskKinematics(mech)
    d = config.demo
    home = kin.forward(np.zeros(3))[0]
    one = adept_cycle(np.asarray(d.start, float), 10000.0, d.cycle_time, d.height, d.width, d.direction)
    piece = join([one] * d.cycles, one.description)
    dense = concatenate([line(home, piece.pos[0], d.approach, 10000.0), piece,
                         line(piece.pos[-1], home, d.approach, 10000.0)], {}).pos
    return config, plan, kin, dense


def path_distance(points: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """Distance of each point to the polyline ``dense`` (nearest vertex, then its two segments)."""
    from scipy.spatial import cKDTree

    _, idx = cKDTree(dense).query(points)
    out = np.empty(len(points))
    for j, (p, i) in enumerate(zip(points, idx)):
        best = np.linalg.norm(p - dense[i])
        for a, b in ((i - 1, i), (i, i + 1)):
            if 0 <= a and b < len(dense):
                ab = dense[b] - dense[a]
                u = np.clip(np.dot(p - dense[a], ab) / np.dot(ab, ab), 0, 1)
                best = min(best, np.linalg.norm(p - dense[a] - u * ab))
        out[j] = best
    return out


def run_program(tmp_path, name, plan, hold_at=None, resume_after=None, override=None):
    srv = served(tmp_path, name)
    s = Script()
    s.at = {1: [{"cmd": "enable"}], 2: [{"cmd": "home"}], 3: [{"cmd": "run", "plan": plan}]}
    if override is not None:
        s.at.setdefault(override[0], []).append({"cmd": "override", "value": override[1]})
    held = {}
    if hold_at is not None:
        s.at.setdefault(hold_at, []).append({"cmd": "hold"})

        def holding(m):
            if m.state is State.HOLDING and "k" not in held:
                held["k"] = m.cycles
            return "k" in held and m.cycles >= held["k"] + resume_after
        s.when.append((holding, {"cmd": "resume"}))
    end = {}

    def hook(m):
        s(m)
        if m.cycles > 10 and m.state is State.STANDSTILL and "k" not in end:
            end["k"] = m.cycles
        if "k" in end and m.cycles == end["k"] + 300:  # settled at the end
            m.shutdown("test done")
    try:
        summary = srv.machine.run(max_cycles=60000, on_cycle=hook)
    finally:
        srv.close()
    s.check_ok()
    assert summary["fault"] is None, summary
    return read_log(str(tmp_path / f"{name}.pktlog")), held, summary


def test_feed_hold_on_the_adept_cycle_stays_on_the_path_and_ends_where_an_uninterrupted_run_does(tmp_path, adept):
    config, plan, kin, dense = adept
    peak = int(np.argmax(np.linalg.norm(plan.vel, axis=1)))  # hold from full speed
    plain, _, _ = run_program(tmp_path, "plain", plan)
    held_log, held, _ = run_program(tmp_path, "held", plan, hold_at=3 + peak, resume_after=200)
    assert "k" in held
    ref = held_log.channels["ref_pos"]
    state = held_log.channels["state"]
    # the reference while the hold ramps down, rests and resume ramps up: on the path
    k0 = 3 + peak
    k1 = held["k"] + 200 + 400
    x = kin.forward(ref[k0:k1])
    dist = path_distance(x, dense)
    assert dist.max() <= 1e-6, dist.max()
    assert np.ptp(ref[held["k"] + 10:held["k"] + 190], axis=0).max() == 0.0  # at rest while held
    # forces within the machine's limits, no saturation, accelerations within the limits
    tau = held_log.channels["tau"]
    assert np.abs(tau).max() <= config.controller.tau_max.max()
    assert not np.any(held_log.channels["flags"].astype(int) & FLAG_SATURATED)
    assert np.all(np.abs(held_log.channels["ref_acc"]) <= config.limits.acceleration * (1 + 1e-9))
    assert np.all(np.abs(held_log.channels["ref_vel"]) <= config.limits.velocity * (1 + 1e-9))
    # the hold took longer than the uninterrupted run by the pause and its ramps; both end the same
    assert len(ref) > len(plain.channels["ref_pos"]) + 200
    end_plain = kin.forward(plain.channels["pos"][-1])[0]
    end_held = kin.forward(held_log.channels["pos"][-1])[0]
    assert np.linalg.norm(end_plain - end_held) <= 1e-6
    assert np.abs(ref[-1] - plan.pos[-1]).max() == 0.0
    codes = held_log.header["state_codes"]
    assert np.any(state == codes["holding"])
    kinds = [e["message"] for e in held_log.events if e["kind"] == "state"]
    assert any("moving -> holding: feed hold" in k for k in kinds) and any("holding -> moving: resume" in k for k in kinds)


def test_override_rescales_time_along_the_same_path_within_the_limits(tmp_path, adept):
    config, plan, kin, dense = adept
    log, _, _ = run_program(tmp_path, "slow", plan, override=(300, 0.5))
    ref = log.channels["ref_pos"]
    x = kin.forward(ref[300:2000:7])
    assert path_distance(x, dense).max() <= 1e-6
    assert len(ref) > plan.n + 500  # half speed for most of it
    assert np.all(np.abs(log.channels["ref_acc"]) <= config.limits.acceleration * (1 + 1e-9))


def test_a_released_jog_stops_within_v2_over_2a_plus_one_cycle(tmp_path):
    settings = ServeSettings()
    srv = served(tmp_path, "jog", settings)
    m = srv.machine
    v = settings.jog_speed * m.vmax[0]
    a = settings.jog_accel * m.amax[0]
    s = Script()
    s.at = {1: [{"cmd": "enable"}], 2: [{"cmd": "home"}], 3: [{"cmd": "jog", "velocity": [v * 2, 0.0, 0.0]}]}
    rel = {}

    def hook(m):
        s(m)
        if "k" not in rel and abs(m.source.vel[0] - v) < 1e-12 and m.cycles > 3:
            rel["k"], rel["pos"] = m.cycles, m.source.pos[0]
            s.replies.append((m.cycles, {"cmd": "release"}, m.submit({"cmd": "release"})))
        if "k" in rel and m.state is State.STANDSTILL:
            m.shutdown("done")
    try:
        m.run(max_cycles=20000, on_cycle=hook)
    finally:
        srv.close()
    s.check_ok()
    travel = m.source.pos[0] - rel["pos"]
    dt = m.period
    assert 0 < travel <= v * v / (2 * a) + v * dt + 1e-12, (travel, v * v / (2 * a))
    assert travel >= v * v / (2 * a) - v * dt  # it did brake at a, not harder


@pytest.mark.parametrize("sign", [1, -1])
def test_a_jog_never_crosses_the_soft_limits(tmp_path, sign):
    settings = ServeSettings()
    srv = served(tmp_path, f"lim{sign}", settings)
    m = srv.machine
    m.guard = None  # the soft limits alone: the Delta's ball joints stop theta2's upper jog first (test_passive_serve)
    lo, hi = soft_limits(m.config, settings)
    s = Script()
    s.at = {1: [{"cmd": "enable"}], 2: [{"cmd": "home"}],
            3: [{"cmd": "jog", "velocity": [0.0, sign * m.vmax[1], 0.0]}]}

    def hook(m):
        s(m)
        src = m.source
        if m.cycles > 5 and getattr(src, "at_limit", False) and not np.any(src.vel):
            m.submit({"cmd": "release"})
        if m.cycles > 5 and m.state is State.STANDSTILL:
            m.shutdown("done")
    try:
        summary = m.run(max_cycles=20000, on_cycle=hook)
    finally:
        srv.close()
    assert summary["fault"] is None
    log = read_log(str(tmp_path / f"lim{sign}.pktlog"))
    ref, pos = log.channels["ref_pos"][:, 1], log.channels["pos"][:, 1]
    assert ref.max() <= hi[1] and ref.min() >= lo[1]
    edge = hi[1] if sign > 0 else lo[1]
    assert abs((ref.max() if sign > 0 else ref.min()) - edge) < 1e-3  # it went all the way
    rng = m.config.limits.position[1]
    assert rng[0] < pos.min() and pos.max() < rng[1]  # the machine stays inside its ranges


def test_live_targets_are_followed_and_a_stale_stream_ends_in_a_controlled_stop(tmp_path):
    srv = served(tmp_path, "live")
    m = srv.machine
    s = Script()
    s.at = {1: [{"cmd": "enable"}], 2: [{"cmd": "home"}]}
    rng = np.random.default_rng(1)
    lo, hi = soft_limits(m.config, m.settings)
    sent = []

    def hook(m):
        s(m)
        k = m.cycles
        if 3 <= k < 3000 and k % 10 == 3:  # a target every 10 ms for 3 s, then nothing
            t = np.clip(0.3 * np.sin(np.array([1.0, 1.3, 1.7]) * k * 1e-3) + rng.normal(0, 0.002, 3), lo, hi)
            sent.append(t)
            s.replies.append((k, {}, m.submit({"cmd": "stream", "target": t.tolist()})))
        if k > 3100 and m.state is State.STANDSTILL:
            m.shutdown("done")
    try:
        summary = m.run(max_cycles=20000, on_cycle=hook)
    finally:
        srv.close()
    s.check_ok()
    assert summary["fault"] is None
    log = read_log(str(tmp_path / "live.pktlog"))
    ref, vel, acc = (log.channels[c] for c in ("ref_pos", "ref_vel", "ref_acc"))
    assert np.all(ref >= lo) and np.all(ref <= hi)
    st = m.settings
    assert np.all(np.abs(vel) <= st.jog_speed * m.vmax * (1 + 1e-6))
    assert np.all(np.abs(acc) <= st.jog_accel * m.amax * (1 + 1e-6))
    assert np.abs(ref[2990] - sent[-1]).max() < 0.02  # it followed
    msgs = [e["message"] for e in log.events if e["kind"] == "state"]
    assert any("stream stale" in x for x in msgs), msgs
    assert np.all(np.abs(vel[-50:]) < 1e-9) and not np.any(vel[-1])  # at rest
