"""A program's events (``Planned.events``: the spindle, coolant, tool changes and program stops
of a G-code program, each at a sample where the plan is at rest) as a run or a served machine
meets them: the machine's output state they change (``Outputs``), what the drives are told
(``Drives.set_outputs``) and the log's line. Units: loop time in s, spindle speed as the
program's S (rpm).
"""

from __future__ import annotations


class Outputs:
    """The machine's spindle, coolant and tool, as the events left them."""

    def __init__(self):
        self.spindle = {"state": "off", "speed": 0.0}
        self.coolant = {"mist": False, "flood": False}
        self.tool = 0

    def apply(self, event: dict) -> dict:
        """The event's changes (for ``Drives.set_outputs``), applied to the state."""
        kind, ch = event.get("kind"), {}
        if kind == "spindle":
            self.spindle = {"state": event["state"], "speed": float(event["speed"])}
            ch = {"spindle": event["state"], "spindle_speed": float(event["speed"])}
        elif kind == "coolant":
            self.coolant = {"mist": bool(event["mist"]), "flood": bool(event["flood"])}
            ch = dict(self.coolant)
        elif kind == "tool":
            self.tool = int(event["tool"])
            ch = {"tool": self.tool}
        return ch

    def off(self) -> dict:
        """Spindle and coolant off (a program stopped early); the changes, {} if already off."""
        ch = {}
        if self.spindle["state"] != "off":
            self.spindle = {"state": "off", "speed": self.spindle["speed"]}
            ch["spindle"] = "off"
        if self.coolant["mist"] or self.coolant["flood"]:
            self.coolant = {"mist": False, "flood": False}
            ch.update(mist=False, flood=False)
        return ch

    def status(self) -> dict:
        return {"spindle": dict(self.spindle), "coolant": dict(self.coolant), "tool": self.tool}


def due(events: list, i: int, k: int) -> int:
    """The index past the events from ``i`` on whose sample is at or before loop sample ``k``."""
    while i < len(events) and events[i]["sample"] <= k:
        i += 1
    return i
