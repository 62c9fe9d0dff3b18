"""A HIL run wired together: the machine's reference planned from its model (this layer may
use the models; the HIL runner below it may not) handed to the bus's runner, which drives the
real driver against a drive emulator in its own process (``pkrt.hil``). The reference is the
configuration's ``[demo]``, or a trajectory file (``traj``: an actuator CSV such as ``pkrt plan
-o planned.csv`` writes, or a task-space CSV) or a G-code program (``gcode``), planned as for
``pkrt run``."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from pkrt.rt.core.errors import UserError

BUS_ONLY = {"corrupt": "serial", "bus-off": "can"}  # fault kinds of one bus only
DEFAULT_MACHINE = {"can": "orthoglide-can", "serial": "orthoglide-serial"}
DEMO_SECONDS = 5.0  # the demo's run time when no duration is given


def _check(bus: str, fault: str | None, duration: float | None, interface: str | None, link: str | None,
           traj: str | None, gcode: str | None) -> None:
    """Every bad combination of options is one line."""
    if fault in BUS_ONLY and BUS_ONLY[fault] != bus:
        raise UserError(f"--fault {fault} applies to --bus {BUS_ONLY[fault]} only")
    if interface and bus != "can":
        raise UserError("--interface applies to --bus can only")
    if link and bus != "serial":
        raise UserError("--link applies to --bus serial only")
    if duration is not None and not duration > 0:
        raise UserError("--duration must be positive")
    if traj is not None and gcode is not None:
        raise UserError("give --traj or --gcode, not both")
    for opt, path in (("--traj", traj), ("--gcode", gcode)):
        if path is not None and not os.path.isfile(path):
            raise UserError(f"{opt} {path}: no such file")


def reference_of(traj: str | None = None, gcode: str | None = None):
    """The ``reference(config)`` callable the HIL runners take (``hil.can_hil.reference_for``):
    the demo, or ``traj`` / ``gcode`` planned for the HIL configuration (its rate) as ``pkrt run``
    plans them (``plan_reference``), and checked as it checks them (the passive joints and
    capsules: ``check_reference``; a G-code program is checked as it is planned)."""
    from pkrt.rt.app.reference import check_reference, plan_reference

    def reference(config):
        axes = None
        if traj is not None or gcode is not None:
            from pkrt.rt.runtime.machine.runsetup import load_controller_tree, tree_axes

            axes, _ = tree_axes(load_controller_tree(config))
        ref = plan_reference(config, traj, axes=axes, gcode=gcode)
        if gcode is None:
            check_reference(config, ref, axes)
        return ref

    return reference


def run_hil(bus: str, *, machine: str | None = None, fault: str | None = None, duration: float | None = None,
            rate_hz: float | None = None, log_path: str | None = None, timing: str = "stepped",
            interface: str | None = None, link: str | None = None, traj: str | None = None,
            gcode: str | None = None, inject: str | None = None) -> dict:
    """The demo of ``machine`` (default: the Orthoglide of that bus), or the trajectory ``traj``
    or G-code program ``gcode``, over ``bus`` ("can" or "serial") for ``duration`` s (default:
    5 s for the demo, the trajectory's own length otherwise) with an optional injected
    ``fault``; the ``HilResult`` (hil/result.py). ``interface``: CAN only; ``link``: serial
    only. A trajectory's run also reports the largest commanded force per actuator
    (``peak_force``, from the run's log) against the controller's ``tau_max``. ``inject``: a
    contact at the emulated plant's tool (``contact@T=FX,FY,FZ[,DURATION]`` or
    ``clamp@T=STIFFNESS``, ``pkrt.rt.app.contact``), its tool linearised from the model about
    the planned reference's pose at T."""
    _check(bus, fault, duration, interface, link, traj, gcode)
    planned = traj is not None or gcode is not None
    if duration is None and not planned:
        duration = DEMO_SECONDS
    kw = dict(fault=fault, duration=duration, rate_hz=rate_hz, reference=reference_of(traj, gcode), timing=timing)
    config = _config(bus, machine or DEFAULT_MACHINE[bus], rate_hz, timing, interface)
    if inject is not None:
        kw["reference"], kw["contact"] = _contact(config, inject, kw["reference"])
    if config.protect.enabled:  # a contact's force at the tool, for its event
        from pkrt.rt.app.contact import tool_force_of
        from pkrt.rt.app.reference import machine_mechanism

        kw["tool_force"] = tool_force_of(machine_mechanism(config))
    with tempfile.TemporaryDirectory(prefix="pkrt-hil-") as tmp:
        if log_path or planned:
            kw["log_path"] = log_path or os.path.join(tmp, "hil.pktlog")
        if bus == "can":
            from pkrt.hil.can_hil import run_can_hil

            r = run_can_hil(machine or DEFAULT_MACHINE[bus], interface=interface or "unix_pair", **kw)
        else:
            from pkrt.hil.serial_hil import run_serial_hil

            r = run_serial_hil(machine or DEFAULT_MACHINE[bus], link=link or "tcp", **kw)
        if planned and not r.get("log_error"):
            r["peak_force"] = _peak_force(kw["log_path"])
    return r


def _config(bus: str, machine: str, rate_hz, timing: str, interface):
    """The HIL run's machine configuration, as its runner loads it."""
    if bus == "can":
        from pkrt.hil.can_hil import _hil_config

        return _hil_config(machine, None, rate_hz, timing, interface or "unix_pair")[0]
    from pkrt.hil.serial_hil import serial_config

    return serial_config(machine, rate_hz)


def _contact(config, spec: str, reference):
    """The run's reference planned here (for the contact's pose) and the contact's data."""
    from pkrt.rt.app.contact import contact_data, parse_contact
    from pkrt.rt.app.reference import machine_mechanism

    parse_contact(spec)  # a bad spec: one line before anything starts
    plan = reference(config)
    return (lambda c: plan), contact_data(spec, machine_mechanism(config), plan)


def _peak_force(log_path: str) -> list[float]:
    """The largest |commanded force| per actuator over the run's cycles (N or N m)."""
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.logs.logstats import columns

    tau = columns(read_log(log_path).channels["tau"])
    tau = tau[np.all(np.isfinite(tau), axis=1)]
    return np.abs(tau).max(axis=0).tolist() if len(tau) else []


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
