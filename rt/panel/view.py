"""What the page shows, built from the machine's replies (``status``, ``info``, ``events``):
a dict of fields the page renders one by one. A page gets the whole view when it connects,
then only the fields that changed (``changes``). Values are rounded to what a readout shows
(positions to 1e-9 of their unit, torques to 1e-6 N m or N), so a machine at rest sends
nothing. The panel keeps nothing else: every field comes from the machine (or the programs
directory), so a restarted panel shows the same page."""

from __future__ import annotations

import math

EVENTS_SHOWN = 200  # the journal's last events on the page


def _round(v, digits: int):
    """Rounded values; a value that is not finite (a lost feedback) is None."""
    return None if v is None else [round(float(x), digits) if math.isfinite(x) else None for x in v]


def joint_fields(st: dict) -> dict:
    ref, pos = _round(st["reference"], 9), _round(st["position"], 9)
    return {"reference": ref, "position": pos, "error": _difference(ref, pos)}


def _difference(a: list, b: list) -> list:
    return [None if x is None or y is None else round(x - y, 9) for x, y in zip(a, b)]


def task_fields(readout, st: dict) -> dict | None:
    """The tool's commanded and actual coordinates and their difference (None without a
    readout, or where the machine does not assemble)."""
    if readout is None:
        return None
    ref, pos = readout("reference", st["reference"]), readout("position", st["position"])
    if ref is None or pos is None:
        return {"coordinates": readout.coordinates, "reference": None, "position": None, "error": None}
    ref, pos = _round(ref, 9), _round(pos, 9)
    return {"coordinates": readout.coordinates, "reference": ref, "position": pos, "error": _difference(ref, pos)}


def motion_fields(motion: dict) -> dict:
    """The motion source's kind and what the page shows of it (hold, rate, path time)."""
    out = {"kind": motion.get("kind")}
    for k in ("held", "rate", "rate_cap", "path_time_s", "duration_s", "released", "at_limit"):
        if k in motion:
            v = motion[k]
            out[k] = round(v, 4) if isinstance(v, float) else v
    return out


def view_of(st: dict, link: dict, info: dict | None, readout, events: list[dict], programs: list[str],
            text: dict | None) -> dict:
    """The page's fields from one ``status`` (``st``) and what the panel read besides it."""
    prog = st.get("program")
    if prog is not None:
        prog = {**prog, "progress": round(prog["progress"], 4)}
    return {
        "link": link, "info": info,
        "state": st["state"], "homed": st["homed"], "torque_on": st["torque_on"], "fault": st["fault"],
        "override": round(st["override"], 4), "overruns": st["overruns"],
        "planning": st.get("planning"), "plan_result": st.get("plan_result"),
        "motion": motion_fields(st["motion"]), "program": prog, "program_text": text,
        "joint": joint_fields(st), "task": task_fields(readout, st),
        "torque": _round(st.get("torque"), 6),
        "alarms": st.get("events"), "events": events[-EVENTS_SHOWN:], "programs": programs,
    }


def link_down(link: dict, programs: list[str]) -> dict:
    """The view while the machine cannot be reached: only the link's state and the programs."""
    return {"link": link, "programs": programs, "state": None}


def changes(old: dict, new: dict) -> dict:
    """The fields of ``new`` that differ from ``old`` (a field ``old`` has and ``new`` lacks
    becomes None)."""
    out = {k: v for k, v in new.items() if old.get(k, object()) != v}
    out.update({k: None for k in old if k not in new})
    return out
