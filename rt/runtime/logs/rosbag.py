"""ROS 2 bags (MCAP storage) with ``sensor_msgs/msg/JointState``: export of a run log, and
recorded joint states as trajectories and for the offline model check.

Export (``pkrt log export LOG --ros2 DIR``): a rosbag2 directory (``metadata.yaml`` and one
zstd-chunked ``.mcap``), written through ``rosbags`` (CDR encoding, message definitions and
type hashes included, so ``ros2 bag info/play``, Foxglove and PlotJuggler open it without
pkrt). Topics: ``/joint_states`` (measured: ``pos``, ``vel``, effort = ``tau``, the torque
sent to the drives) and ``/pkrt/reference/joint_states`` (``ref_pos``, ``ref_vel``, effort =
``tau_model``, the controller's torque before saturation); joint names are the actuators';
header stamp and bag time are the cycle's loop time (ns from the run's first cycle). The run's
header goes into ``custom_data`` (``pkrt.<key>``, JSON values).

Import: a bag directory or a bare ``.mcap`` file; the JointState messages of one topic; joints
picked by the machine's actuator names (other joints are ignored); time from the header
stamps (the bag's receive times when every stamp is zero). Refused with one line: a missing
topic or joint, a message whose arrays do not match its names, stamps that go backwards or
repeat, a gap longer than ``MAX_GAP_PERIODS`` median periods, non-finite positions (or
efforts, when they are used).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.record.logfile import Log

DEFAULT_TOPIC = "/joint_states"
REFERENCE_TOPIC = "/pkrt/reference/joint_states"
JOINT_STATE = "sensor_msgs/msg/JointState"
MAX_GAP_PERIODS = 5.0  # a stamp step longer than this many median periods is a gap
MCAP_MAGIC = b"\x89MCAP0\r\n"


def _qos():
    """The QoS profile ``ros2 bag record`` stores for a default publisher (reliable,
    volatile, no deadline), so ``ros2 bag play`` offers the topic as a driver would."""
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    never = QosTime(sec=9223372036, nsec=854775807)
    return Qos(QosHistory.UNKNOWN, 0, QosReliability.RELIABLE, QosDurability.VOLATILE, never, never,
               QosLiveliness.AUTOMATIC, never, False)


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_HUMBLE)  # JointState is the same in every ROS 2 release


def is_bag(path: str) -> bool:
    """A rosbag2 directory, or an MCAP file (by suffix or magic bytes)."""
    p = Path(path)
    if p.is_dir():
        return True
    if p.suffix.lower() == ".mcap":
        return True
    try:
        with open(p, "rb") as f:
            return f.read(len(MCAP_MAGIC)) == MCAP_MAGIC
    except OSError:
        return False


# -- export ----------------------------------------------------------------------------------
def export_ros2(log: Log, out_dir: str) -> dict:
    """Write the log as a ROS 2 bag directory (see the module docstring)."""
    from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer
    from rosbags.rosbag2.errors import WriterError

    from pkrt.rt.runtime.logs.mcapexport import _text, cycle_times, damage

    if Path(out_dir).exists():
        raise UserError(f"{out_dir}: exists already; a ROS 2 bag is written into a new directory")
    ts = _typestore()
    JointState = ts.types[JOINT_STATE]
    Header, Time = ts.types["std_msgs/msg/Header"], ts.types["builtin_interfaces/msg/Time"]
    axes = log.axes()
    t, _ = cycle_times(log)
    ns = np.rint(t * 1e9).astype(np.int64)
    if len(ns) and ns.min() < 0:
        raise UserError(f"{log.path}: negative loop times; cannot be bag times")
    empty = np.zeros(0)
    streams = {DEFAULT_TOPIC: ("pos", "vel", "tau"), REFERENCE_TOPIC: ("ref_pos", "ref_vel", "tau_model")}
    counts = {}
    w = Writer(out_dir, version=9, storage_plugin=StoragePlugin.MCAP)
    w.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
    for k, v in log.header.items():
        w.set_custom_data(f"pkrt.{k}", _text(v))
    try:
        with w:
            for topic, names in streams.items():
                cols = [log.get(n) for n in names]
                if cols[0] is None:
                    continue
                cols = [None if c is None else (c[:, None] if c.ndim == 1 else c) for c in cols]
                conn = w.add_connection(topic, JOINT_STATE, typestore=ts, offered_qos_profiles=[_qos()])
                joint_names = axes if len(axes) == cols[0].shape[1] else [f"q{i + 1}" for i in range(cols[0].shape[1])]
                for k in range(log.n_cycles):
                    stamp = Time(sec=int(ns[k] // 1_000_000_000), nanosec=int(ns[k] % 1_000_000_000))
                    msg = JointState(header=Header(stamp=stamp, frame_id=""), name=list(joint_names),
                                     position=np.ascontiguousarray(cols[0][k], dtype=np.float64),
                                     velocity=empty if cols[1] is None else np.ascontiguousarray(cols[1][k], dtype=np.float64),
                                     effort=empty if cols[2] is None else np.ascontiguousarray(cols[2][k], dtype=np.float64))
                    w.write(conn, int(ns[k]), ts.serialize_cdr(msg, JOINT_STATE))
                counts[topic] = log.n_cycles
    except WriterError as e:
        raise UserError(f"{out_dir}: cannot write the bag: {e}") from None
    return {"path": str(out_dir), "topics": counts, "messages": sum(counts.values()), "damage": damage(log)}


# -- import ----------------------------------------------------------------------------------
@dataclass
class JointSamples:
    """Joint states of the machine's actuators from a bag: ``t`` (s from the first message),
    ``pos`` (n, s); ``vel`` and ``effort`` (n, s) or None when not every message has them."""
    path: str
    topic: str
    joints: list[str]
    ignored: list[str]
    t: np.ndarray
    pos: np.ndarray
    vel: np.ndarray | None
    effort: np.ndarray | None
    stamps: str  # "header" or "bag receive time"

    def description(self) -> dict:
        dt = np.diff(self.t)
        return {"kind": "ros2-bag", "path": self.path, "topic": self.topic, "joints": self.joints,
                "ignored_joints": self.ignored, "messages": len(self.t), "stamps": self.stamps,
                "recorded_rate_hz": float(1.0 / np.median(dt)) if len(dt) else None}


def read_joint_states(path: str, joints: list[str], topic: str = DEFAULT_TOPIC) -> JointSamples:
    """The named joints' states from a bag's JointState topic (checks: module docstring)."""
    reader = _open_bag(path)
    try:
        conns = _joint_state_connections(reader, path, topic)
        rec = _Recording(path, topic, joints)
        for i, (_, recv_ns, raw) in enumerate(reader.messages(connections=conns)):
            rec.add(i, recv_ns, raw)
    finally:
        reader.close()
    if len(rec.pos) < 2:
        raise UserError(f"{path}: {topic} holds {len(rec.pos)} message(s); a trajectory needs at least 2")
    use_header = any(s != 0 for s in rec.stamps)
    t_ns = np.array(rec.stamps if use_header else rec.recv, dtype=np.int64)
    _check_times(t_ns, "header stamp" if use_header else "receive time", path, topic)
    P = np.array(rec.pos)
    bad = ~np.isfinite(P)
    if bad.any():
        k, j = np.argwhere(bad)[0]
        raise UserError(f"{path}: {topic}: non-finite position of joint {joints[j]} at message {k} "
                        f"(t = {(t_ns[k] - t_ns[0]) * 1e-9:.6f} s)")
    V = np.array(rec.vel) if all(v is not None for v in rec.vel) else None
    E = np.array(rec.eff) if all(e is not None for e in rec.eff) else None
    return JointSamples(str(path), topic, list(joints), sorted(rec.seen - set(joints)),
                        (t_ns - t_ns[0]) * 1e-9, P, V, E, "header" if use_header else "bag receive time")


def _open_bag(path: str):
    """An open ``rosbags`` reader of the bag at ``path``."""
    from rosbags.rosbag2 import Reader

    if not Path(path).exists():
        raise UserError(f"{path}: no such file or directory")
    try:
        reader = Reader(path)
        reader.open()
    except Exception as e:  # noqa: BLE001 - rosbags raises many kinds for a file that is not a bag
        raise UserError(f"{path}: not a readable ROS 2 bag ({type(e).__name__}: {e})".replace("\n", " ")) from None
    return reader


def _joint_state_connections(reader, path: str, topic: str) -> list:
    """The bag's connections of ``topic``, each of type JointState."""
    conns = [c for c in reader.connections if c.topic == topic]
    if not conns:
        have = sorted({c.topic for c in reader.connections})
        raise UserError(f"{path}: no topic '{topic}' in the bag (topics: {', '.join(have) or 'none'}); "
                        f"choose one with --topic")
    wrong = [c.msgtype for c in conns if c.msgtype != JOINT_STATE]
    if wrong:
        raise UserError(f"{path}: topic '{topic}' holds {wrong[0]}, not {JOINT_STATE}")
    return conns


