"""A served Delta on its drive emulator in a process of its own (``Served(hil=bus)``, ``pkrt
serve --bus can|serial``: the real driver; CiA 402 over python-can on a Unix socket pair, or
Dynamixel over a serial link (pyserial's socket://); stepped timing), commanded through the
real control socket: feed hold from full speed on the Adept
cycle keeps the reference on the path (<= 1 um), the commanded torques within the machine's
limits, and after resume the run ends within 1 um of an uninterrupted one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pkrt.rt.app.client import MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.runtime.cycle.controller import FLAG_SATURATED
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.core.errors import Fault

from .realtime import judge

from .test_serve_motion import adept_of, path_distance

SETTLE = 300  # cycles at standstill after the run before the end position is taken
HELD = 200    # cycles in feed hold before resume
_n = itertools.count()


MACHINES = {"can": "delta-can", "serial": "delta-serial"}


@pytest.fixture(scope="module", params=list(MACHINES))
def adept_hil(request, tmp_path_factory):
    bus = request.param
    config, plan, kin, dense = adept_of(MACHINES[bus])
    csv = tmp_path_factory.mktemp("hil") / "adept.csv"
    t = np.arange(plan.n) / plan.rate_hz
    header = "t," + ",".join(config_axes(config))
    np.savetxt(csv, np.c_[t, plan.pos], delimiter=",", header=header, comments="", fmt="%.17g")
    return bus, config, plan, kin, dense, str(csv)


def config_axes(config) -> list[str]:
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree, tree_axes

    return tree_axes(load_controller_tree(config))[0]


def wait_cycles(c, n: int) -> dict:
    """Poll until the loop has run ``n`` more cycles (stepped: loop time, however slow the host)."""
    k0 = c.status()["cycle"]
    st = c.status()
    while st["cycle"] < k0 + n:
        st = c.status()
    return st


def serve_adept(tmp_path, bus: str, csv: str, peak_speed: float | None, probe) -> tuple:
    """``attempt`` judged by the host-pause probe (tests/realtime.py): a run that ended in
    error stop is repeated only when the probe saw the host pause then."""
    def find(r):
        _, summary, events = r
        return [(summary.get("fault_time") or 0.0, f"error stop: {summary['fault']}"), *events] \
            if summary.get("fault") else []
    log, summary, _ = judge(lambda: attempt(tmp_path, bus, csv, peak_speed), probe, find=find)
    return log, summary


def attempt(tmp_path, bus: str, csv: str, peak_speed: float | None) -> tuple:
    """Enable, home and run the Adept program through the socket; with ``peak_speed`` hold
    once the reference's speed reaches 90 % of it, resume after ``HELD`` cycles. Returns the
    log (None after an error stop), the run's summary and the driver's events."""
    name = f"hil{next(_n)}"
    log = str(tmp_path / f"{name}.pktlog")
    srv = Served(MACHINES[bus], socket_path=str(tmp_path / f"{name}.sock"), log_path=log, hil=bus)
    srv.start()
    stopped = False
    try:
        with MachineClient(srv.socket_path, timeout=600) as c:
            c.enable()
            c.home()
            c.wait_state("standstill", timeout=120)
            c.run(csv, speed=1.0)
            if peak_speed is not None:
                while True:
                    st = c.status()
                    if st["state"] == "error_stop":
                        raise Fault(f"machine in error stop: {st['fault']}")
                    assert st["state"] == "moving", st
                    if np.linalg.norm(st["reference_velocity"]) >= 0.9 * peak_speed:
                        break
                c.hold()
                c.wait_state("holding", timeout=120)
                wait_cycles(c, HELD)
                c.resume()
            c.wait_state("standstill", timeout=600)
            wait_cycles(c, SETTLE)
    except Fault as e:  # error stop: judged with the driver's events and the fault's time
        if "error stop" not in str(e):
            raise
        stopped = True
    finally:
        srv.close()
    summary = srv.summary
    assert summary is not None and (stopped or summary["fault"] is None), summary
    return (None if stopped else read_log(log)), summary, [tuple(e) for e in srv.drives.events]


def event_cycle(data, kind: str, starts: str) -> int:
    """The log row of the first event of ``kind`` whose message starts with ``starts``."""
    k = next(e["cycle"] for e in data.events if e["kind"] == kind and e["message"].startswith(starts))
    return int(np.searchsorted(data.channels["t"][:, 0] if data.channels["t"].ndim > 1 else data.channels["t"],
                               k / 1000.0 - 1e-9))


@pytest.mark.realtime
def test_feed_hold_on_the_emulators_through_the_socket(tmp_path, adept_hil, host_probe):
    bus, config, plan, kin, dense, csv = adept_hil
    peak = float(np.linalg.norm(plan.vel, axis=1).max())
    plain, _ = serve_adept(tmp_path, bus, csv, None, host_probe)
    held, summary = serve_adept(tmp_path, bus, csv, peak, host_probe)
    assert summary["pacing"] == "delay"
    states = [e["message"] for e in held.events if e["kind"] == "state"]
    if bus == "can":  # CiA 402 homing mode (method 35) through the socket: the homing state, then homed
        assert any(m.startswith("standstill -> homing") for m in states) and "homing -> standstill: homed" in states
    k0 = event_cycle(held, "command", '{"cmd": "hold"')
    k_hold = event_cycle(held, "state", "moving -> holding")
    k_resume = event_cycle(held, "state", "holding -> moving: resume")
    k_end = event_cycle(held, "state", "moving -> standstill")
    ref = held.channels["ref_pos"]
    speed = np.linalg.norm(held.channels["ref_vel"][k0], axis=-1)
    assert speed >= 0.85 * peak, (speed, peak)  # held from (nearly) full speed
    # from the hold to the program's end (ramp down, rest, ramp up, the rest): on the path
    dist = path_distance(kin.forward(ref[k0:k_end]), dense)
    assert dist.max() <= 1e-6, dist.max()
    assert np.ptp(ref[k_hold + 1:k_resume], axis=0).max() == 0.0  # at rest while held
    assert k_resume - k_hold >= 200
    tau = held.channels["tau"]
    assert np.abs(tau).max() <= config.controller.tau_max.max()
    assert not np.any(held.channels["flags"].astype(int) & FLAG_SATURATED)
    assert np.all(np.abs(held.channels["ref_acc"]) <= config.limits.acceleration * (1 + 1e-9))
    assert np.all(np.abs(held.channels["ref_vel"]) <= config.limits.velocity * (1 + 1e-9))
    # both runs end at the program's last point, and the machine settles at the same place
    assert np.abs(ref[k_end] - plan.pos[-1]).max() <= 1e-9
    end_plain = kin.forward(plain.channels["pos"][-1])[0]
    end_held = kin.forward(held.channels["pos"][-1])[0]
    assert np.linalg.norm(end_plain - end_held) <= 1e-6, np.linalg.norm(end_plain - end_held)
