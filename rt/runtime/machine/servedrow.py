"""The served machine's row (``pkrt.rt.runtime.machine.served.Machine``): the channels of each
cycle, written to the run log (a ``LogWriter``'s row, whose header marks the log as served) or
kept in a plain row when there is no log, and sent to telemetry. ``stage`` fills it at a
cycle's end. Units: actuator units (m or rad, N or N m), seconds, microseconds (``*_us``).
"""

from __future__ import annotations

import numpy as np

from pkrt.rt.runtime.machine.runsetup import channel_list
from pkrt.rt.runtime.machine.states import STATE_CODES


def open_row(m, log_path: str | None, lockstep: bool) -> None:
    """Machine ``m``'s row (``row``, ``slices``, ``views``) and its log ``writer`` (None without
    ``log_path``)."""
    m.writer = None
    channels = channel_list(m.s, m.units[0], m.protect.channels if m.protect else ()) + [("state", 1, "code")]
    if log_path:
        from pkrt.rt.runtime.record.logfile import LogWriter

        config = m.config
        header = {"machine": config.raw, "machine_path": config.path, "tree_path": config.tree,
                  "rate_hz": config.rate_hz, "axes": m.axes, "units": m.units, "served": True,
                  "state_codes": {st.value: i for st, i in STATE_CODES.items()},
                  "lockstep": lockstep, "plant": m.drives.describe()}
        m.writer = LogWriter(log_path, header, channels)
        m.row, m.slices, m.views = m.writer.row, m.writer.slices, m.writer.views
    else:
        sl, n = {}, 0
        for name, width, _ in channels:
            sl[name], n = slice(n, n + width), n + width
        m.row, m.slices = np.zeros(n), sl
        m.views = {name: m.row[x] for name, x in sl.items()}


def stage(m, t: float, wake: float, flags: int) -> None:
    """Cycle ``m.k``'s row (at time ``t``, woken ``wake`` s late, with ``flags``) committed to
    the log and offered to telemetry."""
    v, src, fb = m.views, m.source, m.drives.feedback
    v["t"][0] = t
    v["ref_pos"][...] = src.pos
    v["ref_vel"][...] = src.vel
    v["ref_acc"][...] = src.acc
    v["pos"][...] = fb.position
    v["vel"][...] = fb.velocity
    v["tau"][...] = m.ctrl.tau if m.drives.torque_on else 0.0
    v["tau_model"][...] = m.ctrl.tau_model
    v["wake_us"][0] = wake * 1e6
    v["compute_us"][0] = m.comp[m.k & 0xFFFF] * 1e6
    v["flags"][0] = flags
    v["state"][0] = STATE_CODES[m.state]
    if m.writer:
        m.writer.commit()
    if m.telemetry is not None:
        m.telemetry.maybe_send(m.k, t, m.row, m.slices)
