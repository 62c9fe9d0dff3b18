"""pkrt log info / export / plot on logs written through LogWriter."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from PIL import Image

from pkrt.rt.cli import main
from pkrt.rt.core.plan import state_columns
from pkrt.rt.runtime.machine.trajectory import load_trajectory_csv
from pkrt.rt.runtime.logs.logstats import plot_log
from pkrt.rt.runtime.record.logfile import read_log
from tests.test_logfile import AXES, CHANNELS, write_demo_log


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    p = tmp_path_factory.mktemp("logs") / "demo.pkl"
    data = write_demo_log(p, n=2000, events={700: ("fault", "following error on q2: 0.012 m > 0.01 m")})
    return p, data


def run_json(capsys, *argv) -> dict:
    assert main([*map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info_json(demo, capsys):
    p, d = demo
    s = run_json(capsys, "log", "info", p)
    assert s["cycles"] == 2000 and s["complete"] and not s["truncated"]
    assert s["duration_s"] == pytest.approx(1.999)
    assert s["rate_hz"]["nominal"] == 1000.0
    t1, t0 = d["t"][-1] + 1e-6 * d["wake_us"][-1], d["t"][0] + 1e-6 * d["wake_us"][0]
    assert s["rate_hz"]["measured"] == pytest.approx(1999 / (t1 - t0), rel=1e-12)
    assert s["machine"] == "models/machines/orthoglide-sim.toml" and s["axes"] == AXES
    e = d["ref_pos"] - d["pos"]
    for i, ax in enumerate(AXES):
        assert s["tracking"][ax]["rms"] == pytest.approx(np.sqrt(np.mean(e[:, i] ** 2)), rel=1e-12)
        assert s["tracking"][ax]["max"] == pytest.approx(np.abs(e[:, i]).max(), rel=1e-12)
        assert s["tracking"][ax]["unit"] == "m"
    assert s["timing_us"]["wake_us"]["p99"] == pytest.approx(np.percentile(d["wake_us"], 99))
    assert s["timing_us"]["compute_us"]["max"] == pytest.approx(d["compute_us"].max())
    assert s["flags"] == {"saturated": 10, "clamped_or_out_of_domain": 0, "overrun": 1, "stale_feedback": 0,
                          "non_finite_torque": 0}
    assert len(s["faults"]) == 1 and s["faults"][0]["cycle"] == 700
    assert s["summary"]["cycles"] == 2000


def test_info_text_and_truncated(demo, tmp_path, capsys):
    p, _ = demo
    cut = tmp_path / "cut.pkl"
    raw = p.read_bytes()
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    assert main(["log", "info", str(cut)]) == 0
    out = capsys.readouterr().out
    assert "TRUNCATED" in out and "tracking error" in out and "p99" in out
    s = run_json(capsys, "log", "info", cut)
    assert s["truncated"] and s["summary"] is None and s["cycles"] % 256 == 0


def test_info_degrades_without_optional_channels(tmp_path, capsys):
    from pkrt.rt.runtime.record.logfile import LogWriter

    p = tmp_path / "min.pkl"
    w = LogWriter(p, {}, [("t", 1, "s"), ("pos", 2, "rad")])
    for i in range(10):
        w.row[:] = (i * 0.01, i, -i)
        w.commit()
    w.close({})
    s = run_json(capsys, "log", "info", p)
    assert s["tracking"] == {} and s["timing_us"] == {} and s["flags"] == {}
    assert s["rate_hz"] == {"nominal": None, "measured": pytest.approx(100.0)}
    assert main(["log", "info", str(p)]) == 0


def test_export_csv_columns_and_values(demo, tmp_path, capsys):
    p, d = demo
    out = tmp_path / "run.csv"
    r = run_json(capsys, "log", "export", p, "--csv", out)
    with open(out) as f:
        rows = list(csv.reader(f))
    head = rows[0]
    assert head[:5] == ["cycle", "t [s]", "ref_pos_q1 [m]", "ref_pos_q2 [m]", "ref_pos_q3 [m]"]
    assert "tau_model_q3 [N]" in head and "wake_us [us]" in head and head[-1] == "flags"
    assert r["csv"]["columns"] == head and len(rows) == 2001
    body = np.array(rows[1:], dtype=float)
    np.testing.assert_array_equal(body[:, 0], np.arange(2000))
    np.testing.assert_array_equal(body[:, head.index("vel_q2 [m/s]")], d["vel"][:, 1])  # exact
    assert rows[101][-1] == "1"  # flags are integers


def test_export_traj_round_trip(demo, tmp_path, capsys):
    p, d = demo
    ref, meas = tmp_path / "ref.csv", tmp_path / "meas.csv"
    assert main(["log", "export", str(p), "--traj", str(ref)]) == 0
    assert main(["log", "export", str(p), "--traj", str(meas), "--measured"]) == 0
    capsys.readouterr()
    # the reference with its logged velocities and accelerations; the measured positions alone
    for path, head, keys in ((ref, state_columns(AXES), ("ref_pos", "ref_vel", "ref_acc")), (meas, AXES, ("pos",))):
        with open(path) as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["t"] + head
        a = np.array(rows[1:], dtype=float)
        np.testing.assert_array_equal(a[:, 0], d["t"] - d["t"][0])
        np.testing.assert_array_equal(a[:, 1:], np.hstack([d[k] for k in keys]))


def test_export_traj_loads_as_runtime_trajectory(demo, tmp_path):
    p, d = demo
    out = tmp_path / "ref.csv"
    assert main(["log", "export", str(p), "--traj", str(out)]) == 0
    tr = load_trajectory_csv(str(out), 1000.0, AXES)  # the logged reference at 1 kHz: read back exactly
    assert tr.n == 2000
    for got, key in ((tr.pos, "ref_pos"), (tr.vel, "ref_vel"), (tr.acc, "ref_acc")):
        np.testing.assert_allclose(got, d[key], rtol=0, atol=1e-9 * max(1.0, np.abs(d[key]).max()))


def test_export_errors(demo, tmp_path, capsys):
    p, _ = demo
    assert main(["log", "export", str(p)]) == 2
    assert "give --csv OUT and/or --traj OUT" in capsys.readouterr().err
    bad = tmp_path / "bad.pkl"
    bad.write_text("t,q1\n0,0\n")
    assert main(["log", "export", str(bad), "--csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error:") and "this is a CSV file, expected a pkrt run log" in err and "Traceback" not in err
    assert main(["log", "export", str(p), "--csv", str(tmp_path / "no" / "dir.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_plot_png_size(demo, tmp_path, capsys):
    p, _ = demo
    out = tmp_path / "run.png"
    r = run_json(capsys, "log", "plot", p, "-o", out)
    assert r["png"] == str(out)
    with Image.open(out) as im:
        im.verify()
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == (1600, 1000)
        px = np.asarray(im.convert("L"), dtype=float)
    assert px.std() > 10  # not a blank canvas


def test_plot_log_api_and_minimal_log(tmp_path):
    from pkrt.rt.runtime.record.logfile import LogWriter

    p = tmp_path / "min.pkl"
    w = LogWriter(p, {}, [("t", 1, "s"), ("tau", 1, "N m")])
    for i in range(50):
        w.row[:] = (i * 1e-3, np.sin(i))
        w.commit()
    w.close({})
    out = plot_log(read_log(p), tmp_path / "m.png")
    with Image.open(out) as im:
        assert im.size == (1600, 1000)


def test_plot_refuses_empty_log(tmp_path, capsys):
    from pkrt.rt.runtime.record.logfile import LogWriter

    p = tmp_path / "e.pkl"
    LogWriter(p, {}, CHANNELS).close({})
    assert main(["log", "plot", str(p), "-o", str(tmp_path / "e.png")]) == 2
    assert "nothing to plot" in capsys.readouterr().err


def test_nan_readings_are_left_out_and_counted(tmp_path, capsys):
    from pkrt.rt.runtime.record.logfile import LogWriter

    p = tmp_path / "nan.pkl"
    w = LogWriter(p, {"axes": ["a"], "rate_hz": 100.0},
                  [("t", 1, "s"), ("ref_pos", 1, "rad"), ("pos", 1, "rad"), ("wake_us", 1, "us")])
    for i in range(20):
        w.row[:] = (i * 0.01, 0.1, 0.1 - (0.01 if i < 15 else np.nan), np.nan if i == 3 else 5.0)
        w.commit()
    w.event(15, "fault", "feedback is NaN on axis a")
    w.close({})
    s = run_json(capsys, "log", "info", p)
    assert s["tracking"]["a"]["non_finite"] == 5
    assert s["tracking"]["a"]["rms"] == pytest.approx(0.01) and s["timing_us"]["wake_us"]["max"] == 5.0
    assert main(["log", "info", str(p)]) == 0
    assert "5 non-finite samples left out" in capsys.readouterr().out
    assert main(["log", "plot", str(p), "-o", str(tmp_path / "nan.png")]) == 0


def test_events_map_to_rows_by_time_after_skipped_periods(tmp_path):
    """A real-time loop that overran skips periods: rows count commits, events carry the
    loop's cycle index; rows are found by t = cycle / rate."""
    from pkrt.rt.runtime.record.logfile import LogWriter

    p = tmp_path / "skip.pkl"
    w = LogWriter(p, {"rate_hz": 1000.0}, [("t", 1, "s")])
    ks = [0, 1, 2, 5, 6, 7]  # periods 3 and 4 skipped
    for k in ks:
        w.row[0] = k / 1000.0
        w.commit()
    w.close({})
    log = read_log(p)
    assert [log.row_of_cycle(k) for k in (0, 2, 3, 5, 7)] == [0, 2, 3, 3, 5]
    from pkrt.rt.runtime.logs.logstats import measured_rate

    assert measured_rate(log) == pytest.approx(5 / 0.007)  # below the nominal 1 kHz


