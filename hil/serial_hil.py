"""Serial hardware-in-the-loop: the Orthoglide demo in real time through the Dynamixel driver,
a pseudo-terminal and the servo emulator running in another process.

Timing (``timing``, hil/timing.py): ``stepped`` (default) runs the emulator's plant clock
``step`` (one period per Goal Current write), the loop with pacing ``delay`` and the driver's
transaction timeout at ``STEPPED_WINDOW`` of its own time; ``wallclock`` runs the
``[emulator] clock`` (``cycle``: periods skipped after an overrun are added), pacing ``skip``
and strict timeouts.

Cycle numbering: the emulator counts Sync Writes of Goal Current (one per completed loop
cycle); the loop may skip cycles after an overrun, so its cycle indices are recorded here
(``on_cycle``) and the emulator's counts are mapped onto them. ``injected_cycle`` and
``torque_off_cycle`` are loop cycle indices, as ``fault_cycle`` is.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from pkrt.drivers import open_drives
from pkrt.drivers.dynamixel import load_settings
from pkrt.rt.runtime.machine.config import MachineConfig, load_machine
from pkrt.rt.core.errors import UserError

from .can_hil import check_timing, emulator_cpu, reference_for
from .timing import PACING, STEPPED_SYNC_SILENCE, STEPPED_WINDOW
from .dynamixel_faults import FAULT_KINDS  # the servo emulator's fault kinds
from .process import EmulatorProcess as _Process
from .result import HilResult, cycles_run_between, hil_result


# the serial line to the emulator: a TCP socket on 127.0.0.1 (the driver opens pyserial's
# socket://, as for a serial device server), the default, or a pseudo-terminal. A pty's data is
# moved by the kernel's normal-priority workers, whose wake-up reaches milliseconds on a busy
# or non-preemptible kernel, more than a 1 kHz cycle allows; TCP over loopback is delivered in
# the sender's own context (CHANGELOG.md, 2026-11-23).
LINKS = ("tcp", "pty")


class EmulatorProcess(_Process):
    """``python -m pkrt.hil.dynamixel_emulator`` as a child process; ``port`` is its pty's
    path, or with ``link = "tcp"`` its pyserial ``socket://127.0.0.1:PORT`` URL."""

    def __init__(self, machine_path: str, fault: str | None, inject_cycle: int | None, rate_hz: float,
                 cpu: int = -1, priority: int | None = None, link: str = "tcp", clock: str | None = None):
        if link not in LINKS:
            raise UserError(f"serial HIL link {link!r}: expected one of {', '.join(LINKS)}")
        cmd = [sys.executable, "-m", "pkrt.hil.dynamixel_emulator", "--machine", machine_path,
               "--rate", repr(float(rate_hz)), "--cpu", str(int(cpu))] + (["--tcp"] if link == "tcp" else [])
        if clock is not None:  # else the configuration's [emulator] clock
            cmd += ["--clock", clock]
        if priority is not None:  # else the configuration's [emulator] priority
            cmd += ["--priority", str(int(priority))]
        if fault is not None:
            cmd += ["--fault", fault]
        if inject_cycle is not None:
            cmd += ["--inject-cycle", str(int(inject_cycle))]
        super().__init__(cmd, "servo emulator")
        self.port = self.hello["port"]

    @classmethod
    def of(cls, config: MachineConfig, fault: str | None = None, inject_cycle: int | None = None,
           link: str = "tcp", timing: str = "stepped") -> "EmulatorProcess":
        """The emulator of a machine configuration at its rate, on a CPU other than the
        controller's (``[realtime] cpu``); plant clock ``step`` for ``timing = "stepped"``,
        else the configuration's."""
        return cls(os.path.abspath(config.path), fault, inject_cycle, config.rate_hz,
                   emulator_cpu(config.realtime.cpu), link=link, clock="step" if timing == "stepped" else None)

    def arm(self, fault: str | None, inject_cycle: int | None, rate_hz: float, contact: dict | None = None) -> None:
        """Power-cycle the emulated servos and plant and arm ``fault`` for ``inject_cycle`` (and a
        ``contact``: ``pkrt.drivers.contact.Contact.data``)."""
        self.command({"cmd": "arm", "fault": fault, "inject_cycle": inject_cycle or 0, "rate_hz": rate_hz,
                      "contact": contact})


