"""The configuration tables of the CiA 402 drive family: ``[drives]`` with ``backend =
"cia402"`` (CiA 402 drives over CANopen) and the ``[emulator]`` table of its HIL bus
(``pkrt hil --bus can``). Validated by the schema (pkrt.rt.core.schema); docs/configuration.md
is generated from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pkrt.rt.core.schema import AXES, CHANNEL, IDS, INTEGER, NUMBER, STRING, TABLE, Context, EmulatorPlantTable, spec

ABORT_CONNECTION = ("quick-stop", "disable-voltage", "fault")  # 0x6007 options (drivers/cia402_protocol.py)


@dataclass(frozen=True, kw_only=True)
class CiA402DrivesTable:
    """``[drives]`` with ``backend = "cia402"``: CiA 402 drives over CANopen (python-can)."""

    backend: str = spec(STRING, "drive backend", choices=("cia402",))
    node_ids: tuple = spec(IDS, "CANopen node ids, actuator order", lo=1, hi=127)
    rated_torque: np.ndarray = spec(AXES, "rated force or torque of each drive (0x6076)", unit="N or N m",
                                    lo=0.0, lo_open=True)
    increments_per_unit: np.ndarray = spec(AXES, "encoder increments per m or rad", unit="1/m or 1/rad",
                                           lo=0.0, lo_open=True)
    interface: str = spec(STRING, "python-can interface (socketcan, pcan, virtual, ...)", "socketcan")
    channel: Any = spec(CHANNEL, "python-can channel", "can0")
    bitrate: int = spec(INTEGER, "bus bit rate", 1000000, unit="bit/s", lo=10000, hi=1000000)
    tpdo_timeout: float = spec(NUMBER, "time after SYNC by which every TPDO must have arrived (at most "
                               "0.95 period; default half a period)", unit="s", lo=1e-5, hi=1.0,
                               derive=lambda values, ctx: 0.5 / ctx.rate_hz)
    max_missed_cycles: int = spec(INTEGER, "cycles in a row without every TPDO tolerated", 1, lo=0, hi=2)
    sdo_timeout: float = spec(NUMBER, "per SDO transfer at configuration time", 0.3, unit="s", lo=0.001, hi=10.0)
    enable_timeout: float = spec(NUMBER, "for every drive to reach Operation enabled", 2.0, unit="s",
                                 lo=0.01, hi=60.0)
    heartbeat_ms: int = spec(INTEGER, "pkrt's heartbeat period (0: off)", 10, unit="ms", lo=0, hi=0xFFFF)
    consumer_timeout_ms: int = spec(INTEGER, "the drives' heartbeat consumer time (>= 2 heartbeat_ms)", 50,
                                    unit="ms", lo=1, hi=0xFFFF)
    abort_connection: str = spec(STRING, "the drives' reaction to a lost heartbeat (0x6007)", "quick-stop",
                                 choices=ABORT_CONNECTION)
    master_node_id: int = spec(INTEGER, "pkrt's node id (heartbeat producer)", 127, lo=1, hi=127)
    sync_loss_cycles: int = spec(INTEGER, "the drives' SYNC monitoring: SYNCs missed in a row before a drive faults "
                                 "(0x1006 = period, 0x2F10 = this; 0: off)", 3, lo=0, hi=0xFFFF)
    bus_options: dict = spec(TABLE, "more python-can bus settings (not interface, channel, bitrate)",
                             {})

    def check(self, ctx: Context) -> None:
        if not self.tpdo_timeout <= 0.95 / ctx.rate_hz:
            raise ctx.error("tpdo_timeout", f"{self.tpdo_timeout:g} s is more than 0.95 of the "
                                            f"{1 / ctx.rate_hz:g} s period at {ctx.rate_hz:g} Hz")
        if self.heartbeat_ms and self.consumer_timeout_ms < 2 * self.heartbeat_ms:
            raise ctx.error("consumer_timeout_ms", f"{self.consumer_timeout_ms} ms is less than twice heartbeat_ms "
                                                   f"= {self.heartbeat_ms} ms (a drive must tolerate one late heartbeat)")
        if self.master_node_id in self.node_ids:
            raise ctx.error("master_node_id", f"{self.master_node_id} is also a drive's node id "
                                              f"(node_ids {list(self.node_ids)})")
        for k in ("interface", "channel", "bitrate"):
            if k in self.bus_options:
                raise ctx.error("bus_options", f"'{k}' is a field of [drives] itself, not a bus option")


@dataclass(frozen=True, kw_only=True)
class CanEmulatorTable(EmulatorPlantTable):
    """``[emulator]`` of a ``cia402`` machine: `pkrt hil --bus can` (CiA 402 drive emulator)."""

    rate_hz: float = spec(NUMBER, "HIL loop rate (pkrt hil --rate overrides it; default: [machine] rate_hz)",
                          None, unit="Hz", lo=1.0, hi=100000.0)
    tpdo_timeout: float = spec(NUMBER, "the driver's TPDO window in HIL (at most 3/4 period)", None, unit="s",
                               lo=1e-5, hi=1.0)
    max_missed_cycles: int = spec(INTEGER, "the driver's missed-cycle tolerance in HIL", None, lo=0, hi=2)
    inject_after: float = spec(NUMBER, "time into the run at which the fault starts", 0.5, unit="s", lo=0.0, hi=1e6)
    delay_cycles: float = spec(NUMBER, "periods the `delay` fault holds back every TPDO", 0.9, unit="periods",
                               lo=0.0, hi=1000.0)
    priority: int = spec(INTEGER, "emulator process SCHED_FIFO priority (0: do not ask)", 0, lo=0, hi=99)
