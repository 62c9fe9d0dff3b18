"""Benchmark: per-cycle cost of the CiA 402 driver path for 3 drives on python-can's virtual bus.

Figures (microseconds, p50 / p99 / max), nothing asserted:
  driver_path    the driver's own work in one cycle: send SYNC, receive and decode the 6 TPDOs
                 (already queued by a peer, so no waiting), scale to SI, encode and send the 3
                 RPDOs. On SocketCAN each send/recv is a system call instead of a Python queue
                 hand-over, which is the bulk of this figure on ``virtual``.
  encode_decode  the same without the bus: struct pack/unpack and scaling only.
  round_trip     read() + write() against the live drive emulator (a thread in this process):
                 SYNC out, the emulator steps the plant and answers, TPDOs in, RPDOs out.
  emulator       the emulator's response to one SYNC (plant step + 6 TPDOs), for reference.
  driver_path_unix_pair, driver_path_udp_pair, driver_path_udp_multicast   driver_path over
                 unix_pair (``pkrt hil``'s bus: a Unix datagram per frame), udp_pair (UDP
                 multicast, one group per end) and udp_multicast (every frame looped back to
                 its sender too): on the UDP ones each frame is a msgpack'd datagram.
  emulator_per_sync  the emulator's answer to one SYNC in this process, per interface, beside
                 python-can sending the same 6 frames alone: ``ours_us`` is the difference.
  hil_1khz       one 5 s ``pkrt hil --bus can`` run at 1 kHz (``hil_1khz_udp_pair``: the same
                 over udp_pair, right after): compute split into drivers,
                 controller and loop overhead, the controller process' cycle without the
                 drivers, wake latency, overruns, late frames, the emulator process' figures.

Run: ``.venv/bin/python -m pkrt.rt.bench.bench_can [--cycles N]``; ``pkrt bench --only can``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import time

import can
import numpy as np

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers.base import DriveError, DriveState
from pkrt.drivers.cia402 import CiA402Drives
from pkrt.hil.can_hil import INTERFACES, run_can_hil, udp_channel
from pkrt.hil.cia402_emulator import CiA402Emulator
from pkrt.rt.app.reference import plan_reference
from pkrt.rt.runtime.machine.config import load_machine


def _stats(x_s: np.ndarray) -> dict:
    us = np.asarray(x_s) * 1e6
    return {"p50": round(float(np.percentile(us, 50)), 1), "p99": round(float(np.percentile(us, 99)), 1),
            "max": round(float(us.max()), 1)}


def run_can_bench(cycles: int = 2000, rate_hz: float = 100.0) -> dict:
    """The figures above over ``cycles`` cycles (round trip paced at ``rate_hz``)."""
    config = dataclasses.replace(load_machine("orthoglide-can"), rate_hz=rate_hz)
    ch = f"bench-can-{time.monotonic_ns()}"
    drives = CiA402Drives.from_config(config, {"interface": "virtual", "channel": ch,
                                               "tpdo_timeout": 0.5 / rate_hz, "max_missed_cycles": 2})
    em = CiA402Emulator.from_config(config, ch)
    theta0 = np.array([-0.1, -0.1, -0.1])
    em.plant.reset(theta0)
    tau = np.array([-30.0, -30.0, 60.0])
    out: dict = {"drives": drives.n_axes, "interface": "virtual", "cycles": cycles}
    em.start()
    try:
        drives.configure()
        drives.enable()
        # round trip against the emulator, paced (the emulator's SYNC watchdog needs SYNCs)
        n_rt = min(cycles, int(3.0 * rate_hz))
        rt = np.zeros(n_rt)
        t0 = time.perf_counter()
        k = 0
        try:
            for k in range(n_rt):
                a = time.perf_counter()
                fb = drives.read(k / rate_hz)
                drives.write(3000.0 * (theta0 - fb.position) - 150.0 * fb.velocity + tau)
                rt[k] = time.perf_counter() - a
                rest = t0 + (k + 1) / rate_hz - time.perf_counter()
                if rest > 0:
                    time.sleep(rest)
            k = n_rt
        except DriveError as e:  # a stall of this loaded machine: the figures of the cycles before it
            out["round_trip_fault"] = str(e)
        out["round_trip_us"] = _stats(rt[:k]) if k else None
        out["late_frames"] = drives.late_frames
        em_rep = em.report()
        out["emulator_us"] = em_rep["emulator_response_us"]
    finally:
        em.stop()  # from here a scripted peer stands in for the drives (no waiting)
    drives.close()
    tp1, tp2 = _tpdos(drives)
    # the same over udp_multicast (what `pkrt hil --bus can` uses): python-can packs every frame
    # with msgpack into one datagram, and the host loops each one back to its sender too
    for interface in INTERFACES:
        (group, opt), peer = _channel(interface, f"{ch}-path")
        d2 = CiA402Drives.from_config(config, {"interface": interface, "channel": group, "bus_options": opt,
                                               "tpdo_timeout": 0.5 / rate_hz, "max_missed_cycles": 2})
        d2._bus = can.Bus(interface=interface, channel=group, **opt)  # enabled drives, no configuration
        d2._cyclic = d2._started = True
        d2.state = DriveState.ENABLED
        try:
            key = "driver_path_us" if interface == "virtual" else f"driver_path_{interface}_us"
            out[key] = _driver_path(d2, interface, *peer, tp1, tp2, tau, cycles)
        finally:
            d2._bus.shutdown()
    out["emulator_per_sync"] = {i: _emulator_per_sync(config, i, min(cycles, 2000)) for i in INTERFACES}
    # encode/decode alone (no bus): what the cyclic path costs beyond python-can
    data1 = [m.data for m in tp1]
    data2 = [m.data for m in tp2]
    buf = bytearray(4)
    pos = np.zeros(3)
    vel = np.zeros(3)
    enc = np.zeros(cycles)
    inc = drives._si_per_increment
    perm = drives._permille_per_si
    for k in range(cycles):
        a = time.perf_counter()
        for i in range(3):
            sw, x = p.TPDO1.unpack_from(data1[i])
            v, = p.TPDO2.unpack_from(data2[i])
            p.decode_statusword(sw)
            pos[i] = x * inc[i]
            vel[i] = v * inc[i]
        for i in range(3):
            p.RPDO1.pack_into(buf, 0, p.CW_ENABLE_OPERATION, int(round(tau[i] * perm[i])))
        enc[k] = time.perf_counter() - a
    out["encode_decode_us"] = _stats(enc)
    out["bus_load_1mbit_1khz"] = round((47 + 3 * (79 + 95 + 79)) * 1000 / 1e6, 3)
    out["hil_1khz"] = run_hil_1khz("can")  # unix_pair, pkrt hil's default
    out["hil_1khz_udp_pair"] = run_hil_1khz("can", interface="udp_pair")
    return out


def _channel(interface: str, name: str) -> tuple[tuple[str, dict], tuple[str, dict]]:
    """(channel, bus options) of the driver's end and of the peer's (the drives): one multicast
    group and free port for both (udp_multicast), one each (udp_pair), a socket each (unix_pair),
    or ``name``."""
    if interface == "udp_multicast":
        group, port = udp_channel()
        return ((group, {"port": port}),) * 2
    if interface == "unix_pair":
        a, b = f"@{name}-{os.getpid()}-drv", f"@{name}-{os.getpid()}-drives"
        return (a, {"peer": b}), (b, {"peer": a})
    if interface == "udp_pair":
        (g1, p1), (g2, p2) = udp_channel(), udp_channel()
        return (g1, {"port": p1, "peer": f"{g2}:{p2}"}), (g2, {"port": p2, "peer": f"{g1}:{p1}"})
    return ((name, {}),) * 2


def _tpdos(drives) -> tuple[list, list]:
    """The 6 TPDOs a scripted peer answers every SYNC with (3 drives, Operation enabled)."""
    tp1 = [can.Message(arbitration_id=p.TPDO_BASE[0] + n, data=p.TPDO1.pack(0x0037, -100000 + n),
                       is_extended_id=False) for n in drives.node_ids]
    tp2 = [can.Message(arbitration_id=p.TPDO_BASE[1] + n, data=p.TPDO2.pack(1000 * n), is_extended_id=False)
           for n in drives.node_ids]
    return tp1, tp2


def _driver_path(drives, interface: str, channel: str, options: dict, tp1, tp2, tau, cycles: int) -> dict:
    """The driver's own work in one cycle, the TPDOs already queued by a scripted peer on
    ``channel`` (no waiting): drain, SYNC out, 6 TPDOs in and decoded, scaled to SI, 3 RPDOs
    encoded and out."""
    peer = can.Bus(interface=interface, channel=channel, **options)
    path = np.zeros(cycles)
    try:
        for k in range(cycles):
            while drives._bus.recv(0.0) is not None:  # udp: the host looped the last cycle's frames back
                pass
            for m1, m2 in zip(tp1, tp2):
                peer.send(m1)
                peer.send(m2)
            if interface != "virtual":  # the datagrams in this end's socket before the clock starts
                select.select([drives._bus.fileno()], [], [], 0.01)
                time.sleep(0.0005)
            a = time.perf_counter()
            drives.sync()
            drives.collect(a + 0.01)
            fb = drives.publish(k * 0.001)
            drives.write(tau)
            path[k] = time.perf_counter() - a
            while peer.recv(0.0) is not None:  # SYNC and RPDOs the driver sent (and, udp, its own)
                pass
        assert fb.fresh and np.allclose(fb.position, [-0.099999, -0.099998, -0.099997])
    finally:
        peer.shutdown()
    return _stats(path)


def _emulator_per_sync(config, interface: str, cycles: int) -> dict:
    """The emulator's answer to one SYNC in this process, nobody waiting on it: plant step, 6
    TPDOs packed and sent (``per_sync_us``), beside python-can sending 6 frames alone on the same
    bus (``bus_send_6_us``): the difference (``ours_us``, medians) is the emulator's own work."""
    (ch, opt), (em_ch, em_opt) = _channel(interface, f"bench-em-{time.monotonic_ns()}")
    drives = CiA402Drives.from_config(config, {"interface": interface, "channel": ch, "bus_options": opt,
                                               "tpdo_timeout": 0.5 / config.rate_hz, "max_missed_cycles": 2})
    em = CiA402Emulator.from_config(config, em_ch, interface, bus_options=em_opt)
    em.plant.reset(np.array([-0.1, -0.1, -0.1]))
    em.start()
    try:
        drives.configure()
        drives.enable()
        em._running = False  # from here this thread drives the emulator, SYNC by SYNC
        em._thread.join()
        sync_t, send_t = np.zeros(cycles), np.zeros(cycles)
        frames = [can.Message(arbitration_id=0x181 + i, data=bytes(6), is_extended_id=False) for i in range(6)]
        for k in range(cycles):
            a = time.perf_counter()
            em._on_sync(a, time.time())
            b = time.perf_counter()
            for m in frames:
                em.bus.send(m)
            send_t[k] = time.perf_counter() - b
            sync_t[k] = b - a
            while drives._bus.recv(0.0) is not None:
                pass
            while em.bus.recv(0.0) is not None:
                pass
    finally:
        drives.close()
        em.stop()
    a, b = _stats(sync_t), _stats(send_t)
    return {"per_sync_us": a, "bus_send_6_us": b, "ours_us": round(a["p50"] - b["p50"], 1)}


