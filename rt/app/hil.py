"""A HIL run wired together: the machine's reference planned from its model (this layer may
use the models; the HIL runner below it may not) handed to the bus's runner, which drives the
real driver against a drive emulator in its own process (``pkrt.hil``)."""

from __future__ import annotations

from pkrt.rt.core.errors import UserError

BUS_ONLY = {"corrupt": "serial", "bus-off": "can"}  # fault kinds of one bus only
DEFAULT_MACHINE = {"can": "orthoglide-can", "serial": "orthoglide-serial"}


def run_hil(bus: str, *, machine: str | None = None, fault: str | None = None, duration: float = 5.0,
            rate_hz: float | None = None, log_path: str | None = None, timing: str = "stepped",
            interface: str | None = None, link: str | None = None) -> dict:
    """The demo of ``machine`` (default: the Orthoglide of that bus) over ``bus`` ("can" or
    "serial") for ``duration`` s with an optional injected ``fault``; the ``HilResult``
    (hil/result.py). ``interface``: CAN only; ``link``: serial only."""
    if fault in BUS_ONLY and BUS_ONLY[fault] != bus:
        raise UserError(f"--fault {fault} applies to --bus {BUS_ONLY[fault]} only")
    if interface and bus != "can":
        raise UserError("--interface applies to --bus can only")
    if link and bus != "serial":
        raise UserError("--link applies to --bus serial only")
    if duration <= 0:
        raise UserError("--duration must be positive")
    from pkrt.rt.app.reference import plan_reference

    kw = dict(fault=fault, duration=duration, rate_hz=rate_hz, reference=plan_reference, timing=timing)
    if log_path:
        kw["log_path"] = log_path
    if bus == "can":
        from pkrt.hil.can_hil import run_can_hil

        return run_can_hil(machine or DEFAULT_MACHINE[bus], interface=interface or "unix_pair", **kw)
    from pkrt.hil.serial_hil import run_serial_hil

    return run_serial_hil(machine or DEFAULT_MACHINE[bus], link=link or "tcp", **kw)


SERVE_BUSES = ("can", "serial")
BACKEND = {"can": "cia402", "serial": "dynamixel"}


def served_hil_config(machine: str, bus: str):
    """The configuration of a machine served on the HIL emulator of ``bus``: ``can`` needs a
    CiA 402 machine (its ``[emulator]`` rate and TPDO window), ``serial`` a Dynamixel one."""
    if bus not in SERVE_BUSES:
        raise UserError(f"--bus {bus!r}: expected one of {', '.join(SERVE_BUSES)}")
    if bus == "can":
        from pkrt.hil.can_hil import _hil_config

        return _hil_config(machine, None, None, "stepped", "unix_pair")[0]
    from pkrt.hil.serial_hil import serial_config

    return serial_config(machine, None)


def served_hil_drives(config, bus: str, theta0):
    """The real driver of ``config`` against its drive emulator started in a process of its
    own (as ``pkrt hil`` does) with stepped timing (hil/timing.py): the emulated plant at rest
    at ``theta0`` advances one period per cycle, so a host pause delays the served machine
    (its pacing ``delay``) without breaking it. Returns (drives, emulator process)."""
    import os

    import numpy as np

    if bus == "can":
        from pkrt.hil import can_hil as ch

        _, table, window = ch._hil_config(config.path, None, config.rate_hz, "stepped", "unix_pair")
        channel, options, em_channel, em_options = ch.bus_channels("unix_pair", None)
        emulator = ch.CanEmulatorProcess(os.path.abspath(config.path), config.rate_hz, "unix_pair", em_channel,
                                         em_options, None, np.asarray(theta0, float), table.priority,
                                         ch.emulator_cpu(config.realtime.cpu), "stepped")
        try:
            drives = ch._drives(config, table, window, "stepped",
                                {"interface": "unix_pair", "channel": channel, "bus_options": options})
        except BaseException:
            emulator.kill()
            raise
        return drives, emulator
    from pkrt.drivers import open_drives
    from pkrt.hil.serial_hil import EmulatorProcess
    from pkrt.hil.timing import STEPPED_SYNC_SILENCE, STEPPED_WINDOW

    emulator = EmulatorProcess.of(config, link="tcp", timing="stepped")
    try:
        drives = open_drives(config, {"port": emulator.port})
    except BaseException:
        emulator.kill()
        raise
    drives.exclude_held, drives.window, drives.watchdog_floor = True, STEPPED_WINDOW, STEPPED_SYNC_SILENCE
    return drives, emulator
