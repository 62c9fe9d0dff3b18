"""The configuration tables of the Dynamixel drive family: ``[drives]`` with ``backend =
"dynamixel"`` (X-series servos over a serial port) and the ``[emulator]`` table of its HIL bus
(``pkrt hil --bus serial``). Validated by the schema (pkrt.rt.core.schema);
docs/configuration.md is generated from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.schema import AXES, BOOL, IDS, INTEGER, NUMBER, STRING, Context, EmulatorPlantTable, spec

from .base import DriveConfigError
from .dynamixel_xseries import BUS_WATCHDOG_UNIT_MS

DYNAMIXEL_MAX_ID = 252
READ_SLICES_WORST = 1.25  # a serial transaction lasts at most this many timeouts (drivers/dynamixel_bus.py)


def load_settings(config, overrides: dict | None = None) -> DynamixelSettings:
    """The machine configuration's ``[drives]`` table with ``overrides`` applied, validated by
    its schema (``DynamixelSettings``)."""
    if config.backend != "dynamixel":
        raise DriveConfigError(f"{config.path}: [drives], field 'backend': expected 'dynamixel', got {config.backend!r}")
    return config.with_drives(overrides).drives


@dataclass(frozen=True, kw_only=True)
class DynamixelSettings:
    """``[drives]`` with ``backend = "dynamixel"``: Dynamixel X-series servos (Protocol 2.0) in
    current mode over a serial port."""

    backend: str = spec(STRING, "drive backend", choices=("dynamixel",))
    port: str = spec(STRING, "serial port or pyserial URL (`pkrt run --port` overrides it)")
    ids: tuple = spec(IDS, "servo IDs, actuator order", lo=0, hi=DYNAMIXEL_MAX_ID)
    torque_constant: np.ndarray = spec(AXES, "motor torque constant", unit="N m/A", lo=0.0, lo_open=True)
    baudrate: int = spec(INTEGER, "serial bit rate", 57600, unit="bit/s", lo=1)
    current_unit: np.ndarray = spec(AXES, "current per Goal/Present Current LSB", 2.69e-3, unit="A",
                                    lo=0.0, lo_open=True)
    position_resolution: np.ndarray = spec(AXES, "pulses per motor revolution", 4096.0, lo=0.0, lo_open=True)
    velocity_unit: np.ndarray = spec(AXES, "rev/min per Present Velocity LSB", 0.229, unit="rev/min",
                                     lo=0.0, lo_open=True)
    lead: np.ndarray = spec(AXES, "actuator travel per motor revolution, linear axis (0: rotary)", 0.0,
                            unit="m", lo=0.0)
    gear_ratio: np.ndarray = spec(AXES, "motor revolutions per axis revolution (rotary axes)", 1.0,
                                  lo=0.0, lo_open=True)
    direction: np.ndarray = spec(AXES, "+1: positive current pushes the actuator coordinate positive; -1",
                                 1.0, lo=-1.0, hi=1.0)
    zero: np.ndarray = spec(AXES, "Present Position at actuator coordinate 0 (from homing; signed)", 0.0,
                            unit="pulses")
    current_limit: np.ndarray = spec(AXES, "Goal Current clamp", 2047.0, unit="LSB", lo=1.0, hi=32767.0,
                                     integer=True)
    timeout: float = spec(NUMBER, "per transaction; 1.25 timeout (1 + retries) must fit a period (default "
                          "0.6 period: no retry fits)", unit="s", lo=0.0, lo_open=True, hi=1.0,
                          derive=lambda values, ctx: 0.6 / ctx.rate_hz)
    retries: int = spec(INTEGER, "extra attempts within a cycle for missing or corrupt answers", 1, lo=0)
    fail_cycles: int = spec(INTEGER, "cycles in a row without full feedback: fault", 2, lo=1)
    position_margin: float = spec(NUMBER, "beyond the position limits still plausible feedback", 0.05,
                                  unit="m or rad", lo=0.0)
    max_velocity: np.ndarray = spec(AXES, "faster reported velocity is implausible: fault (default 10 x "
                                    "[limits] velocity)", unit="m/s or rad/s", lo=0.0, lo_open=True,
                                    derive=lambda values, ctx: 10.0 * ctx.tables["limits"].velocity)
    low_latency: bool = spec(BOOL, "ASYNC_LOW_LATENCY / FTDI latency timer where possible", True)
    rs485: bool = spec(BOOL, "RTS-driven RS-485 direction", False)
    bus_watchdog_ms: int = spec(INTEGER, "servo Bus Watchdog while torque is on (multiple of 20 ms, 0: off)",
                                60, unit="ms", lo=0, hi=127 * BUS_WATCHDOG_UNIT_MS)

    def check(self, ctx: Context) -> None:
        if any(x not in (1.0, -1.0) for x in self.direction):
            raise ctx.error("direction", f"expected +1 or -1 per axis, got {self.direction.tolist()}")
        period = 1.0 / ctx.rate_hz
        worst = READ_SLICES_WORST * self.timeout * (1 + self.retries)
        if worst > period:
            raise ctx.error("timeout", f"{self.timeout} s with {self.retries} retries can take {1e3 * worst:.2f} ms, "
                                       f"more than the {1e3 * period:.2f} ms period at {ctx.rate_hz:g} Hz "
                                       f"(lower the timeout or the retries)")
        wd = self.bus_watchdog_ms
        if wd % BUS_WATCHDOG_UNIT_MS:
            raise ctx.error("bus_watchdog_ms", f"expected 0 (off) or a multiple of {BUS_WATCHDOG_UNIT_MS} ms up to "
                                               f"{127 * BUS_WATCHDOG_UNIT_MS}, got {wd}")
        if wd and wd < 2e3 * period:
            raise ctx.error("bus_watchdog_ms", f"{wd} ms is less than two loop periods ({2e3 * period:g} ms at "
                                               f"{ctx.rate_hz:g} Hz): the servos would stop in a normal run")

    @property
    def bus_watchdog_units(self) -> int:
        """The Bus Watchdog register value (units of 20 ms)."""
        return self.bus_watchdog_ms // BUS_WATCHDOG_UNIT_MS

    def scale(self, i: int) -> float:
        """Actuator units (m or rad) per motor revolution of axis i."""
        return float(self.lead[i]) if self.lead[i] > 0 else 2.0 * math.pi / float(self.gear_ratio[i])

    def force_per_lsb(self, i: int) -> float:
        """Actuator force or torque (N or N m) per Goal Current LSB of axis i (ideal
        transmission: motor torque = force * scale / 2 pi)."""
        return float(self.current_unit[i] * self.torque_constant[i]) * 2.0 * math.pi / self.scale(i)


@dataclass(frozen=True, kw_only=True)
class SerialEmulatorTable(EmulatorPlantTable):
    """``[emulator]`` of a ``dynamixel`` machine: `pkrt hil --bus serial` (servo emulator)."""

    theta0: np.ndarray = spec(AXES, "where the machine stands at power-up (default: the plant's start; signed)",
                              None, unit="m or rad")
    inject_after: float = spec(NUMBER, "time into the run at which the fault starts", 0.5, unit="s", lo=0.0, hi=1e6)
    fault_servo: int = spec(INTEGER, "servo ID hit by drop / corrupt / drive-fault (default: the second)", None,
                            lo=0, hi=DYNAMIXEL_MAX_ID)
    fault_period: int = spec(INTEGER, "drop / corrupt every n-th status packet of that servo", 1, lo=1, hi=10 ** 6)
    delay: float = spec(NUMBER, "answer delay of the `delay` fault", 0.02, unit="s", lo=0.0, hi=60.0)
    clock: str = spec(STRING, "plant clock: cycle (one period per Goal Current write) or wall", "cycle",
                      choices=("cycle", "wall"))
    priority: int = spec(INTEGER, "emulator process SCHED_FIFO priority (0: do not ask)", 0, lo=0, hi=99)

    def check(self, ctx: Context) -> None:
        super().check(ctx)
        ids = list(ctx.tables["drives"].ids)
        if self.fault_servo is not None and self.fault_servo not in ids:
            raise ctx.error("fault_servo", f"expected one of the servo IDs {ids}, got {self.fault_servo}")
