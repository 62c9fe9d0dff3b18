"""``pkrt log export --mcap``: read back with the ``mcap`` package's reader (not pkrt's),
schemas checked with ``jsonschema``."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from mcap.reader import make_reader

from pkrt.rt.cli import main
from pkrt.rt.runtime.record.logfile import LogWriter, read_log
from tests.test_logfile import CHANNELS, HEADER, write_demo_log

N = 1500
FAULT_CYCLE = 700
TOL = 1e-12  # relative; JSON carries the shortest repr of a float64, so values come back exactly


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcap")
    p = d / "demo.pkl"
    write_demo_log(p, n=N, events={FAULT_CYCLE: ("fault", "following error on q2"),
                                          10: ("state", "enabled")})
    return p, d


def export(capsys, log, out, *extra) -> dict:
    assert main(["log", "export", str(log), "--mcap", str(out), *map(str, extra), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def read_mcap(path):
    """Every message decoded, per topic in file order, with schemas and the summary."""
    with open(path, "rb") as f:
        r = make_reader(f)
        summary = r.get_summary()
        msgs: dict[str, list] = {}
        schemas: dict[str, dict] = {}
        times: dict[str, list] = {}
        for schema, channel, m in r.iter_messages(log_time_order=False):
            assert schema.encoding == "jsonschema" and channel.message_encoding == "json"
            schemas[channel.topic] = json.loads(schema.data)
            msgs.setdefault(channel.topic, []).append(json.loads(m.data))
            times.setdefault(channel.topic, []).append((m.log_time, m.publish_time))
        meta = {m.name: dict(m.metadata) for m in r.iter_metadata()}
    return summary, msgs, schemas, times, meta


def axes_array(msgs: list, field: str, axes=("q1", "q2", "q3")) -> np.ndarray:
    return np.array([[np.nan if m[field][a] is None else m[field][a] for a in axes] for m in msgs])


def test_every_cycle_every_value(demo, tmp_path, capsys):
    p, _ = demo
    out = tmp_path / "demo.mcap"
    res = export(capsys, p, out)
    log = read_log(p)
    summary, msgs, schemas, times, meta = read_mcap(out)
    expect = {"/pkrt/reference", "/pkrt/measured", "/pkrt/torque", "/pkrt/tracking_error", "/pkrt/safety",
              "/pkrt/timing", "/pkrt/events"}
    assert set(msgs) == expect
    # summary section: statistics per channel, chunks compressed with zstd
    assert summary.statistics.message_count == 6 * N + 2 == res["mcap"]["messages"]
    by_topic = {summary.channels[cid].topic: n for cid, n in summary.statistics.channel_message_counts.items()}
    assert all(by_topic[t] == N for t in expect - {"/pkrt/events"}) and by_topic["/pkrt/events"] == 2
    assert summary.chunk_indexes and all(c.compression == "zstd" for c in summary.chunk_indexes)
    # log time = the cycle's loop time
    t = log.get("t")
    for topic in expect - {"/pkrt/events"}:
        lt = np.array(times[topic])
        assert np.array_equal(lt[:, 0], np.rint(t * 1e9).astype(np.int64)) and np.array_equal(lt[:, 0], lt[:, 1])
        assert [m["cycle"] for m in msgs[topic]] == list(range(N))
        assert np.allclose([m["t"] for m in msgs[topic]], t, rtol=TOL, atol=0)

    def same(a, b):
        assert a.shape == b.shape and np.allclose(a, b, rtol=TOL, atol=1e-300, equal_nan=True)

    ref, meas, tq = msgs["/pkrt/reference"], msgs["/pkrt/measured"], msgs["/pkrt/torque"]
    same(axes_array(ref, "position"), log.get("ref_pos"))
    same(axes_array(ref, "velocity"), log.get("ref_vel"))
    same(axes_array(ref, "acceleration"), log.get("ref_acc"))
    same(axes_array(meas, "position"), log.get("pos"))
    same(axes_array(meas, "velocity"), log.get("vel"))
    same(axes_array(tq, "command"), log.get("tau"))
    same(axes_array(tq, "model"), log.get("tau_model"))
    err = msgs["/pkrt/tracking_error"]
    same(axes_array(err, "position"), log.get("ref_pos") - log.get("pos"))
    same(axes_array(err, "velocity"), log.get("ref_vel") - log.get("vel"))
    tm = msgs["/pkrt/timing"]
    same(np.array([m["wake_us"] for m in tm]), log.get("wake_us"))
    same(np.array([m["compute_us"] for m in tm]), log.get("compute_us"))
    sf = msgs["/pkrt/safety"]
    flags = log.get("flags").astype(int)
    assert [m["flags"] for m in sf] == flags.tolist()
    assert [m["saturated"] for m in sf] == (flags & 1).astype(bool).tolist()
    assert [m["overrun"] for m in sf] == (flags & 4).astype(bool).tolist()
    assert [m["fault"] for m in sf] == [k >= FAULT_CYCLE for k in range(N)]
    ev = msgs["/pkrt/events"]
    assert [(e["cycle"], e["kind"]) for e in ev] == [(10, "state"), (FAULT_CYCLE, "fault")]
    assert [lt for lt, _ in times["/pkrt/events"]] == [10_000_000, FAULT_CYCLE * 1_000_000]
    # schemas: valid JSON Schema, and every message valid against its channel's
    for topic, schema in schemas.items():
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        v = cls(schema)
        for m in msgs[topic]:
            v.validate(m)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**ref[0], "position": {"q1": "x", "q2": 0, "q3": 0}}, schemas["/pkrt/reference"])
    # the run's header as metadata
    run = meta["pkrt.run"]
    assert json.loads(run["rate_hz"]) == 1000.0 and run["model_hash"] == HEADER["model_hash"]
    assert json.loads(run["controller"])["kp"] == pytest.approx([2526.6] * 3)
    assert json.loads(run["machine"]) == HEADER["machine"] and json.loads(run["axes"]) == ["q1", "q2", "q3"]
    assert meta["pkrt.log"]["complete"] == "true" and json.loads(meta["pkrt.summary"]["cycles"]) == N
    assert res["note"] is None


def test_damaged_log_exports_up_to_its_last_good_record(demo, tmp_path, capsys):
    p, _ = demo
    raw = p.read_bytes()
    cut = tmp_path / "cut.pkl"
    cut.write_bytes(raw[: int(len(raw) * 0.6)])
    log = read_log(cut)
    assert log.truncated and 0 < log.n_cycles < N
    assert main(["log", "export", str(cut), "--mcap", str(tmp_path / "cut.mcap")]) == 0
    out = capsys.readouterr().out
    assert f"exported {log.n_cycles} cycles up to the last good record" in out and "cut off" in out
    summary, msgs, _, _, meta = read_mcap(tmp_path / "cut.mcap")
    assert all(len(msgs[t]) == log.n_cycles for t in msgs if t != "/pkrt/events")
    assert np.allclose(axes_array(msgs["/pkrt/measured"], "position"), log.get("pos"), rtol=TOL)
    assert meta["pkrt.log"]["truncated"] == "true" and "pkrt.summary" not in meta
    # a damaged block in the middle: its cycles are missing, the rest is there
    bad = bytearray(raw)
    bad[len(raw) // 2] ^= 0xFF
    (tmp_path / "bad.pkl").write_bytes(bytes(bad))
    log = read_log(tmp_path / "bad.pkl")
    assert log.bad_blocks >= 1
    res = export(capsys, tmp_path / "bad.pkl", tmp_path / "bad.mcap")
    assert "damaged block(s) skipped" in res["note"] and res["mcap"]["damage"]["bad_blocks"] == log.bad_blocks
    _, msgs, _, _, _ = read_mcap(tmp_path / "bad.mcap")
    assert [m["cycle"] for m in msgs["/pkrt/measured"]] == [int(round(x * 1000)) for x in log.get("t")]


def test_channels_follow_the_log_tool_and_unknown_channels_and_nan(tmp_path, capsys):
    chans = [("t", 1, "s"), ("pos", 3, "m"), ("tool_pos", 3, "m"), ("temperature", 1, "degC")]
    p = tmp_path / "tool.pkl"
    w = LogWriter(p, {"rate_hz": 500.0, "axes": ["q1", "q2", "q3"]}, chans, 16)
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(40, 8))
    rows[:, 0] = np.arange(40) / 500.0
    rows[7, 2] = np.nan
    for r in rows:
        w.row[:] = r
        w.commit()
    w.close({})
    export(capsys, p, tmp_path / "tool.mcap")
    _, msgs, schemas, _, _ = read_mcap(tmp_path / "tool.mcap")
    assert set(msgs) == {"/pkrt/measured", "/pkrt/tool", "/pkrt/temperature"}
    tool = np.array([[m["position"][k] for k in "xyz"] for m in msgs["/pkrt/tool"]])
    assert np.allclose(tool, rows[:, 4:7], rtol=TOL)
    assert np.allclose([m["temperature"] for m in msgs["/pkrt/temperature"]], rows[:, 7], rtol=TOL)
    assert msgs["/pkrt/measured"][7]["position"]["q2"] is None  # NaN: JSON null, allowed by the schema
    jsonschema.validate(msgs["/pkrt/measured"][7], schemas["/pkrt/measured"])


def test_errors_are_one_line(demo, tmp_path, capsys):
    p, _ = demo
    assert main(["log", "export", str(p), "--mcap", str(tmp_path / "no" / "x.mcap")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error:") and err.count("\n") == 1 and "Traceback" not in err
    (tmp_path / "junk.pkl").write_bytes(b"\x00" * 100)
    assert main(["log", "export", str(tmp_path / "junk.pkl"), "--mcap", str(tmp_path / "j.mcap")]) == 2
    assert "not a pkrt log" in capsys.readouterr().err
