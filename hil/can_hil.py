"""CAN hardware-in-the-loop: the Orthoglide demo in real time through the real CiA 402 driver
and the CiA 402 drive emulator driving the simulated plant, either in a process of its own over
python-can's ``udp_multicast`` interface (``interface="udp_multicast"``, what ``pkrt hil --bus
can`` does: the drives are another device, as on a real bus) or as a thread of this process on
python-can's in-process ``virtual`` bus (unit tests).

udp_multicast carries each frame as one UDP datagram (msgpack) to a multicast group and port;
every bus bound to that port on the host hears it, the sender too (the host loops multicast back
to every member: both ends skip their own COB-IDs, as a CAN controller without loopback would
never see them). Each run takes a group and a free port of its own, so concurrent runs (tests)
do not hear each other. No arbitration or bus timing is emulated: frames arrive in sending
order, one datagram each.

Timing (``timing``, ``pkrt hil --timing``, hil/timing.py): ``stepped`` (the default) is for
any host, virtual machines included, whose CPUs the host stops for milliseconds now and then:
the emulator's plant advances exactly one period per SYNC, the loop re-anchors its schedule
after a late cycle instead of skipping periods, and the driver waits for the cycle's TPDOs
``STEPPED_WINDOW`` s of its own time: a host pause delays the run but neither breaks it nor
changes its result. There ``torque_off_cycle`` is the loop cycle running when the emulator
took the torque off (``time.monotonic()``, one clock for both processes). ``wallclock`` is for
real-time hosts: periods skipped after an overrun, the plant advanced by the SYNCs' bus
timestamps, the configuration's strict TPDO window.

At 1 kHz (the default): the controller runs at its ``[realtime]`` priority and CPU, the emulator
process at ``[emulator] priority`` (below it) pinned to another CPU (``emulator_cpu``), both with
memory locked; the driver polls the TPDO window instead of sleeping in it (see CiA402Drives).

Cycle numbers in the result are loop cycles (``run_session``'s k). The emulator counts SYNCs;
every SYNC is mapped back to the loop cycle that sent it (the loop skips cycles after an
overrun, so the two counts can differ). ``torque_off_cycle`` is measured in the emulator: the
cycle from which no drive applied torque (the loop's own estimate is ``host_torque_off_cycle``);
the result is a ``HilResult`` (hil/result.py), the same keys as the serial HIL's.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import socket
import sys
import time

import numpy as np

from pkrt.drivers.cia402 import CiA402Drives
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.core.errors import Fault, UserError
from pkrt.rt.runtime.machine.runsetup import load_controller_tree, plan_trajectory
from pkrt.rt.runtime.machine.run import run_session

from .cia402_faults import FAULT_KINDS  # the CiA 402 emulator's fault kinds
from .process import EmulatorProcess
from .result import HilResult, cycles_run_between, hil_result
from .timing import PACING, STEPPED_SETTLE, STEPPED_WINDOW, TIMINGS

INTERFACES = ("unix_pair", "udp_pair", "udp_multicast", "virtual")
_channels = itertools.count()


def udp_channel() -> tuple[str, int]:
    """A multicast group and a free UDP port for one run: a udp_multicast bus hears every
    datagram sent to its port on the host, so concurrent runs need ports of their own."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    pid = os.getpid()
    return f"239.{pid >> 8 & 0xFF}.{pid & 0xFF}.{next(_channels) % 254 + 1}", port


class CanEmulatorProcess(EmulatorProcess):
    """``python -m pkrt.hil.cia402_emulator`` on a bus that crosses processes."""

    def __init__(self, machine_path: str, rate_hz: float, interface: str, channel: str, bus_options: dict,
                 fault: str | None = None, theta0=None, priority: int = 0, cpu: int = -1,
                 timing: str = "wallclock", contact: dict | None = None):
        cmd = [sys.executable, "-m", "pkrt.hil.cia402_emulator", "--machine", machine_path, "--rate",
               repr(float(rate_hz)), "--interface", interface, "--channel", channel,
               "--bus-options", json.dumps(bus_options), "--priority", str(int(priority)), "--cpu", str(int(cpu)),
               "--timing", timing]
        if fault is not None:
            cmd += ["--fault", fault]
        if theta0 is not None:
            cmd.append("--theta0=" + ",".join(repr(float(x)) for x in theta0))
        if contact is not None:
            cmd += ["--contact", json.dumps(contact)]
        super().__init__(cmd, "CiA 402 emulator")


