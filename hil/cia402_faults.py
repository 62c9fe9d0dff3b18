"""Fault injection of the CiA 402 drive emulator (``pkrt hil --bus can --fault KIND``): the
fault kinds, and what happens at the SYNC of the injection (``_inject``); the lasting effects
of ``drop``, ``delay`` and ``nan`` act in the cycle (hil/cia402_plant.py, hil/cia402_canopen.py).
Each kind (``fault``), from cycle ``inject_cycle`` on:

  drop         TPDOs of the first drive are lost (never sent).
  delay        TPDOs back up like a transmit queue behind higher-priority traffic: those of the
               injected cycle leave ``delay_cycles`` periods after their SYNC left the master (bus
               timestamp: after the master's window), each later cycle's one period later still.
               (A constant delay cannot be told from a timely answer by a SYNC-driven master once
               it exceeds a period: the late frames land in the next window.)
  drive-fault  the first drive enters Fault reaction active (torque off), sends EMCY 0x2310
               (over-current, output side), then reports Fault.
  bus-off      the bus fails (e.g. CAN_H shorted to CAN_L): the emulator sends, on the master's
               behalf, the error frame SocketCAN delivers for a bus-off controller (CAN ID class
               CAN_ERR_BUSOFF = 0x040, DLC 8), then no frame passes either way. The virtual bus has
               no controller state, so this is how python-can's ``virtual`` interface can show it.
               Every drive, itself off the bus, reacts per its abort connection option code
               (0x6007, as the master configured it): torque off at once.
  sever        the cable is cut: the emulator neither receives nor sends. Each drive whose SYNC
               monitoring the master configured (hil/cia402_drive.py) takes its torque off by
               itself.
  nan          the first drive's position and velocity actual values become 0x80000000 (its
               encoder reading is not finite), a value the master must reject.
"""

from __future__ import annotations

import can

from pkrt.drivers import cia402_protocol as p

FAULT_KINDS = ("drop", "delay", "drive-fault", "bus-off", "sever", "nan")  # CiA 402 emulator fault kinds
S = p.State


class FaultInjection:
    """The fault injection of ``CiA402Emulator`` (hil/cia402_emulator.py, which holds the state:
    ``fault``, ``injected_cycle``, ``bus_dead``); it uses the drives' state machine
    (hil/cia402_drive.py) and the bus (hil/cia402_canopen.py)."""

    def _inject(self, k: int) -> None:
        """The armed fault starts at SYNC ``k``."""
        self.injected_cycle = k
        if self.fault == "drive-fault":
            self._set_state(0, S.FAULT_REACTION_ACTIVE)
            self._send(can.Message(arbitration_id=p.EMCY_BASE + self.node_ids[0],
                                   data=p.encode_emcy(0x2310, 0x03), is_extended_id=False))
        elif self.fault == "bus-off":
            err = can.Message(arbitration_id=p.CAN_ERR_BUSOFF, is_error_frame=True, dlc=p.CAN_ERR_DLC,
                              data=bytes(p.CAN_ERR_DLC), is_extended_id=False)
            self._send(err)
            self.bus_dead = True
            for i in range(len(self.node_ids)):  # each drive's abort connection option code
                self._abort_connection(i)
        elif self.fault == "sever":
            self.bus_dead = True