def serial_config(machine: str, rate_hz: float | None) -> MachineConfig:
    config = load_machine(machine)
    if config.backend != "dynamixel":
        raise UserError(f"{config.path}: [drives], field 'backend': serial HIL needs 'dynamixel', "
                        f"got {config.backend!r}")
    if rate_hz is not None:
        if not 1 <= rate_hz <= 100000:
            raise UserError(f"--rate must be in [1, 100000] Hz, got {rate_hz}")
        config = dataclasses.replace(config, rate_hz=float(rate_hz))
    return config


def run_serial_hil(machine: str = "orthoglide-serial", fault: str | None = None, duration: float | None = 5.0,
                   rate_hz: float | None = None, log_path: str | None = None,
                   emulator: EmulatorProcess | None = None, reference=None, link: str = "tcp",
                   timing: str = "stepped", contact: dict | None = None, tool_force=None) -> HilResult:
    """Run the machine's demo through driver + serial link (``link``: ``LINKS``) + emulator
    process; returns the
    ``HilResult`` (hil/result.py): the ``run_session`` summary plus ``injected_fault``,
    ``injected_cycle``, ``torque_off_cycle`` (measured in the emulator: the cycle at which every
    servo's torque was off), ``detection_cycles`` (cycles run from the injection to the fault),
    ``driver`` (port settings and bus counters) and ``emulator`` (its report).
    ``emulator``: an already running emulator of this machine, re-armed for this run and left
    running (otherwise one is started and stopped; its plant clock is the one it was started
    with). ``reference``: see ``can_hil.reference_for``. ``timing``: module docstring.
    ``contact``: an external force at the emulated plant's tool (``pkrt.drivers.contact.Contact.data``);
    the emulator's report of it in ``emulator["contact"]``; ``tool_force``: ``run_session``'s."""
    from pkrt.rt.runtime.machine.run import run_session

    if fault is not None and fault not in FAULT_KINDS:
        hint = " (bus-off is a CAN fault)" if fault == "bus-off" else ""
        raise UserError(f"unknown serial fault '{fault}'{hint}; known: {', '.join(FAULT_KINDS)}")
    check_timing(timing)
    config = serial_config(machine, rate_hz)
    load_settings(config, {"port": "pty"})  # bad drive settings: say so before starting anything
    trajectory = reference_for(config, reference)  # planned before the emulator starts
    rate = config.rate_hz
    inject = None
    if fault is not None:
        inject = int(round(config.emulator.inject_after * rate))
    if emulator is None:
        emu = EmulatorProcess.of(config, fault, inject, link, timing)
        if contact is not None:
            emu.arm(fault, inject, rate, contact)
    else:
        emu = emulator
        emu.arm(fault, inject, rate, contact)
    ran: list[int] = []
    drives = None
    try:
        drives = open_drives(config, {"port": emu.port})
        if timing == "stepped":  # the cycle's complete answer, waited for in the driver's own time
            drives.exclude_held, drives.window, drives.watchdog_floor = True, STEPPED_WINDOW, STEPPED_SYNC_SILENCE
        result = run_session(config, drives, trajectory=trajectory, duration=duration,
                             log_path=log_path, pacing=PACING[timing],
                             on_cycle=lambda k, t: ran.append(k), tool_force=tool_force)
    finally:
        if drives is not None:
            drives.close()
        report = emu.stop() if emulator is None else emu.report()

    def loop_cycle(w):
        if w is None:
            return None
        if w < len(ran):
            return ran[w]
        return (ran[-1] + 1) if ran else w

    injected = loop_cycle(report.get("injected_cycle"))
    link_used = "tcp" if str(emu.port).startswith("socket://") else "pty"
    return hil_result(result, bus="serial", interface=link_used, timing=timing, injected_fault=fault, injected_cycle=injected,
                      detection_cycles=cycles_run_between(ran, injected, result.get("fault_cycle")),
                      torque_off_cycle=loop_cycle(report.get("torque_off_cycle")), emulator_process=True,
                      emulator_error=report.get("error"), driver=drives.info(), emulator=report)


def run_lockstep_reference(machine: str = "orthoglide-serial", duration: float | None = 5.0,
                           rate_hz: float | None = None, reference=None) -> dict:
    """The same machine, controller, trajectory and rate in lockstep on the simulated plant of
    the ``[emulator]`` table (no bus, no quantisation): the HIL run's reference."""
    from pkrt.drivers.plant import Plant
    from pkrt.drivers.sim import SimDrives
    from pkrt.rt.runtime.machine.run import run_session

    config = serial_config(machine, rate_hz)
    drives = SimDrives(Plant.from_config(config))  # run_session starts it at the trajectory's start
    return run_session(config, drives, trajectory=reference_for(config, reference), duration=duration,
                       lockstep=True)