def run_hil_1khz(bus: str, duration: float = 5.0, interface: str = "unix_pair") -> dict:
    """One ``pkrt hil`` run at the machine's rate (1 kHz): the figures a HIL run reports.
    ``cycle_without_drives_us`` is the controller process' own work per cycle with no plant in
    it (controller + loop overhead, the drivers' time taken out)."""
    if bus == "can":
        r = run_can_hil("orthoglide-can", duration=duration, reference=plan_reference, interface=interface)
        d, e = r["driver"], r["emulator"]
        extra = {"late_frames": d["late_frames"], "heartbeat_thread": d.get("heartbeat_thread"),
                 "emulator_response_us": e["response_us"], "emulator_cpu_us_per_cycle": e["cpu_us_per_cycle"],
                 "sync_wait_us_max": e.get("sync_wait_us_max"), "emulator_scheduling": e["scheduling"]}
    else:
        from pkrt.hil.serial_hil import run_serial_hil

        r = run_serial_hil("orthoglide-serial", duration=duration, reference=plan_reference)
        extra = {"late_answers": r["driver"]["late_answers"], "timeouts": r["driver"]["timeouts"],
                 "skipped_periods": r["emulator"].get("skipped_periods"),
                 "emulator_scheduling": r["emulator"].get("scheduling")}
    return {"rate_hz": r["rate_hz"], "cycles": r["cycles"], "overruns": r["overruns"], "fault": r["fault"],
            "rms_error_um": None if r["rms_error"] is None else round(r["rms_error"] * 1e6, 2),
            **{key: {k: round(v, 1) for k, v in r[key].items()}
               for key in ("compute_us", "drive_us", "controller_us", "loop_overhead_us", "cycle_without_drives_us")},
            "wake_latency_us": {k: round(v, 2) for k, v in r["wake_latency_us"].items()},
            "realtime": r["realtime"], **extra, "load_avg": os.getloadavg()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000)
    args = ap.parse_args()
    print(json.dumps(run_can_bench(args.cycles), indent=1))


