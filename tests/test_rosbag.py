"""ROS 2 bags: ``log export --ros2`` read back with ``rosbags``' reader; bags written with
``rosbags`` as ``ros2 bag record`` would, run as trajectories and checked offline against the
same data given as CSV or as a pkrt log."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from ruamel.yaml import YAML

from pkrt.rt.cli import main
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.record.logfile import LogWriter, read_log
from pkrt.rt.runtime.logs.replay import model_torques
from pkrt.rt.core.treefile import load_tree
from tests.test_logfile import write_demo_log

TS = get_typestore(Stores.ROS2_JAZZY)
JS = "sensor_msgs/msg/JointState"
AXES = ["q1", "q2", "q3"]
EPOCH_NS = 1_763_900_000 * 10**9  # a recording's header stamps are wall-clock times
NEVER = QosTime(9223372036, 854775807)
QOS = Qos(QosHistory.UNKNOWN, 0, QosReliability.RELIABLE, QosDurability.VOLATILE, NEVER, NEVER,
          QosLiveliness.AUTOMATIC, NEVER, False)


def run_json(capsys, *argv) -> dict:
    code = main([*map(str, argv), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def fails(capsys, *argv) -> str:
    assert main(list(map(str, argv))) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# -- export ----------------------------------------------------------------------------------
def test_export_ros2_read_back_with_rosbags(tmp_path, capsys):
    p = tmp_path / "demo.pkl"
    n = 800
    write_demo_log(p, n=n)
    log = read_log(p)
    out = tmp_path / "bag"
    res = run_json(capsys, "log", "export", p, "--ros2", out)
    assert res["ros2"]["messages"] == 2 * n
    meta = YAML(typ="safe").load((out / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert meta["version"] == 9 and meta["storage_identifier"] == "mcap" and meta["message_count"] == 2 * n
    topics = {t["topic_metadata"]["name"]: t for t in meta["topics_with_message_count"]}
    assert set(topics) == {"/joint_states", "/pkrt/reference/joint_states"}
    for t in topics.values():
        assert t["message_count"] == n and t["topic_metadata"]["type"] == JS
        assert t["topic_metadata"]["serialization_format"] == "cdr"
        assert t["topic_metadata"]["type_description_hash"].startswith("RIHS01_")
        assert t["topic_metadata"]["offered_qos_profiles"][0]["reliability"] == "reliable"
    assert meta["duration"]["nanoseconds"] == round(log.get("t")[-1] * 1e9)
    assert json.loads(meta["custom_data"]["pkrt.rate_hz"]) == 1000.0
    assert meta["custom_data"]["pkrt.model_hash"] == log.header["model_hash"]
    with Reader(out) as r:  # what `ros2 bag info` shows
        assert r.message_count == 2 * n and r.start_time == 0
        assert r.duration == round(log.get("t")[-1] * 1e9) + 1  # rosbag2: end - start + 1
        assert {k: (v.msgtype, v.msgcount) for k, v in r.topics.items()} == {
            "/joint_states": (JS, n), "/pkrt/reference/joint_states": (JS, n)}
        got: dict[str, list] = {}
        for conn, stamp, raw in r.messages():
            m = TS.deserialize_cdr(raw, conn.msgtype)
            assert m.header.stamp.sec * 10**9 + m.header.stamp.nanosec == stamp
            assert list(m.name) == AXES
            got.setdefault(conn.topic, []).append((stamp, m.position, m.velocity, m.effort))
    for topic, names in (("/joint_states", ("pos", "vel", "tau")),
                         ("/pkrt/reference/joint_states", ("ref_pos", "ref_vel", "tau_model"))):
        rows = got[topic]
        assert [s for s, *_ in rows] == np.rint(log.get("t") * 1e9).astype(np.int64).tolist()
        for i, name in enumerate(names):
            assert np.allclose(np.array([r[i + 1] for r in rows]), log.get(name), rtol=1e-15, atol=0)


def test_export_ros2_refuses_an_existing_directory(tmp_path, capsys):
    p = tmp_path / "demo.pkl"
    write_demo_log(p, n=300)
    (tmp_path / "there").mkdir()
    assert "exists already" in fails(capsys, "log", "export", p, "--ros2", tmp_path / "there")


# -- import ----------------------------------------------------------------------------------
def write_bag(path, t_ns, pos, vel=None, eff=None, names=AXES, topic="/joint_states", recv_ns=None,
              extra=True):
    """A bag as ``ros2 bag record`` writes it (rosbag2 v9, MCAP storage): JointState with the
    joints in ``names`` order plus, with ``extra``, two joints that are not the machine's."""
    JointState = TS.types[JS]
    Header, Time = TS.types["std_msgs/msg/Header"], TS.types["builtin_interfaces/msg/Time"]
    all_names = (["gripper"] + list(names) + ["camera_pan"]) if extra else list(names)
    order = [all_names.index(j) for j in reversed(all_names)]  # recorded in another order
    all_names = [all_names[i] for i in order]
    recv_ns = t_ns + 300_000 if recv_ns is None else recv_ns

    def wide(a, k):
        if a is None:
            return np.zeros(0)
        row = np.r_[0.5, a[k], -0.25] if extra else a[k]
        return np.ascontiguousarray(row[order], dtype=np.float64)

    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conn = w.add_connection(topic, JS, typestore=TS, offered_qos_profiles=[QOS])
        other = w.add_connection("/rosout_like", "std_msgs/msg/String", typestore=TS)
        for k in range(len(t_ns)):
            st = int(t_ns[k])
            msg = JointState(header=Header(stamp=Time(sec=st // 10**9, nanosec=st % 10**9), frame_id="base"),
                             name=all_names, position=wide(pos, k), velocity=wide(vel, k), effort=wide(eff, k))
            w.write(conn, int(recv_ns[k]), TS.serialize_cdr(msg, JS))
            if k % 50 == 0:
                w.write(other, int(recv_ns[k]), TS.serialize_cdr(TS.types["std_msgs/msg/String"](data="x"),
                                                                "std_msgs/msg/String"))


RATE, SECONDS = 200.0, 10.0
K = np.array([3.0, 4.0, 5.0])  # half-periods over the 10 s: every joint starts and ends at rest
A = np.array([0.03, -0.02, 0.025])


def motion(t):
    """q = -0.1 + A sin^2(pi K t / 10), with exact first and second derivatives (m, m/s, m/s^2)."""
    w = np.pi * K / SECONDS
    ph = w * t[:, None]
    return (-0.1 + A * np.sin(ph) ** 2, A * w * np.sin(2 * ph), 2 * A * w * w * np.cos(2 * ph))


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """10 s at 200 Hz on /joint_states: positions, velocities and efforts equal to the model's
    torques at the exact states; the same positions as a trajectory CSV."""
    d = tmp_path_factory.mktemp("bag")
    n = int(RATE * SECONDS) + 1
    t_ns = EPOCH_NS + np.arange(n, dtype=np.int64) * int(1e9 / RATE)
    t = (t_ns - t_ns[0]) * 1e-9
    q, qd, qdd = motion(t)
    tree = load_tree(load_machine("orthoglide").tree)
    tau, status = model_torques(tree, np.ascontiguousarray(q), qd, qdd)
    assert np.all(status == 0)
    write_bag(d / "rec", t_ns, q, qd, tau)
    with open(d / "rec.csv", "w") as f:
        f.write("t,q1,q2,q3\n")
        for k in range(n):
            f.write(",".join(repr(float(x)) for x in (t[k], *q[k])) + "\n")
    return d, t, q, tau


def test_run_traj_bag_is_the_csv_trajectory(recording, tmp_path, capsys):
    d, t, q, _ = recording
    a = run_json(capsys, "run", "--lockstep", "--traj", d / "rec", "--log", tmp_path / "bag.pkl")
    b = run_json(capsys, "run", "--lockstep", "--traj", d / "rec.csv", "--log", tmp_path / "csv.pkl")
    assert a["fault"] is None and b["fault"] is None and a["cycles"] == b["cycles"] == 10001
    la, lb = read_log(tmp_path / "bag.pkl"), read_log(tmp_path / "csv.pkl")
    for name in ("ref_pos", "ref_vel", "ref_acc", "pos", "tau"):
        assert np.allclose(la.get(name), lb.get(name), rtol=0, atol=1e-9), name
    assert np.allclose(la.get("ref_pos")[::5], q, atol=1e-12)  # at the samples: the recorded positions
    desc = la.header["trajectory"]
    assert desc["kind"] == "ros2-bag" and desc["joints"] == AXES and desc["ignored_joints"] == ["camera_pan", "gripper"]
    assert desc["stamps"] == "header" and desc["recorded_rate_hz"] == pytest.approx(200.0)
    # a bare .mcap file is a bag too
    mcap = next((d / "rec").glob("*.mcap"))
    c = run_json(capsys, "run", "--lockstep", "--traj", mcap, "--duration", "1", "--no-log")
    assert c["cycles"] == 1001 and c["fault"] is None


def test_replay_offline_bag_against_the_same_samples_as_a_log(recording, tmp_path, capsys):
    d, t, q, tau = recording
    r = run_json(capsys, "replay", d / "rec", "--offline", "--machine", "orthoglide")
    # the efforts are the model's torques at the exact states: the residual is the derivative
    # filter's error, far below the torques
    for i, ax in enumerate(AXES):
        v = r["residual"][ax]
        assert v["rms"] < 0.01 * np.sqrt(np.mean(tau[:, i] ** 2)), (ax, v)
    assert r["filter"]["rate_hz"] == 200.0 and r["bag"]["messages"] == len(t)
    # the same samples written as a pkrt log: the same check, the same figures
    p = tmp_path / "same.pkl"
    w = LogWriter(p, {"rate_hz": RATE, "axes": AXES, "units": ["m"] * 3},
                  [("t", 1, "s"), ("pos", 3, "m"), ("tau", 3, "N")], 64, wait_when_full=True)
    for k in range(len(t)):
        w.views["t"][0], w.views["pos"][...], w.views["tau"][...] = t[k], q[k], tau[k]
        w.commit()
    w.close({})
    s = run_json(capsys, "replay", p, "--offline", "--machine", "orthoglide")
    assert r["cycles_used"] == s["cycles_used"]
    for ax in AXES:
        for key in ("rms", "max", "mean"):
            assert r["residual"][ax][key] == pytest.approx(s["residual"][ax][key], rel=1e-6, abs=1e-9)
    # recorded efforts 10 % above the model's: the check sees it
    d2 = tmp_path / "scaled"
    t_ns = EPOCH_NS + np.round(t * 1e9).astype(np.int64)
    write_bag(d2, t_ns, q, None, 1.1 * tau)
    r2 = run_json(capsys, "replay", d2, "--offline")
    for i, ax in enumerate(AXES):
        want = 0.1 * np.sqrt(np.mean(tau[:, i] ** 2))
        assert r2["residual"][ax]["rms"] == pytest.approx(want, rel=0.1)


def bad_bag(tmp_path, name, **kw):
    n = 60
    t_ns = EPOCH_NS + np.arange(n, dtype=np.int64) * 5_000_000
    q, qd, _ = motion((t_ns - t_ns[0]) * 1e-9)
    args = {"t_ns": t_ns, "pos": q, "vel": qd, "eff": np.ones_like(q)}
    args.update(kw.pop("edit", lambda a: a)(args) or {})
    write_bag(tmp_path / name, args["t_ns"], args["pos"], args["vel"], args["eff"], recv_ns=t_ns + 300_000, **kw)
    return tmp_path / name


def test_bad_bags_are_one_line_errors(tmp_path, capsys):
    def backwards(a):
        a["t_ns"] = a["t_ns"].copy()
        a["t_ns"][20] = a["t_ns"][18]  # the publisher's clock stepped back; received in order

    def nan(a):
        a["pos"] = a["pos"].copy()
        a["pos"][33, 1] = np.nan

    def gap(a):
        a["t_ns"] = a["t_ns"].copy()
        a["t_ns"][40:] += 200_000_000

    def nan_effort(a):
        a["eff"] = a["eff"].copy()
        a["eff"][12, 2] = np.inf

    cases = [
        (bad_bag(tmp_path, "missing", names=["q1", "q2", "wrist"]), "has no joint(s) q3"),
        (bad_bag(tmp_path, "backwards", edit=backwards), "header stamp goes backwards at message 20"),
        (bad_bag(tmp_path, "nan", edit=nan), "non-finite position of joint q2 at message 33"),
        (bad_bag(tmp_path, "gap", edit=gap), "gap of 0.205 s"),
        (bad_bag(tmp_path, "topic", topic="/arm/joint_states"), "no topic '/joint_states'"),
    ]
    for path, words in cases:
        assert words in fails(capsys, "run", "--lockstep", "--traj", path, "--no-log"), path
        assert words in fails(capsys, "replay", path, "--offline"), path
    assert "non-finite effort of joint q3 at message 12" in fails(
        capsys, "replay", bad_bag(tmp_path, "nan_effort", edit=nan_effort), "--offline")
    assert "not every message has an effort" in fails(
        capsys, "replay", bad_bag(tmp_path, "no_effort", edit=lambda a: {"eff": None}), "--offline")
    # --topic picks another topic
    r = run_json(capsys, "run", "--lockstep", "--traj", tmp_path / "topic", "--topic", "/arm/joint_states", "--no-log")
    assert r["fault"] is None
    # not a bag at all
    junk = tmp_path / "junk.mcap"
    junk.write_bytes(b"\x89MCAP0\r\n" + b"\x00" * 64)
    assert "not a readable ROS 2 bag" in fails(capsys, "run", "--lockstep", "--traj", junk, "--no-log")
    (tmp_path / "emptydir").mkdir()
    assert "not a readable ROS 2 bag" in fails(capsys, "replay", tmp_path / "emptydir", "--offline")
    assert "no such file" in fails(capsys, "run", "--lockstep", "--traj", tmp_path / "nothere.mcap", "--no-log")
    # options that do not apply
    assert "--offline only" in fails(capsys, "replay", tmp_path / "topic")
    assert "--topic applies" in fails(capsys, "run", "--lockstep", "--traj", "x.csv", "--topic", "/a")


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_joint_state_reader_accepts_good_bags_and_names_the_first_defect(data):
    """Random recordings: joints in any order with extras, some steps repeated, backwards or
    long, a NaN, a joint left out. The reader returns the machine's joints in its order, or one
    line naming the first defect in the order of the module docstring."""
    from pkrt.rt.core.errors import UserError
    from pkrt.rt.runtime.logs.rosbag import read_joint_states

    n = data.draw(st.integers(2, 12))
    steps = data.draw(st.lists(st.sampled_from([5_000_000] * 6 + [0, -1_000_000, 60_000_000]), min_size=n - 1,
                               max_size=n - 1))
    t_ns = EPOCH_NS + np.r_[0, np.cumsum(steps)].astype(np.int64)
    pos = np.array(data.draw(st.lists(st.lists(st.floats(-0.2, 0.05), min_size=3, max_size=3), min_size=n,
                                      max_size=n)))
    if data.draw(st.booleans()):
        pos[data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, 2))] = np.nan
    names = AXES if data.draw(st.booleans()) else ["q1", "q2", "q9"]
    with tempfile.TemporaryDirectory() as d:
        write_bag(Path(d) / "b", t_ns, pos, names=names, recv_ns=EPOCH_NS + np.arange(n) * 5_000_000)
        step = np.diff(t_ns)
        med = np.median(step)
        if names != AXES:
            want = "has no joint(s) q3"
        elif np.any(step <= 0):
            want = "repeats" if step[np.argmax(step <= 0)] == 0 else "goes backwards"
        elif np.any(step > 5 * med):
            want = "gap of"
        elif not np.all(np.isfinite(pos)):
            want = "non-finite position"
        else:
            want = None
        if want is None:
            js = read_joint_states(str(Path(d) / "b"), AXES)
            assert np.array_equal(js.pos, pos) and np.allclose(js.t, (t_ns - t_ns[0]) * 1e-9, rtol=0, atol=1e-12)
            assert js.ignored == ["camera_pan", "gripper"]
        else:
            with pytest.raises(UserError) as e:
                read_joint_states(str(Path(d) / "b"), AXES)
            assert want in str(e.value) and "\n" not in str(e.value)
