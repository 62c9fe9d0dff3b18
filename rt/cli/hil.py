"""CLI verb ``pkrt hil``: the machine's demo (default: the Orthoglide's), a planned trajectory
(``--traj``) or a G-code program (``--gcode``) in real time through a real driver, a bus and a
drive emulator backed by the simulated plant, optionally with an injected fault.

Exit 0 when the run completes, or when an injected fault is detected within 3 cycles of its
injection and torque is off within 1 cycle of the detection (``pkrt.hil.verdict``, the same
verdict as the tests'); exit 1 otherwise. ``--timing stepped`` (default: any host, virtual
machines too) or ``wallclock`` (real-time hosts): see ``pkrt.hil.can_hil``."""

from __future__ import annotations

import argparse

from pkrt.hil.result import HilResult
from pkrt.rt.cli.argtypes import positive_number
from pkrt.rt.cli.printing import emit
from pkrt.rt.core.errors import CheckFailed, Fault, OutputError

FAULTS = ("drop", "delay", "corrupt", "drive-fault", "bus-off", "sever", "nan")


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
    p.add_argument("--inject", metavar="KIND@T",
                   help="a contact at the emulated plant's tool: contact@T=FX,FY,FZ[,DURATION] (a force step in N at "
                        "T s for DURATION s) or clamp@T=STIFFNESS (a wall in N/m at the tool's position at T); its "
                        "tool Jacobian from the model at the planned pose at T")
    p.add_argument("--timing", choices=("stepped", "wallclock"), default="stepped",
                   help="stepped (default): the emulated plant advances one period per cycle and a host pause "
                        "delays the run without breaking it (any host, virtual machines too); wallclock: periods "
                        "skipped after overruns and strict wall-clock windows (real-time hosts)")
    p.add_argument("--traj", metavar="FILE.csv",
                   help="run this trajectory instead of the [demo]: t and one column per actuator (as pkrt plan -o "
                        "writes), or the tool's task coordinates, planned as pkrt run --traj plans them")
    p.add_argument("--gcode", metavar="FILE", help="run this G-code program instead of the [demo], checked whole and "
                                                   "timed in minimum time (as pkrt run --gcode)")
    p.add_argument("--duration", type=positive_number,
                   help="run time in s (default: 5 for the demo; a trajectory's own length; longer holds its end)")
    p.add_argument("--machine", help="machine configuration (default: orthoglide-can or orthoglide-serial)")
    p.add_argument("--rate", type=positive_number, help="loop rate in Hz (default: the configuration's)")
    p.add_argument("--log", help="run log file")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_hil(args) -> int:
    from pkrt.hil.verdict import hil_verdict
    from pkrt.rt.app.hil import run_hil as run

    r: HilResult = run(args.bus, machine=args.machine, fault=args.fault, duration=args.duration, rate_hz=args.rate,
                       log_path=args.log, timing=args.timing, interface=args.interface, link=args.link,
                       traj=args.traj, gcode=args.gcode, inject=args.inject)
    v = hil_verdict(r, args.fault)
    r["verdict"] = {"ok": v.ok, "kind": v.kind, "reason": v.reason}
    emit(r, args.json, _text(r, args.bus))
    if not v.ok:
        raise (Fault if v.kind == "stopped" and not args.fault else CheckFailed)(v.reason)
    if r.get("log_error"):  # e.g. disk full: the summary above says where the log stops
        raise OutputError(f"log incomplete: {r['log_error']}")
    return 0


def _text(r: HilResult, bus: str) -> str:
    """The text of ``pkrt hil``: the run, host delays, the drives' watchdog, the fault."""
    rms, mx = r.get("rms_error"), r.get("max_error")
    u = "m" + (r.get("units") or ["m"])[0]  # mm or mrad
    hd = r.get("host_delays") or {}
    text = (f"HIL over {bus} at {r.get('rate_hz')} Hz ({r.get('timing')} timing): {r.get('cycles')} cycles, "
            f"overruns {r.get('overruns')}"
            + (f", tracking error RMS {rms * 1e3:.4f} {u}, max {mx * 1e3:.4f} {u}" if rms is not None else ""))
    if r.get("peak_force") is not None:
        text += (f"\n  trajectory {r.get('trajectory')}: peak commanded force "
                 + ", ".join(f"{f:.3g}" for f in r["peak_force"]) + f"; saturated cycles {r.get('saturated_cycles')}")
    if hd.get("count"):
        text += f"\n  host delays: {hd['count']}, longest {hd['longest_ms']:.1f} ms at cycle {hd['longest_cycle']}"
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
    return text


VERBS = {"hil": (add_arguments_hil, run_hil)}