class _Recording:
    """The joints' samples of a topic's messages, in the order read (``vel``, ``eff``: None
    for a message without one value per joint)."""

    def __init__(self, path: str, topic: str, joints: list[str]):
        self.path, self.topic, self.joints = path, topic, joints
        self.ts = _typestore()
        self.stamps: list[int] = []  # header stamps, ns
        self.recv: list[int] = []  # bag receive times, ns
        self.pos: list[np.ndarray] = []
        self.vel: list[np.ndarray | None] = []
        self.eff: list[np.ndarray | None] = []
        self.seen: set[str] = set()

    def add(self, i: int, recv_ns: int, raw) -> None:
        """Message ``i``, serialized (CDR)."""
        path, topic, joints = self.path, self.topic, self.joints
        try:
            m = self.ts.deserialize_cdr(raw, JOINT_STATE)
        except Exception as e:  # noqa: BLE001 - a damaged message
            raise UserError(f"{path}: {topic}: message {i} cannot be decoded ({e})") from None
        names = list(m.name)
        self.seen.update(names)
        missing = [j for j in joints if j not in names]
        if missing:
            raise UserError(f"{path}: {topic}: message {i} has no joint(s) {', '.join(missing)} "
                            f"(the machine's actuators are {', '.join(joints)}; the bag names "
                            f"{', '.join(names) or 'none'})")
        if len(m.position) != len(names):
            raise UserError(f"{path}: {topic}: message {i} names {len(names)} joints but has "
                            f"{len(m.position)} positions")
        idx = [names.index(j) for j in joints]
        self.stamps.append(int(m.header.stamp.sec) * 1_000_000_000 + int(m.header.stamp.nanosec))
        self.recv.append(int(recv_ns))
        self.pos.append(np.asarray(m.position, dtype=float)[idx])
        self.vel.append(np.asarray(m.velocity, dtype=float)[idx] if len(m.velocity) == len(names) else None)
        self.eff.append(np.asarray(m.effort, dtype=float)[idx] if len(m.effort) == len(names) else None)