def settle(emulator) -> None:
    """After a fault in stepped timing: wait (``STEPPED_SETTLE`` s at most) until no emulated
    drive is in Operation enabled: the drives of a severed bus take their torque off by their
    own watchdog, a second later (hil/timing.py)."""
    deadline = time.monotonic() + STEPPED_SETTLE
    while time.monotonic() < deadline:
        try:
            states = emulator.report().get("drive_states") or []
        except Fault:  # the emulator process ended: its final report says
            return
        if "OPERATION_ENABLED" not in states:
            return
        time.sleep(0.02)


def cycle_at(ran: list[int], began: list[float], t: float, ended: float) -> int | None:
    """The loop cycle running at time.monotonic() ``t`` (``ran`` cycles, ``began`` their
    starts, the loop ``ended``): the last one begun by then; the one after the last when the
    loop had ended."""
    import bisect

    if not ran:
        return None
    if t > ended:
        return ran[-1] + 1
    i = bisect.bisect_right(began, t)
    return ran[max(i - 1, 0)]


def check_timing(timing: str) -> None:
    if timing not in TIMINGS:
        raise UserError(f"HIL timing {timing!r}: expected one of {', '.join(TIMINGS)}")


def emulator_cpu(controller_cpu: int) -> int:
    """The CPU for an emulator process: another one than the controller's when the controller
    is pinned (the drives are another device: they must not take the controller's core), else
    -1 (not pinned)."""
    if controller_cpu < 0:
        return -1
    others = sorted(set(range(os.cpu_count() or 1)) - {controller_cpu})  # not this process' (maybe pinned) set
    return others[0] if others else -1


def reference_for(config, reference):
    """The run's reference from ``reference(config)``: the caller's planner (the CLI layer's
    ``pkrt.rt.app.reference.plan_reference``, the demo planned from the model), None: none (the
    runtime then says a reference is needed)."""
    return None if reference is None else reference(config)


