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
