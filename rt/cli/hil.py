"""CLI verb ``pkrt hil``: the Orthoglide demo in real time through a real driver, a bus and a
drive emulator backed by the simulated plant, optionally with an injected fault.

Exit 0 when the run completes, or when an injected fault is detected and torque is off
within 3 cycles; exit 1 otherwise."""

from __future__ import annotations

import argparse

from pkrt.hil.result import HilResult
from pkrt.rt.cli import emit, positive_number
from pkrt.rt.core.errors import CheckFailed, Fault, OutputError, UserError

FAULTS = ("drop", "delay", "corrupt", "drive-fault", "bus-off", "sever", "nan")
BUS_ONLY = {"corrupt": "serial", "bus-off": "can"}


def add_arguments_hil(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bus", choices=("can", "serial"), required=True,
                   help="can: CiA 402 drives emulated in another process, over Unix datagram sockets (unix_pair); "
                        "serial: Dynamixel 2.0 servos emulated in another process, over TCP or a pseudo-terminal")
    p.add_argument("--interface", choices=("unix_pair", "udp_pair", "udp_multicast", "virtual"),
                   help="CAN only: unix_pair (default; emulator process, a Unix datagram socket per end), "
                        "udp_pair (emulator process, one multicast group per direction), "
                        "udp_multicast (emulator process, one group: each end also hears its own frames) or "
                        "virtual (emulator thread, in-process bus)")
    p.add_argument("--link", choices=("tcp", "pty"),
                   help="serial only: the line to the servo emulator, tcp (default; pyserial socket:// on "
                        "127.0.0.1) or pty (a pseudo-terminal)")
    p.add_argument("--fault", choices=FAULTS, help="inject this fault during the run")
    p.add_argument("--duration", type=positive_number, default=5.0, help="run time in s (default: %(default)s)")
    p.add_argument("--machine", help="machine configuration (default: orthoglide-can or orthoglide-serial)")
    p.add_argument("--rate", type=positive_number, help="loop rate in Hz (default: the configuration's)")
    p.add_argument("--log", help="run log file")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_hil(args) -> int:
    if args.fault in BUS_ONLY and BUS_ONLY[args.fault] != args.bus:
        raise UserError(f"--fault {args.fault} applies to --bus {BUS_ONLY[args.fault]} only")
    if args.interface and args.bus != "can":
        raise UserError("--interface applies to --bus can only")
    if args.link and args.bus != "serial":
        raise UserError("--link applies to --bus serial only")
    if args.duration <= 0:
        raise UserError("--duration must be positive")
    from pkrt.rt.app.reference import plan_reference

    kw = dict(fault=args.fault, duration=args.duration, rate_hz=args.rate, reference=plan_reference)
    if args.log:
        kw["log_path"] = args.log
    if args.bus == "can":
        from pkrt.hil.can_hil import run_can_hil as run
        machine = args.machine or "orthoglide-can"
        kw["interface"] = args.interface or "unix_pair"
    else:
        from pkrt.hil.serial_hil import run_serial_hil as run
        machine = args.machine or "orthoglide-serial"
        kw["link"] = args.link or "tcp"
    r: HilResult = run(machine, **kw)  # the same keys for both buses (hil/result.py)
    rms, mx = r.get("rms_error"), r.get("max_error")
    u = "m" + (r.get("units") or ["m"])[0]  # mm or mrad
    text = (f"HIL over {args.bus} at {r.get('rate_hz')} Hz: {r.get('cycles')} cycles, overruns {r.get('overruns')}"
            + (f", tracking error RMS {rms * 1e3:.4f} {u}, max {mx * 1e3:.4f} {u}" if rms is not None else ""))
    if (r.get("drives") or {}).get("drive_watchdog"):
        text += f"\n  drive watchdog: {r['drives']['drive_watchdog']}"
    if r.get("fault"):
        text += (f"\n  fault: {r['fault']}\n  injected at cycle {r['injected_cycle']}, detected at cycle "
                 f"{r['fault_cycle']} ({r['detection_cycles']} cycles run later), torque off at cycle "
                 f"{r['torque_off_cycle']}")
    else:
        text += "\n  no faults"
    if r.get("log_error"):
        text += f"\n  log incomplete: {r['log_error']}"
    emit(r, args.json, text)
    if r.get("fault") and not args.fault:
        raise Fault(f"HIL run stopped at cycle {r.get('fault_cycle')}: {r['fault']}")
    if args.fault and not r.get("fault") and r.get("injected_cycle") is None:
        raise CheckFailed(f"fault '{args.fault}' was never injected: the run ended after {r.get('cycles')} cycles, "
                    f"before the emulator's injection time ([emulator] inject_after); give a longer --duration")
    if args.fault and not r.get("fault"):
        raise CheckFailed(f"injected fault '{args.fault}' was not detected")
    if args.fault:
        off, at, inj = r.get("torque_off_cycle"), r.get("fault_cycle"), r.get("injected_cycle")
        if at is not None and (inj is None or at < inj):
            raise CheckFailed(f"the run stopped at cycle {at}, before the injected fault '{args.fault}': {r['fault']}")
        if off is None or at is None or off - at > 3:
            raise CheckFailed(f"injected fault '{args.fault}': torque not off within 3 cycles of the fault "
                        f"(fault cycle {at}, torque off cycle {off})")
    if r.get("log_error"):  # e.g. disk full: the summary above says where the log stops
        raise OutputError(f"log incomplete: {r['log_error']}")
    return 0


VERBS = {"hil": (add_arguments_hil, run_hil)}
