"""CiA 402 homing mode (6) of the emulated drives (``CiA402Emulator``), kept apart from the
emulator's cyclic code: it is called from a few hooks there.

Each emulated drive has an incremental encoder: position actual = (theta - zero) * increments,
with zero = 0 at power-up (the emulator's plant coordinates) until homing sets it so that the
position actual value at home is the home offset (0x607C). Methods (0x6098):

- 35, 37: home on the current position (at the next SYNC).
- 18: search the positive limit switch at the switch search speed (0x6099 sub 1), then leave
  it at the zero search speed (sub 2); home is where the switch releases. The switch sits at
  ``switch_at`` (SI, per axis; default 80 % up the plant's range); a search that reaches the end
  of the range without finding it sets the homing error bit (13).

While a drive homes, its own position loop moves the axis along the search profile: in this
emulator that loop is ideal (the plant's axis follows the profile exactly, no torque is
modelled) — homing is a drive's internal procedure, what the master sees is the statusword
and the position. Halt (controlword bit 8) stops the search: target reached without homing
attained (interrupted). Units: SI at the plant, increments on the bus.
"""

from __future__ import annotations

import numpy as np
from canopen import objectdictionary as od
from canopen.objectdictionary import datatypes as dt

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers.cia402_homing import (CW_HALT, CW_HOMING_START, HOME_OFFSET, HOMING_ACCEL, HOMING_METHOD,
                                        HOMING_SPEEDS, MODE_HOMING, SW_HOMING_ATTAINED, SW_HOMING_ERROR,
                                        SW_TARGET_REACHED)


def add_homing_objects(d: od.ObjectDictionary) -> None:
    """0x6098, 0x607C, 0x6099 (subs 1, 2) and 0x609A in a drive's object dictionary."""
    def var(name, index, sub, data_type, default):
        v = od.ODVariable(name, index, sub)
        v.data_type, v.access_type, v.default = data_type, "rw", default
        return v

    d.add_object(var("Homing method", HOMING_METHOD, 0, dt.INTEGER8, 35))
    d.add_object(var("Home offset", HOME_OFFSET, 0, dt.INTEGER32, 0))
    d.add_object(var("Homing acceleration", HOMING_ACCEL, 0, dt.UNSIGNED32, 0))
    r = od.ODRecord("Homing speeds", HOMING_SPEEDS)
    r.add_member(var("Highest sub-index", HOMING_SPEEDS, 0, dt.UNSIGNED8, 2))
    r.add_member(var("Speed during search for switch", HOMING_SPEEDS, 1, dt.UNSIGNED32, 0))
    r.add_member(var("Speed during search for zero", HOMING_SPEEDS, 2, dt.UNSIGNED32, 0))
    d.add_object(r)


class Homing:
    """Homing state of every drive of one emulator."""

    def __init__(self, em, switch_at=None):
        self.em = em
        s = len(em.node_ids)
        self.zero = np.zeros(s)  # SI: plant position where the encoder reads 0
        lo, hi = self._range()
        if switch_at is not None:
            self.switch_at = np.asarray(switch_at, float)
        else:  # 80 % into the travel; a plant without a tree has the switch at 0
            self.switch_at = np.where(np.isfinite(lo) & np.isfinite(hi), lo + 0.8 * np.nan_to_num(hi - lo), 0.0)
        self.active = [False] * s
        self.phase = [""] * s  # "", "search", "leave", "now"
        self.bits = [0] * s
        self.halted = [False] * s
        self.params: list[dict] = [{} for _ in range(s)]

    def _range(self):
        t = getattr(self.em.plant, "tree", None)  # a plant without a tree: no switch range
        if t is not None:
            return np.asarray(t.lo, float), np.asarray(t.hi, float)
        s = len(self.em.node_ids)
        return np.full(s, -np.inf), np.full(s, np.inf)

    # -- hooks -------------------------------------------------------------------------------------
    def position(self, i: int, theta: float) -> float:
        """The encoder's SI position of plant position theta."""
        return theta - self.zero[i]

    def status_bits(self, i: int) -> int:
        return self.bits[i] if self.em.mode[i] == MODE_HOMING else 0

    def on_controlword(self, i: int, cw: int, previous: int) -> None:
        """Bit 4 rising edge in Operation enabled and homing mode starts; bit 8 halts."""
        em = self.em
        if em.mode[i] != MODE_HOMING or em.state[i] is not p.State.OPERATION_ENABLED:
            return
        if cw & CW_HALT and self.active[i]:
            self.active[i], self.halted[i] = False, True
            self.bits[i] = SW_TARGET_REACHED  # interrupted: reached (stopped), not attained
            return
        if cw & CW_HOMING_START and not previous & CW_HOMING_START:
            node = em.nodes[i]

            def raw(index, sub, fmt):
                import struct
                return struct.unpack(fmt, node.get_data(index, sub))[0]
            method = raw(HOMING_METHOD, 0, "<b")
            self.params[i] = {"method": method, "offset": raw(HOME_OFFSET, 0, "<i"),
                              "v1": raw(HOMING_SPEEDS, 1, "<I") / em.increments[i],
                              "v2": raw(HOMING_SPEEDS, 2, "<I") / em.increments[i]}
            self.bits[i] = 0
            self.halted[i] = False
            if method in (35, 37):
                self.active[i], self.phase[i] = True, "now"
            elif method == 18 and self.params[i]["v1"] > 0 and self.params[i]["v2"] > 0:
                self.active[i], self.phase[i] = True, "search"
            else:
                self.bits[i] = SW_HOMING_ERROR  # a method or speeds this drive cannot home with

    def enable_allowed(self, mode: int) -> bool:
        return mode == MODE_HOMING

    def on_sync(self, dt: float) -> bool:
        """Advance every homing drive by dt (s); True when some axis homed this way this SYNC
        (the emulator then skips integrating the plant: the drives hold it)."""
        em = self.em
        homing = [em.mode[i] == MODE_HOMING and em.state[i] is p.State.OPERATION_ENABLED
                  for i in range(len(em.node_ids))]
        if not any(homing):
            return False
        x = em.plant.x
        s = len(em.node_ids)
        lo, hi = self._range()
        for i in range(s):
            x[s + i] = 0.0
            if not (homing[i] and self.active[i]):
                continue
            pr = self.params[i]
            if self.phase[i] == "now":
                self._home_here(i, x[i])
            elif self.phase[i] == "search":
                x[i] += pr["v1"] * dt
                x[s + i] = pr["v1"]
                if x[i] >= self.switch_at[i]:
                    self.phase[i] = "leave"
                elif x[i] >= hi[i]:
                    x[i] = hi[i]
                    self.active[i] = False
                    self.bits[i] = SW_HOMING_ERROR
            elif self.phase[i] == "leave":
                x[i] -= pr["v2"] * dt
                x[s + i] = -pr["v2"]
                if x[i] < self.switch_at[i]:
                    x[s + i] = 0.0
                    self._home_here(i, x[i])
        return True

    def _home_here(self, i: int, theta: float) -> None:
        offset_si = self.params[i]["offset"] / self.em.increments[i]
        self.zero[i] = theta - offset_si
        self.active[i] = False
        self.phase[i] = ""
        self.bits[i] = SW_HOMING_ATTAINED | SW_TARGET_REACHED