def _check_times(t_ns: np.ndarray, what: str, path: str, topic: str) -> None:
    """Times (ns, ``what`` they are) strictly increasing, with no step longer than
    ``MAX_GAP_PERIODS`` median periods."""
    step = np.diff(t_ns)
    if np.any(step <= 0):
        i = int(np.argmax(step <= 0)) + 1
        verb = "repeats" if step[i - 1] == 0 else "goes backwards"
        raise UserError(f"{path}: {topic}: the {what} {verb} at message {i} "
                        f"({(t_ns[i] - t_ns[0]) * 1e-9:.6f} s after {(t_ns[i - 1] - t_ns[0]) * 1e-9:.6f} s)")
    med = float(np.median(step))
    if np.any(step > MAX_GAP_PERIODS * med):
        i = int(np.argmax(step > MAX_GAP_PERIODS * med))
        raise UserError(f"{path}: {topic}: gap of {step[i] * 1e-9:.4g} s after t = {(t_ns[i] - t_ns[0]) * 1e-9:.6f} s "
                        f"(message {i}; the median period is {med * 1e-9:.4g} s)")


def trajectory_from_bag(path: str, rate_hz: float, axes: list[str], topic: str = DEFAULT_TOPIC):
    """A ``Planned`` reference from a bag's joint positions, resampled to the loop rate exactly
    as a CSV trajectory is."""
    from pkrt.rt.core.plan import Planned, resample

    js = read_joint_states(path, axes, topic)
    P, Pd, Pdd = resample(js.t, js.pos, rate_hz, f"{path}: {topic}")
    return Planned(rate_hz, P, Pd, Pdd, js.description())