def run_can_udp_bench(cycles: int = 3000, rate_hz: float = 1000.0, priorities: tuple = (0, 80)) -> dict:
    """Round trip over python-can's udp_multicast with the emulator in a process of its own:
    SYNC out -> the emulator steps the plant and sends 6 TPDOs -> all 6 in (``sync_to_tpdos``),
    then 3 RPDOs out (``round_trip`` = both), paced at ``rate_hz``, once per entry of
    ``priorities``: 0 unprioritised, P > 0 this process at SCHED_FIFO P and the emulator at P - 10
    (reported applied or not). Windows where a TPDO missed ``0.9 / rate_hz`` are counted, not
    timed. The emulator's SYNC watchdog is off here so a stall does not end the measurement."""
    import os
    import tempfile

    from pkrt.hil.can_hil import CanEmulatorProcess, udp_channel

    from pkrt.rt.bench.bench_safestop import THETA0, machine_copy

    out: dict = {"interface": "udp_multicast", "rate_hz": rate_hz, "cycles": cycles}
    theta0 = np.array(THETA0)
    tau = np.array([-30.0, -30.0, 60.0])
    with tempfile.TemporaryDirectory() as d:
        for prio in priorities:
            group, port = udp_channel()
            path = machine_copy(d, "orthoglide-can", {"drives": {"sync_loss_cycles": "0"}})
            config = dataclasses.replace(load_machine(path), rate_hz=rate_hz)
            drives = CiA402Drives.from_config(config, {"interface": "udp_multicast", "channel": group,
                                                       "bus_options": {"port": port},
                                                       "tpdo_timeout": 0.9 / rate_hz, "max_missed_cycles": 2})
            emu = CanEmulatorProcess(path, rate_hz, "udp_multicast", group, {"port": port}, None, theta0,
                                     max(prio - 10, 0))
            sched = "not requested"
            if prio:
                try:
                    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
                    sched = f"SCHED_FIFO {prio} applied"
                except (OSError, AttributeError) as e:
                    sched = f"SCHED_FIFO {prio} not applied: {e}"
            s2t, rt, missed, fault = [], [], 0, None
            try:
                drives.configure()
                drives.enable()
                t0 = time.perf_counter()
                for k in range(cycles):
                    a = time.perf_counter()
                    drives.drain()
                    drives.sync()
                    drives.collect(a + 0.9 / rate_hz)
                    b = time.perf_counter()
                    fb = drives.feedback
                    drives.write(3000.0 * (theta0 - fb.position) - 150.0 * fb.velocity + tau)
                    if drives._need:
                        missed += 1
                    else:
                        s2t.append(b - a)
                        rt.append(time.perf_counter() - a)
                        drives.publish(k / rate_hz)
                    rest = t0 + (k + 1) / rate_hz - time.perf_counter()
                    if rest > 0:
                        time.sleep(rest)
            except DriveError as e:  # e.g. a stall past the heartbeat consumer time: the drives stopped
                fault = str(e)
            finally:
                if prio:
                    try:
                        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                    except OSError:
                        pass
                drives.close()
                rep = emu.stop()
            key = "unprioritised" if not prio else f"sched_fifo_{prio}"
            out[key] = {"master": sched, "emulator": rep.get("scheduling"),
                        "sync_to_tpdos_us": _stats(np.array(s2t)) if s2t else None,
                        "round_trip_us": _stats(np.array(rt)) if rt else None, "missed_windows": missed,
                        "timed_windows": len(rt), "fault": fault,
                        "emulator_us": rep.get("emulator_response_us")}
    a, b = out.get("unprioritised"), out.get(f"sched_fifo_{priorities[-1]}")
    if a and b and a["round_trip_us"] and b["round_trip_us"]:
        out["p99_ratio_fifo_over_unprioritised"] = round(b["round_trip_us"]["p99"] / a["round_trip_us"]["p99"], 2)
    return out