def test_demo_run_writes_its_plot(tmp_path, capsys):
    """`pkrt run` (the Orthoglide demo, lockstep) writes a PNG beside its log by default."""
    log = tmp_path / "demo.pkl"
    assert main(["run", "--lockstep", "--log", str(log), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    png = tmp_path / "demo.png"
    assert r["plot"] == str(png) and png.exists()
    with Image.open(png) as im:
        im.verify()
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (1600, 1000)
    assert read_log(log).summary["cycles"] == r["cycles"]


def test_export_traj_of_a_faulted_run_stops_before_the_bad_reading(tmp_path, capsys):
    """A run stopped by a NaN reading logs that reading in its fault row: `--traj --measured`
    wrote it as 'nan', and `pkrt run --traj` then refused the file (values must be finite)."""
    from pkrt.rt.runtime.record.logfile import LogWriter
    from pkrt.rt.runtime.machine.trajectory import load_trajectory_csv

    p = tmp_path / "nan.pkl"
    w = LogWriter(p, {"axes": ["a", "b"], "rate_hz": 100.0},
                  [("t", 1, "s"), ("ref_pos", 2, "m"), ("pos", 2, "m")])
    for i in range(20):
        w.row[:] = (i * 0.01, 0.1, 0.2, 0.1 if i < 19 else np.nan, 0.2)
        w.commit()
    w.event(19, "fault", "non-finite feedback on axis a")
    w.close({"fault": "non-finite feedback on axis a"})
    out = tmp_path / "meas.csv"
    assert main(["log", "export", str(p), "--traj", str(out), "--measured"]) == 0
    capsys.readouterr()
    tr = load_trajectory_csv(str(out), 100.0, ["a", "b"])
    assert tr.n == 19 and np.allclose(tr.pos, [0.1, 0.2])


def _records(path, *recs):
    import msgpack

    with open(path, "wb") as f:
        for r in recs:
            f.write(msgpack.packb(r, use_bin_type=True))


_RUN = "0" * 32
_BODY = {"channels": [["t", 1, "s"], ["pos", 2, "m"]], "run": {"rate_hz": 100.0, "axes": ["a", "b"]}}


def _head(**body):
    """A version 2 header record, correctly sealed, with ``body`` fields replacing _BODY's."""
    from pkrt.rt.runtime.record.logfile import FORMAT, VERSION, sealed

    return {"type": "header", "format": FORMAT, "version": VERSION, **sealed("header", _RUN, 0, {**_BODY, **body})}


def _block(seq, first, n, width=3):
    from pkrt.rt.runtime.record.logfile import _block_key, _crc

    data = np.zeros((n, width)).tobytes()
    return {"type": "block", "run_id": _RUN, "seq": seq, "first": first, "n": n, "data": data,
            "crc": _crc("block", _RUN, seq, _block_key(first, n), data)}


def _end(seq, **body):
    from pkrt.rt.runtime.record.logfile import sealed

    return sealed("end", _RUN, seq, body)


@pytest.mark.parametrize("recs", [
    [_head(), _block(1, 0, 3), _end(2, dropped_blocks="x", summary={})],
    [_head(), _block(1, 0, 3), _end(2, dropped_blocks=None)],
    [_head(channels=[["t", 1, "s"], ["t", 2, "m"]]), _block(1, 0, 3), _end(2)],
    [_head(channels=[["t", 10**12, "s"]]), _end(1)],
    [_head(created=5, software="x"), _block(1, 0, 3), _end(2)],
    [_head(), _block(1, 0, 3), _end(2, blocks="x", rows_written=[1], summary=[])],
], ids=["dropped-str", "dropped-none", "duplicate-channel", "huge-width", "software-str", "counts-wrong-type"])
def test_wrongly_typed_log_fields_never_crash(tmp_path, capsys, recs):
    """Well-formed msgpack with wrongly typed header or end fields gave tracebacks (ValueError,
    TypeError, MemoryError, AttributeError) in the reader and in log info/export/plot."""
    p = tmp_path / "odd.pkl"
    _records(p, *recs)
    for argv in (["log", "info", str(p)], ["log", "info", str(p), "--json"],
                 ["log", "export", str(p), "--csv", str(tmp_path / "o.csv")],
                 ["log", "plot", str(p), "-o", str(tmp_path / "o.png")]):
        code = main(argv)
        out = capsys.readouterr()
        assert code in (0, 2), (argv, out.err)
        if code == 2:
            assert out.err.startswith("pkrt: error:") and out.err.count("\n") == 1


def test_export_cycle_column_is_the_loop_cycle_after_skipped_periods(tmp_path, capsys):
    """The CSV's 'cycle' was the row count (commits): after skipped periods it disagreed with
    t * rate and with the cycle numbers of the events (`log info`: 'cycle 5: fault')."""
    from pkrt.rt.runtime.record.logfile import LogWriter

    p = tmp_path / "skip.pkl"
    w = LogWriter(p, {"rate_hz": 1000.0, "axes": ["a"]}, [("t", 1, "s"), ("pos", 1, "m")])
    ks = [0, 1, 2, 5, 6, 7]  # periods 3 and 4 skipped
    for k in ks:
        w.row[:] = (k / 1000.0, 0.1)
        w.commit()
    w.event(7, "fault", "x")
    w.close({})
    out = tmp_path / "skip.csv"
    assert main(["log", "export", str(p), "--csv", str(out)]) == 0
    capsys.readouterr()
    with open(out) as f:
        rows = list(csv.reader(f))
    assert [int(r[0]) for r in rows[1:]] == ks