def _uniform_rate(t: np.ndarray) -> float:
    """The recorded rate (Hz) from the median period, snapped to a whole number of Hz when
    within a millionth of one."""
    r = 1.0 / float(np.median(np.diff(t)))
    return float(round(r)) if abs(r - round(r)) < 1e-6 * r else r


def log_from_bag(path: str, axes: list[str], units: list[str], topic: str = DEFAULT_TOPIC) -> Log:
    """The bag's joint states as a run log (``t``, ``pos``, ``tau`` = the recorded efforts) on a
    uniform grid at the recorded rate: positions through the trajectory resampling, efforts
    linearly interpolated (both exact at the samples when the recording is uniform)."""
    from pkrt.rt.core.plan import resample

    js = read_joint_states(path, axes, topic)
    if js.effort is None:
        raise UserError(f"{path}: {topic}: not every message has an effort per joint; the offline "
                        f"check compares the model's torques with the recorded efforts")
    bad = ~np.isfinite(js.effort)
    if bad.any():
        k, j = np.argwhere(bad)[0]
        raise UserError(f"{path}: {topic}: non-finite effort of joint {axes[j]} at message {k} (t = {js.t[k]:.6f} s)")
    rate = _uniform_rate(js.t)
    P, _, _ = resample(js.t, js.pos, rate, f"{path}: {topic}")
    tt = np.arange(len(P)) / rate
    E = np.column_stack([np.interp(tt, js.t, js.effort[:, i]) for i in range(len(axes))])
    force = "N" if units and units[0] == "m" else "N m"
    header = {"format": "ros2-bag", "rate_hz": rate, "axes": list(axes), "units": list(units),
              "trajectory": js.description()}
    return Log(path=str(path), header=header, channels={"t": tt, "pos": P, "tau": E},
               units={"t": "s", "pos": units[0] if units else "", "tau": force},
               widths={"t": 1, "pos": len(axes), "tau": len(axes)}, cycles=np.arange(len(P)),
               summary={"source": "ros2 bag"})


def offline_bag(path: str, *, machine: str | None, tree_path: str | None, window: int | None,
                topic: str = DEFAULT_TOPIC) -> dict:
    """``replay --offline`` for a bag: the model's torques at the recorded states against the
    recorded efforts (``pkrt.rt.runtime.logs.replay.offline``), on the machine given (default the
    Orthoglide, as ``pkrt run``)."""
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.logs.replay import offline
    from pkrt.rt.runtime.machine.runsetup import tree_axes
    from pkrt.rt.core.treefile import load_tree

    config = load_machine(machine or "orthoglide")
    tree_path = tree_path or config.tree
    axes, units = tree_axes(load_tree(tree_path))
    log = log_from_bag(path, axes, units, topic)
    r = offline(log, tree_path=tree_path, window=window)
    r["bag"] = log.header["trajectory"]
    r["machine"] = config.path
    return r