def run_can_hil(machine: str = "orthoglide-can", fault: str | None = None, duration: float = 5.0,
                rate_hz: float | None = None, log_path: str | None = None, channel: str | None = None,
                interface: str = "unix_pair", reference=None, timing: str = "stepped",
                contact: dict | None = None, tool_force=None) -> HilResult:
    """Run the demo for ``duration`` s (real time) with an optional injected ``fault`` (one of
    ``FAULT_KINDS``) at ``rate_hz`` (default: ``[emulator] rate_hz``, else the machine's rate,
    with the ``[emulator] tpdo_timeout`` window); return a ``HilResult`` (hil/result.py: the
    run's summary, the injection and torque-off cycles, the driver's figures (bus load, late
    TPDOs, SYNCs) and the emulator's (response time, frames, drive states)).
    ``interface``: ``unix_pair`` (emulator process; one Unix datagram socket per end:
    ``hil/unix_pair.py``), ``udp_pair`` (emulator process; one multicast group per direction, so
    no end hears its own frames: ``hil/udp_pair.py``), ``udp_multicast`` (emulator process; one
    group, every frame looped back to both ends) or ``virtual`` (emulator thread: one process,
    one GIL; unit tests at a lower rate, it does not hold 1 kHz). ``reference``:
    see ``reference_for``. ``timing``: ``TIMINGS`` (module docstring). ``contact``: an external
    force at the emulated plant's tool (``pkrt.drivers.contact.Contact.data``); the emulator's
    report of it in ``emulator["contact"]``; ``tool_force``: ``run_session``'s."""
    config, table, window = _hil_config(machine, fault, rate_hz, timing, interface)
    channel, options, emulator_channel, emulator_options = bus_channels(interface, channel)
    tree = load_controller_tree(config)
    plan = plan_trajectory(config, tree, reference_for(config, reference), duration)
    drives = _drives(config, table, window, timing, {"interface": interface, "channel": channel,
                                                     "bus_options": options})
    if interface == "virtual":
        from .cia402_emulator import CiA402Emulator

        emulator = CiA402Emulator.from_config(config, channel, fault=fault, timing=timing)
        emulator.plant.reset(plan.pos[0])  # the machine stands at the trajectory's start, at rest
        if contact is not None:
            from pkrt.drivers.contact import Contact

            emulator.contact = Contact.from_data(contact, tree.s)
        emulator.start()
    else:
        emulator = CanEmulatorProcess(os.path.abspath(config.path), config.rate_hz, interface,
                                      emulator_channel or channel, emulator_options or options,
                                      fault, plan.pos[0], table.priority, emulator_cpu(config.realtime.cpu), timing,
                                      contact)
    syncs = SyncCycles(drives, plan.n)
    try:
        summary = run_session(config, drives, trajectory=plan, tree=tree, on_cycle=syncs.on_cycle,
                              log_path=log_path, pacing=PACING[timing], tool_force=tool_force)
        ended = time.monotonic()
    finally:
        drives.close()
        time.sleep(0.02)  # let the emulator take the last frames
        if timing == "stepped" and drives.fault_reason is not None:
            settle(emulator)
        em = emulator.stop()
    if interface == "virtual":
        em = emulator.report()
    elif not em:
        raise Fault(f"CiA 402 emulator process ended without its report (exit code {emulator.proc.returncode})")
    ev = em["torque_off_event"]  # (SYNC index, periods after it: a drive's own watchdog)
    base = syncs.loop_cycle(ev[0]) if ev is not None else None
    off = None if base is None else base + ev[1]
    if timing == "stepped" and ev is not None and em.get("torque_off_at") is not None:
        off = cycle_at(syncs.ran, syncs.began, em["torque_off_at"], ended)
    injected = syncs.loop_cycle(em["injected_cycle"])
    return hil_result(
        summary, bus="can", interface=interface, timing=timing, injected_fault=fault, injected_cycle=injected,
        detection_cycles=cycles_run_between(syncs.ran, injected, summary.get("fault_cycle")), torque_off_cycle=off,
        emulator_process=interface != "virtual", emulator_error=em.get("emulator_error"),
        driver=_driver_figures(drives, channel, options), emulator=_emulator_figures(em))


def _hil_config(machine: str, fault: str | None, rate_hz: float | None, timing: str, interface: str):
    """The machine configuration at the HIL rate, its ``[emulator]`` table and the driver's
    TPDO window (s); every bad choice is one line."""
    if fault is not None and fault not in FAULT_KINDS:
        raise UserError(f"unknown CAN fault '{fault}' (known: {', '.join(FAULT_KINDS)})")
    check_timing(timing)
    if interface not in INTERFACES:
        raise UserError(f"CAN HIL interface {interface!r}: expected one of {', '.join(INTERFACES)}")
    config = load_machine(machine)
    if config.backend != "cia402":
        raise UserError(f"{config.path}: [drives] backend is {config.backend!r}, not 'cia402'")
    table = config.emulator  # validated by the schema (the CiA 402 driver's EMULATOR_TABLE)
    rate = rate_hz if rate_hz is not None else (table.rate_hz or config.rate_hz)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 1.0 <= rate <= 100000.0:
        raise UserError(f"HIL rate {rate!r} Hz: expected a number in [1, 100000]")
    config = dataclasses.replace(config, rate_hz=float(rate))
    window = (min(table.tpdo_timeout, 0.75 / config.rate_hz) if table.tpdo_timeout is not None else
              config.drives.tpdo_timeout or 0.5 / config.rate_hz)  # s, the driver's TPDO window
    if fault == "delay" and timing == "wallclock" and table.delay_cycles / config.rate_hz <= window:
        raise UserError(f"{config.path}: [emulator] delay_cycles = {table.delay_cycles} periods does not hold the "
                        f"TPDOs back past the driver's window: the delay fault would go unseen")
    return config, table, window


