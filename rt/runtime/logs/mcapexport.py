"""A run log as MCAP: one JSON channel per group of signals, for Foxglove and PlotJuggler.

Topics (each present when the log holds its channels; per-axis values are objects keyed by
the actuator names, in the log's units, SI at the actuators):

- ``/pkrt/reference``: ``position``, ``velocity``, ``acceleration`` (``ref_pos``, ``ref_vel``, ``ref_acc``)
- ``/pkrt/measured``: ``position``, ``velocity`` (``pos``, ``vel``)
- ``/pkrt/torque``: ``command`` (``tau``, what went to the drives), ``model`` (``tau_model``,
  the controller's torque before saturation)
- ``/pkrt/tracking_error``: ``position`` = ref_pos - pos, ``velocity`` = ref_vel - vel
- ``/pkrt/safety``: ``flags`` and its bits (saturated, clamped_or_out_of_domain, overrun,
  stale_feedback); ``fault`` (true from the first fault event on; export only)
- ``/pkrt/timing``: ``wake_us``, ``compute_us``
- ``/pkrt/tool``: the tool channels computed after the run (``pkrt.rt.app.toolchannels``):
  ``reference`` (``tool_ref``) and ``position`` (``tool``), keyed by the tool's coordinates (x,
  y, z in m; roll, pitch, yaw in rad for 6-DOF), and ``error`` = reference - position; any
  other channel named ``tool_<field>`` too (e.g. ``tool_pos`` -> ``position`` keyed x, y, z)
- ``/pkrt/<name>``: any other channel, one topic each
- ``/pkrt/events`` (export only): one message per logged event at its cycle's time.

Every message also carries ``t`` (loop time, s) and ``cycle`` (the loop's cycle index, as the
events number them). Non-finite values (a fault's bad reading) are JSON ``null``. Log and
publish time are the cycle's loop time in ns (t = 0 at the run's first cycle); the run's
wall-clock start is the ``created`` metadata entry. The run's header (machine, controller and
gains, model and tree hashes, rate, axes, units, versions) is the MCAP metadata record
``pkrt.run``; how complete the log was is ``pkrt.log``; the run's summary ``pkrt.summary``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.cycle.flags import FLAG_BITS
from pkrt.rt.runtime.record.logfile import Log, channel_slices
from pkrt.rt.runtime.logs.logstats import columns, loop_cycles
from pkrt.rt.core.plain import to_jsonable

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
TOOL_PREFIX = "tool_"
TOOL_FIELDS = {"tool": "position", "tool_ref": "reference", "tool_pos": "position", "tool_vel": "velocity",
               "tool_acc": "acceleration"}
XYZ = ["x", "y", "z"]

# (topic, [(field, channel)]): a group appears when the log has at least one of its channels
GROUPS = [
    ("/pkrt/reference", [("position", "ref_pos"), ("velocity", "ref_vel"), ("acceleration", "ref_acc")]),
    ("/pkrt/measured", [("position", "pos"), ("velocity", "vel")]),
    ("/pkrt/torque", [("command", "tau"), ("model", "tau_model")]),
    ("/pkrt/timing", [("wake_us", "wake_us"), ("compute_us", "compute_us")]),
]
ERRORS = [("position", "ref_pos", "pos"), ("velocity", "ref_vel", "vel")]  # tracking error = ref - measured


@dataclass
class Field:
    """One field of a message: ``kind`` "axes" (an object keyed by ``keys``), "number",
    "diff" (axes of channel a minus channel b) or "flags"; columns are row indices."""
    name: str
    kind: str
    cols: list[int]
    keys: list[str] = field(default_factory=list)
    unit: str = ""
    cols_b: list[int] = field(default_factory=list)


@dataclass
class Topic:
    topic: str
    fields: list[Field]

    @property
    def schema_name(self) -> str:
        return "pkrt" + self.topic.replace("/pkrt", "").replace("/", ".")


def _keys(name: str, width: int, axes: list[str], labels: dict[str, list[str]] | None = None) -> list[str]:
    if labels and len(labels.get(name, ())) == width:  # the channel's own column labels
        return list(labels[name])
    if width == 3 and name.startswith(TOOL_PREFIX):  # a tool's Cartesian position, not per actuator
        return list(XYZ)
    if len(axes) == width:
        return list(axes)
    return [str(i) for i in range(width)]


def _field(fname: str, channel: str, slices: dict[str, slice], units: dict[str, str], axes: list[str],
           labels: dict[str, list[str]] | None = None) -> Field:
    sl = slices[channel]
    cols = list(range(sl.start, sl.stop))
    if len(cols) == 1 and not (len(axes) == 1 and channel not in ("t", "wake_us", "compute_us", "flags")):
        return Field(fname, "number", cols, unit=units.get(channel, ""))
    return Field(fname, "axes", cols, _keys(channel, len(cols), axes, labels), units.get(channel, ""))


def layout(slices: dict[str, slice], units: dict[str, str], axes: list[str],
           labels: dict[str, list[str]] | None = None) -> list[Topic]:
    """The topics for a row layout (channel name -> columns), data-driven: groups appear when
    their channels do; unclaimed channels get a topic each. ``labels``: column names of
    channels that are not per axis (``Log.labels``)."""
    topics: list[Topic] = []
    claimed = {"t"}
    for topic, members in GROUPS:
        fs = [_field(f, ch, slices, units, axes) for f, ch in members if ch in slices]
        claimed |= {ch for _, ch in members}
        if fs:
            topics.append(Topic(topic, fs))
    errs = [_diff(fname, a, b, slices, units, axes) for fname, a, b in ERRORS if _same_width(slices, a, b)]
    if errs:
        topics.append(Topic("/pkrt/tracking_error", errs))
    if "flags" in slices:
        claimed.add("flags")
        topics.append(Topic("/pkrt/safety", [Field("flags", "flags", [slices["flags"].start])]))
    tool = [ch for ch in slices if ch == "tool" or ch.startswith(TOOL_PREFIX)]
    if tool:
        claimed |= set(tool)
        topics.append(_tool_topic(tool, slices, units, axes, labels))
    topics += [Topic(f"/pkrt/{ch}", [_field(ch, ch, slices, units, axes, labels)]) for ch in slices
               if ch not in claimed]
    return topics


def _same_width(slices: dict[str, slice], a: str, b: str) -> bool:
    """Both channels are logged, with as many columns each."""
    return a in slices and b in slices and slices[a].stop - slices[a].start == slices[b].stop - slices[b].start


def _diff(fname: str, a: str, b: str, slices: dict[str, slice], units: dict[str, str], axes: list[str],
          labels: dict[str, list[str]] | None = None, unit: str | None = None) -> Field:
    """Field ``fname``: channel ``a`` minus channel ``b``, keyed as ``a``, in ``unit`` (default
    ``b``'s unit)."""
    f = _field(fname, a, slices, units, axes, labels)
    return Field(fname, "diff", f.cols, f.keys, units.get(b, "") if unit is None else unit,
                 list(range(slices[b].start, slices[b].stop)))


def _tool_topic(tool: list[str], slices: dict[str, slice], units: dict[str, str], axes: list[str],
                labels: dict[str, list[str]] | None) -> Topic:
    """``/pkrt/tool``: one field per tool channel and, with both ``tool`` and ``tool_ref``, the
    error reference - position (in the reference's unit)."""
    fs = [_field(TOOL_FIELDS.get(ch, ch[len(TOOL_PREFIX):]), ch, slices, units, axes, labels) for ch in tool]
    if _same_width(slices, "tool", "tool_ref"):
        fs.append(_diff("error", "tool_ref", "tool", slices, units, axes, labels, units.get("tool_ref", "")))
    return Topic("/pkrt/tool", fs)


def _num(v: float):
    return float(v) if math.isfinite(v) else None


def message(topic: Topic, row, t: float, cycle: int, fault: bool | None = None) -> dict:
    """One topic's message for a row of values (a sequence of floats)."""
    m: dict = {"t": float(t), "cycle": int(cycle)}
    for f in topic.fields:
        if f.kind == "number":
            m[f.name] = _num(row[f.cols[0]])
        elif f.kind == "axes":
            m[f.name] = {k: _num(row[c]) for k, c in zip(f.keys, f.cols)}
        elif f.kind == "diff":
            m[f.name] = {k: _num(row[a] - row[b]) for k, a, b in zip(f.keys, f.cols, f.cols_b)}
        else:  # flags
            v = row[f.cols[0]]
            bits = int(v) if math.isfinite(v) else 0
            m["flags"] = bits
            for name, b in FLAG_BITS.items():
                m[name] = bool(bits & b)
    if fault is not None and any(f.kind == "flags" for f in topic.fields):
        m["fault"] = bool(fault)
    return m


def json_schema(topic: Topic, with_fault: bool = False) -> dict:
    """The JSON Schema (draft 2020-12) of a topic's messages."""
    num = {"type": ["number", "null"]}
    props: dict = {"t": {"type": "number", "description": "loop time [s]"},
                   "cycle": {"type": "integer", "description": "loop cycle index"}}
    for f in topic.fields:
        unit = f" [{f.unit}]" if f.unit else ""
        if f.kind == "number":
            props[f.name] = {**num, "description": f"{f.name}{unit}"}
        elif f.kind in ("axes", "diff"):
            props[f.name] = {"type": "object", "description": f"{f.name} per axis{unit}",
                             "properties": {k: dict(num) for k in f.keys}, "required": list(f.keys),
                             "additionalProperties": False}
        else:
            props["flags"] = {"type": "integer", "description": "controller and loop flag bits"}
            for name, b in FLAG_BITS.items():
                props[name] = {"type": "boolean", "description": f"flag bit {b}"}
    required = list(props)
    if with_fault and any(f.kind == "flags" for f in topic.fields):
        props["fault"] = {"type": "boolean", "description": "true from the run's first fault on"}
    return {"$schema": SCHEMA_DIALECT, "title": topic.schema_name, "type": "object",
            "properties": props, "required": required}


EVENT_SCHEMA = {"$schema": SCHEMA_DIALECT, "title": "pkrt.events", "type": "object",
                "properties": {"t": {"type": "number", "description": "loop time [s]"},
                               "cycle": {"type": "integer"}, "kind": {"type": "string"},
                               "message": {"type": "string"},
                               "wall": {"type": ["number", "null"], "description": "UTC, s since the epoch"}},
                "required": ["t", "cycle", "kind", "message"]}


# -- from a log ------------------------------------------------------------------------------
def log_matrix(log: Log) -> tuple[np.ndarray, dict[str, slice]]:
    """Every channel side by side (n_cycles, width) and each channel's columns."""
    parts = {name: columns(np.asarray(a, dtype=float)) for name, a in log.channels.items()}
    slices = channel_slices((name, a.shape[1]) for name, a in parts.items())
    width = sum(a.shape[1] for a in parts.values())
    data = np.hstack(list(parts.values())) if parts and log.n_cycles else np.zeros((log.n_cycles, width))
    return data, slices


def cycle_times(log: Log) -> tuple[np.ndarray, np.ndarray]:
    """Loop time (s) and the loop's cycle index of each row: from ``t`` and the rate when the
    log has them, else the row's cycle index (and index / rate, or 0)."""
    rate = log.header.get("rate_hz")
    ok_rate = isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0
    t = log.get("t")
    cyc = loop_cycles(log)
    if t is None or not np.all(np.isfinite(t)):
        t = cyc / rate if ok_rate else np.zeros(len(cyc))
    return np.asarray(t, dtype=float), cyc


def event_time(log: Log, e: dict) -> float:
    """Loop time (s) of an event: cycle / rate, else the time of its row."""
    rate = log.header.get("rate_hz")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
        return float(e["cycle"]) / float(rate)
    t = log.get("t")
    if t is not None and len(t):
        return float(t[min(log.row_of_cycle(e["cycle"]), len(t) - 1)])
    return 0.0


def first_fault_time(log: Log) -> float | None:
    ts = [event_time(log, e) for e in log.events
          if "fault" in str(e.get("kind", "")).lower() and isinstance(e.get("cycle"), int)]
    return min(ts) if ts else None


def damage(log: Log) -> dict:
    """What a damaged log lost: cut off (no end record), bad blocks, blocks the writer dropped,
    and the cycles missing between the first and the last row."""
    c = log.cycles
    missing = int(c[-1] - c[0] + 1 - len(c)) if len(c) else 0
    return {"complete": log.summary is not None and not log.truncated, "truncated": bool(log.truncated),
            "bad_blocks": int(log.bad_blocks), "dropped_blocks": int(log.dropped_blocks),
            "missing_cycles": missing, "last_cycle": int(c[-1]) if len(c) else None}


def damage_note(log: Log) -> str | None:
    """One line saying what an export of a damaged log left out, or None."""
    d = damage(log)
    parts = []
    if d["truncated"]:
        parts.append(f"the log is cut off after cycle {d['last_cycle']} (no end record)")
    if d["bad_blocks"]:
        parts.append(f"{d['bad_blocks']} damaged block(s) skipped")
    if d["dropped_blocks"]:
        parts.append(f"{d['dropped_blocks']} block(s) dropped by the writer during the run")
    if d["missing_cycles"]:
        parts.append(f"{d['missing_cycles']} cycle(s) missing")
    if not parts:
        return None
    return f"note: exported {log.n_cycles} cycles up to the last good record; " + ", ".join(parts)


def _text(v) -> str:
    return v if isinstance(v, str) else json.dumps(to_jsonable(v))


def run_metadata(log: Log) -> dict[str, str]:
    """The log's header as MCAP metadata: strings as they are, everything else as JSON."""
    return {str(k): _text(v) for k, v in log.header.items()}


def export_mcap(log: Log, out: str, chunk_size: int = 1024 * 1024) -> dict:
    """Write the log as MCAP (see the module docstring). Returns topics, message counts and
    what a damaged log lost."""
    from mcap.writer import CompressionType, IndexType, Writer

    data, slices = log_matrix(log)
    units = dict(log.units)
    topics = layout(slices, units, log.axes(), log.labels)
    t, cyc = cycle_times(log)
    t_fault = first_fault_time(log)
    log_ns = np.rint(t * 1e9).astype(np.int64)
    if len(log_ns) and log_ns.min() < 0:
        raise UserError(f"{log.path}: negative loop times; cannot be MCAP log times")
    counts: dict[str, int] = {}
    try:
        f = open(out, "wb")
    except OSError as e:
        raise UserError(f"{out}: cannot write: {e.strerror}") from None
    with f:
        w = Writer(f, chunk_size=chunk_size, compression=CompressionType.ZSTD, index_types=IndexType.ALL,
                   use_statistics=True, use_summary_offsets=True)
        w.start(profile="", library="pkrt")
        ids = []
        for tp in topics:
            sid = w.register_schema(tp.schema_name, "jsonschema",
                                    json.dumps(json_schema(tp, t_fault is not None)).encode())
            ids.append(w.register_channel(tp.topic, "json", sid, metadata={"source": "pkrt log"}))
            counts[tp.topic] = 0
        ev_id = None
        if log.events:
            sid = w.register_schema("pkrt.events", "jsonschema", json.dumps(EVENT_SCHEMA).encode())
            ev_id = w.register_channel("/pkrt/events", "json", sid)
            counts["/pkrt/events"] = 0
        events = sorted(((event_time(log, e), e) for e in log.events if isinstance(e.get("cycle"), int)),
                        key=lambda x: x[0])
        ei = 0
        dumps = json.dumps
        for k in range(len(data)):
            row = data[k].tolist()
            tk, ck, ns = float(t[k]), int(cyc[k]), int(log_ns[k])
            while ei < len(events) and events[ei][0] <= tk:
                ei = _write_event(w, ev_id, events[ei], ei, counts)
            fault = None if t_fault is None else tk >= t_fault - 1e-12
            for tp, cid in zip(topics, ids):
                w.add_message(cid, log_time=ns, publish_time=ns, sequence=k,
                              data=dumps(message(tp, row, tk, ck, fault)).encode())
                counts[tp.topic] += 1
        while ei < len(events):
            ei = _write_event(w, ev_id, events[ei], ei, counts)
        w.add_metadata("pkrt.run", run_metadata(log))
        w.add_metadata("pkrt.log", {"path": log.path, "cycles": str(log.n_cycles),
                                    **{k: _text(v) for k, v in damage(log).items()}})
        if log.summary:
            w.add_metadata("pkrt.summary", {str(k): _text(v) for k, v in log.summary.items()})
        w.finish()
    return {"path": str(out), "topics": counts, "messages": sum(counts.values()), "damage": damage(log)}


def _write_event(w, ev_id: int, item: tuple[float, dict], i: int, counts: dict) -> int:
    t, e = item
    ns = int(round(max(t, 0.0) * 1e9))
    msg = {"t": t, "cycle": int(e["cycle"]), "kind": str(e.get("kind", "")), "message": str(e.get("message", "")),
           "wall": _num(e["wall"]) if isinstance(e.get("wall"), (int, float)) else None}
    w.add_message(ev_id, log_time=ns, publish_time=ns, sequence=i, data=json.dumps(msg).encode())
    counts["/pkrt/events"] += 1
    return i + 1
