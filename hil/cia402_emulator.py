"""CiA 402 drive emulator: one CANopen node per axis, backed by the simulated plant.

Each axis is a CiA 402 servo drive in cyclic synchronous torque mode on a python-can bus: a
``canopen.LocalNode`` whose SDO server and NMT slave answer real SDO / NMT frames, whose PDO
mapping the master writes, and whose state machine follows CiA 402. On each SYNC the drives in
Operation enabled apply their target torques to the plant for one period and answer with their
TPDOs. ``CiA402Emulator`` holds the state of every drive; its parts hold the behaviour:

- hil/cia402_objects.py: the object dictionary and the PDO mapping rules, as data;
- hil/cia402_canopen.py: the CANopen side: SDO callbacks, PDO mapping, the receiving thread;
- hil/cia402_drive.py: the state machine, the drives' own watchdogs (SYNC monitoring,
  heartbeat consumer), the abort connection option, torque off;
- hil/cia402_plant.py: the SYNC cycle that couples the drives to the plant (``timing``);
- hil/cia402_faults.py: fault injection (``FAULT_KINDS``);
- hil/cia402_homing.py: homing mode 6.

``main`` runs the emulator as a process of its own (``python -m pkrt.hil.cia402_emulator``).
Units: SI at the plant (m or rad, N or N m), drive units on the bus.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import struct
import sys
import threading

import can
import canopen
import numpy as np

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers.base import DriveConfigError
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.cycle.loop import apply_realtime

from .cia402_canopen import CanopenProtocol
from .cia402_drive import DriveLogic
from .cia402_faults import FAULT_KINDS, FaultInjection
from .cia402_homing import Homing
# the object dictionary's names, importable from here as before they had a module of their own
from .cia402_objects import MAPPABLE_RX, MAPPABLE_TX, MAPPING, build_object_dictionary, check_mapping  # noqa: F401
from .cia402_plant import EMCY_PLANT, PlantCoupling  # noqa: F401
from .timing import STEPPED_DELAY, STEPPED_SYNC_SILENCE, TIMINGS

S = p.State


class CiA402Emulator(PlantCoupling, CanopenProtocol, FaultInjection, DriveLogic):
    """CiA 402 drives (one ``LocalNode`` per axis) on a python-can bus, driving ``plant``: the
    drives' state is set up here, their behaviour is in the parts this class is made of (the
    module docstring lists them)."""

    def __init__(self, plant, node_ids: list[int], rated_torque, increments_per_unit, rate_hz: float,
                 channel: str, interface: str = "virtual", fault: str | None = None,
                 inject_cycle: int | None = None, delay_cycles: float = 0.9,
                 bus_options: dict | None = None, timing: str = "wallclock"):
        if fault is not None and fault not in FAULT_KINDS:
            raise DriveConfigError(f"unknown CAN fault kind {fault!r} (known: {', '.join(FAULT_KINDS)})")
        if timing not in TIMINGS:
            raise DriveConfigError(f"emulator timing {timing!r}: expected one of {', '.join(TIMINGS)}")
        self.timing = timing
        self.plant = plant
        self.node_ids = list(node_ids)
        s = len(self.node_ids)
        self.rated = np.asarray(rated_torque, float)  # N or N m
        self.increments = np.asarray(increments_per_unit, float)  # per m or rad
        self.period = 1.0 / rate_hz
        self.fault = fault
        self.inject_cycle = inject_cycle
        self.delay = delay_cycles * self.period
        # a drive's own SYNC monitoring takes at least this long (s) to trip: in stepped timing wall
        # time means nothing to the run (hil/timing.py)
        self.min_sync_silence = 0.0
        if timing == "stepped":
            self.min_sync_silence = STEPPED_SYNC_SILENCE
            self.delay = STEPPED_DELAY
        self.bus = can.Bus(interface=interface, channel=channel, **(bus_options or {}))
        self.network = canopen.Network(self.bus)
        self.nodes: list[canopen.LocalNode] = []
        for i, n in enumerate(self.node_ids):
            node = canopen.LocalNode(n, build_object_dictionary(n, int(round(self.rated[i] * 1000))))
            self.network.add_node(node)
            node.add_read_callback(self._make_read_cb(i))
            node.add_write_callback(self._make_write_cb(i))
            self.nodes.append(node)
        self._index = {n: i for i, n in enumerate(self.node_ids)}
        self.homing = Homing(self)  # homing mode 6 (hil/cia402_homing.py)
        # COB-IDs these nodes send (TPDOs added when mapped): a CAN controller does not receive
        # its own frames, but udp_multicast loops every datagram back to its sender too
        self._own = {base + n for n in self.node_ids for base in (p.EMCY_BASE, p.SDO_TX_BASE, p.HEARTBEAT_BASE)}
        # drive state, per axis
        self.state = [S.SWITCH_ON_DISABLED] * s
        self.cw = [0] * s
        self.mode = [0] * s
        self.target = np.zeros(s)  # per mille
        self.tau = np.zeros(s)  # applied this period, N or N m
        self.off_event: list[tuple[int, int] | None] = [None] * s  # (SYNC index, periods after it)
        self.ever_enabled = [False] * s
        self.off_at: list[float | None] = [None] * s  # time.monotonic() of leaving Operation enabled
        self.abort_code = [p.ABORT_DISABLE_VOLTAGE] * s  # 0x6007 (the dictionary's default)
        self.cycle_period_us = [0] * s  # 0x1006 as the master wrote it (0: not used)
        self.sync_loss_limit = [0] * s  # 0x2F10: SYNCs missed in a row before a fault (0: off)
        self.sync_armed = [False] * s  # both configured and a SYNC seen since: monitoring on
        self.sync_events: list[dict] = []  # SYNC losses: node, time, silence
        self.hb_consumer: list[tuple[int, float] | None] = [None] * s  # (producer id, consumer time s)
        self.hb_last: list[float | None] = [None] * s  # monotonic time of the last heartbeat; None: not armed
        self.heartbeat_events: list[dict] = []
        self._rx_layout: dict[int, tuple[int, struct.Struct, tuple]] = {}
        # per drive: (frame, layout, mapped entries); each frame is packed in place every SYNC
        self._tx_layout: list[list[tuple[can.Message, struct.Struct, tuple]]] = [[] for _ in range(s)]
        # cycle bookkeeping and figures
        self.cycle = -1
        self.last_sync = 0.0  # perf_counter time the last SYNC was processed
        self.grid = 0.0  # nominal bus time (s) of the last SYNC: the plant's time
        self.injected_cycle: int | None = None
        self.bus_dead = False  # bus-off or severed: nothing passes either way
        self.frames_rx = 0
        self.frames_tx = 0
        self.response_us: list[float] = []
        self.sync_wait_max = 0.0  # s, longest a SYNC waited in this end's receive queue (a stall here)
        self.stalls = 0  # times this process woke over a period late (see _held)
        self.stall_max = 0.0  # s, the longest of them
        self.cpu_s = 0.0  # CPU time of the emulator thread up to the last SYNC answered (s)
        self._cpu0 = 0.0
        self._late: list[tuple[float, int, can.Message]] = []
        self._seq = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # an unexpected exception in the emulator thread
        self.plant_error: str | None = None  # the plant left its tree's box: the drives faulted
        self.contact = None  # an external force at the tool (drivers/contact.py; ``--contact``)

    @classmethod
    def from_config(cls, config, channel: str, interface: str = "virtual", fault: str | None = None,
                    plant=None, bus_options: dict | None = None, timing: str = "wallclock") -> "CiA402Emulator":
        """The emulator of a machine configuration: ``[drives]`` (node ids, scaling) and
        ``[emulator]`` (plant, ``inject_after`` s, ``delay_cycles``)."""
        from pkrt.drivers.cia402 import CiA402Drives
        from pkrt.drivers.plant import Plant

        ref = CiA402Drives.from_config(config, {"interface": "virtual", "channel": channel})
        em = config.emulator  # validated by the schema (CanEmulatorTable, drivers/cia402_tables.py)
        return cls(plant if plant is not None else Plant.from_config(config), ref.node_ids, ref.rated_torque,
                   ref.increments, config.rate_hz, channel, interface, fault,
                   int(round(em.inject_after * config.rate_hz)) if fault else None,
                   em.delay_cycles, bus_options, timing)

    def report(self) -> dict:
        r = np.asarray(self.response_us) if self.response_us else np.zeros(1)
        on = any(st is S.OPERATION_ENABLED for st in self.state)
        offs = [t for t, e in zip(self.off_at, self.ever_enabled) if e]
        return {"torque_on": on, "torque_off_at": None if on or not offs or None in offs else max(offs),
                "heartbeat_events": list(self.heartbeat_events), "sync_events": list(self.sync_events),
                "sync_monitoring": [None if t is None else round(t * 1e6) for t in map(self.sync_timeout,
                                                                                    range(len(self.node_ids)))],
                "heartbeat_consumers": [None if c is None else {"producer": c[0], "ms": round(c[1] * 1e3)}
                                        for c in self.hb_consumer],
                "abort_codes": list(self.abort_code),
                "injected_cycle": self.injected_cycle, "torque_off_cycle": self.torque_off_cycle,
                "torque_off_event": self.torque_off_event,
                "emulator_cycles": self.cycle + 1, "frames_rx": self.frames_rx, "frames_tx": self.frames_tx,
                "sync_wait_us_max": round(self.sync_wait_max * 1e6, 1),
                "stalls": self.stalls, "stall_us_max": round(self.stall_max * 1e6, 1),
                "emulator_cpu_us_per_cycle": round(self.cpu_s / (self.cycle + 1) * 1e6, 1) if self.cycle >= 0 else None,
                "emulator_response_us": {"p50": round(float(np.percentile(r, 50)), 1),
                                         "p99": round(float(np.percentile(r, 99)), 1), "max": round(float(r.max()), 1)},
                "drive_states": [st.name for st in self.state], "emulator_error": self.error,
                "plant_error": self.plant_error,
                "contact": None if self.contact is None else self.contact.truth()}


# -- the emulator as a process of its own (``pkrt hil --bus can`` over udp_multicast) -----------
def main(argv: list[str] | None = None) -> int:
    """``python -m pkrt.hil.cia402_emulator --channel GROUP [...]``: the drives on a python-can
    bus that crosses processes (udp_multicast on one host, socketcan on a vcan or real bus).
    Prints one JSON line ``{"ready": true, ...}`` once on the bus, answers ``{"cmd": "report"}``
    lines on stdin with one JSON line, and at the end of stdin (or SIGTERM) stops and prints
    its report."""
    import dataclasses

    from pkrt.rt.runtime.machine.config import load_machine

    ap = argparse.ArgumentParser(prog="python -m pkrt.hil.cia402_emulator", description=__doc__.split("\n")[0])
    ap.add_argument("--machine", default="orthoglide-can")
    ap.add_argument("--interface", default="udp_multicast", help="python-can interface (default: %(default)s)")
    ap.add_argument("--channel", required=True, help="bus channel (udp_multicast: the multicast group)")
    ap.add_argument("--bus-options", default="{}", help='JSON object of more bus settings, e.g. {"port": 43113}')
    ap.add_argument("--rate", type=float, help="loop rate in Hz (default: the machine's)")
    ap.add_argument("--fault", choices=FAULT_KINDS)
    ap.add_argument("--theta0", help="comma-separated start position of the plant (m or rad)")
    ap.add_argument("--contact", help="JSON: an external force at the tool (pkrt.drivers.contact.Contact.data)")
    ap.add_argument("--priority", type=int, default=0, help="SCHED_FIFO priority (0: do not ask)")
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (-1: do not pin)")
    ap.add_argument("--timing", choices=TIMINGS, default="wallclock",
                    help="stepped: one plant period per SYNC; wallclock: periods by the SYNCs' bus timestamps")
    a = ap.parse_args(argv)
    try:
        config = load_machine(a.machine)
        if a.rate is not None:
            if not 1.0 <= a.rate <= 100000.0:
                raise UserError(f"--rate must be in [1, 100000] Hz, got {a.rate}")
            config = dataclasses.replace(config, rate_hz=a.rate)
        options = json.loads(a.bus_options)
        if not isinstance(options, dict):
            raise UserError(f"--bus-options: expected a JSON object, got {a.bus_options!r}")
        em = CiA402Emulator.from_config(config, a.channel, a.interface, a.fault, bus_options=options,
                                        timing=a.timing)
        if a.theta0:
            theta0 = np.array([float(x) for x in a.theta0.split(",")])
            if theta0.shape != em.plant.theta.shape or not np.all(np.isfinite(theta0)):
                raise UserError(f"--theta0: expected {em.plant.theta.shape[0]} finite numbers, got {a.theta0!r}")
            em.plant.reset(theta0)
        if a.contact:
            from pkrt.drivers.contact import Contact

            em.contact = Contact.from_data(json.loads(a.contact), len(em.node_ids))
    except (UserError, ValueError, can.CanError, OSError) as e:
        print(f"cia402_emulator: error: {e}", file=sys.stderr)
        return 2
    # before the emulator thread starts (it inherits them); memory locked with a priority: a
    # page fault in a real-time process stalls it for milliseconds on a loaded machine
    sched = apply_realtime(a.priority, a.cpu, a.priority > 0, gc_freeze=False)
    sched.pop("gc_freeze", None)
    gc.collect()  # the modules and the plant are loaded: a full collection now, none of it later
    gc.freeze()  # (gen 2 collections over numba's and canopen's objects take milliseconds)
    em.start()
    signal.signal(signal.SIGTERM, lambda *_: os.close(0))
    print(json.dumps({"ready": True, "pid": os.getpid(), "interface": a.interface, "channel": a.channel,
                      "scheduling": sched}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                cmd = json.loads(line).get("cmd")
            except (ValueError, AttributeError):
                cmd = None
            out = em.report() if cmd == "report" else {"error": f"unknown command {line.strip()!r}"}
            print(json.dumps(out), flush=True)
    except (KeyboardInterrupt, OSError, ValueError):
        pass
    em.stop()
    print(json.dumps({**em.report(), "scheduling": sched}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