def bus_channels(interface: str, channel: str | None) -> tuple[str, dict, str | None, dict | None]:
    """(the driver's channel, its bus options, the emulator's channel, its bus options) of a
    run on ``interface`` (the emulator's are None where both ends share one)."""
    options = emulator_channel = emulator_options = None
    if interface == "udp_multicast":
        channel, port = udp_channel() if channel is None else (channel, udp_channel()[1])
        options = {"port": port}
    elif interface == "unix_pair":  # a socket each, in the abstract namespace
        channel = f"@pkrt-hil-{os.getpid()}-{next(_channels)}"
        emulator_channel = channel + "-drives"
        options, emulator_options = {"peer": emulator_channel}, {"peer": channel}
    elif interface == "udp_pair":  # the driver listens on one group, the emulator on another
        (channel, port), (emulator_channel, emulator_port) = udp_channel(), udp_channel()
        options = {"port": port, "peer": f"{emulator_channel}:{emulator_port}"}
        emulator_options = {"port": emulator_port, "peer": f"{channel}:{port}"}
    return channel or f"pkrt-hil-{os.getpid()}-{next(_channels)}", options or {}, emulator_channel, emulator_options


def _drives(config, table, window: float, timing: str, overrides: dict) -> CiA402Drives:
    """The CiA 402 driver with the HIL's window and missed-cycle tolerance; in stepped timing it
    waits for the cycle's complete answer in its own time."""
    if table.tpdo_timeout is not None:
        overrides["tpdo_timeout"] = window
    if table.max_missed_cycles is not None:
        overrides["max_missed_cycles"] = table.max_missed_cycles
    drives = CiA402Drives.from_config(config, overrides)
    if timing == "stepped":
        drives.exclude_held, drives.tpdo_timeout = True, STEPPED_WINDOW
    return drives


class SyncCycles:
    """Which loop cycle sent the k-th SYNC (the loop skips cycles after an overrun, so the two
    counts can differ), and the loop cycles run with their start (time.monotonic())."""

    def __init__(self, drives: CiA402Drives, n: int):
        self.drives = drives
        self.sync_cycle = np.full(n + 2, -1, dtype=np.int64)
        self.ran: list[int] = []
        self.began: list[float] = []

    def on_cycle(self, k: int, t: float) -> None:
        self.ran.append(k)
        self.began.append(time.monotonic())
        j = self.drives.cycle + 1  # index of the SYNC this cycle's read will send
        if j < self.sync_cycle.shape[0]:
            self.sync_cycle[j] = k

    def loop_cycle(self, sync_index: int | None) -> int | None:
        if sync_index is None:
            return None
        if 0 <= sync_index <= min(self.drives.cycle, self.sync_cycle.shape[0] - 1):
            return int(self.sync_cycle[sync_index])
        return None


def _driver_figures(drives: CiA402Drives, channel: str, options: dict) -> dict:
    return {"channel": channel, "bus_options": options, "bus_load": drives.bus_load,
            "drive_watchdog": drives.watchdog_text(), "heartbeat_thread": drives.heartbeat_scheduling,
            "late_frames": drives.late_frames, "exclude_held": drives.exclude_held,
            "held_windows": drives.held_windows, "held_us_max": round(drives.held_max * 1e6, 1),
            "events": [list(e) for e in drives.events], "syncs": drives.cycle + 1}


def _emulator_figures(em: dict) -> dict:
    return {"cycles": em["emulator_cycles"], "frames_rx": em["frames_rx"], "frames_tx": em["frames_tx"],
            "response_us": em["emulator_response_us"], "heartbeat_events": em.get("heartbeat_events"),
            "cpu_us_per_cycle": em.get("emulator_cpu_us_per_cycle"),
            "sync_wait_us_max": em.get("sync_wait_us_max"), "stalls": em.get("stalls"),
            "stall_us_max": em.get("stall_us_max"), "scheduling": em.get("scheduling"),
            "drive_states": em.get("drive_states"), "plant_error": em.get("plant_error"), "contact": em.get("contact")}
