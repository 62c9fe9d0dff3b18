"""Damaged and forged logs, made from real short lockstep runs: flipped bytes in the header and
the end record, a forged end record appended, a duplicated block, a block appended, a block of
another run spliced in, two logs concatenated, truncations, an old-version log. Each is
detected and reported (or refused in one line), never a traceback, nothing counted twice;
``pkrt log info``, ``log export``, ``log plot`` and ``replay`` read to the last good record and
say what they dropped."""

from __future__ import annotations

import csv
import json

import msgpack
import numpy as np
import pytest

from pkrt.rt.cli import main
from pkrt.rt.runtime.record.logfile import FORMAT, LogFileError, _block_key, _crc, read_log, sealed

CYCLES = 701  # --duration 0.7 at 1 kHz: 2 full blocks of 256 and a partial one


def _run(path) -> None:
    assert main(["run", "--lockstep", "--duration", "0.7", "--no-rt", "--log", str(path),
                 "--json"]) == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    a, b = d / "a.pktlog", d / "b.pktlog"
    _run(a)
    _run(b)
    return a.read_bytes(), b.read_bytes()


def records(raw: bytes) -> list[tuple[int, int, dict]]:
    """(start, end, record) of every record of a log file."""
    unp = msgpack.Unpacker(raw=False, strict_map_key=False)
    unp.feed(raw)
    out, pos = [], 0
    for rec in unp:
        out.append((pos, unp.tell(), rec))
        pos = unp.tell()
    return out


def span(raw: bytes, kind: str, index: int = 0) -> tuple[int, int, dict]:
    return [r for r in records(raw) if r[2]["type"] == kind][index]


def check_cli(path, tmp_path, capsys, refused: str | None = None, replay: bool = False) -> list[str]:
    """Every log verb on ``path``: exit 2 and one line naming ``refused``; or exit 0, output
    written, and one warning line on stderr for export, plot (and replay). Returns the
    warnings."""
    verbs = [["log", "info", str(path), "--json"], ["log", "export", str(path), "--csv", str(tmp_path / "o.csv")],
             ["log", "plot", str(path), "-o", str(tmp_path / "o.png")]]
    if replay:
        verbs.append(["replay", str(path), "--lockstep", "--json"])
    warnings = []
    for argv in verbs:
        code = main(argv)
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        if refused is not None:
            assert code == 2 and out.err.count("\n") == 1 and out.err.startswith("pkrt: error:"), (argv, out.err)
            assert refused in out.err
            continue
        assert code == 0, (argv, out.err)
        if argv[1] == "info":
            continue
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pkrt: warning:") and "read to the last good record" in lines[0]
        warnings.append(lines[0])
    if refused is None:
        with open(tmp_path / "o.csv") as f:
            rows = list(csv.reader(f))[1:]
        cyc = [int(r[0]) for r in rows]
        assert len(cyc) == len(set(cyc))  # never a cycle twice
    return warnings


def write(tmp_path, raw: bytes, name="x.pktlog"):
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def test_the_clean_log(runs, tmp_path, capsys):
    p = write(tmp_path, runs[0])
    log = read_log(p)
    assert log.n_cycles == CYCLES and log.problems == [] and not log.truncated and log.summary["cycles"] == CYCLES
    assert log.header["version"] == 2 and len(log.header["run_id"]) == 32
    assert main(["log", "export", str(p), "--csv", str(tmp_path / "o.csv")]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("where", ["rate_hz", "axes", "channels", "crc"])
def test_flipped_header_byte_is_refused_in_one_line(runs, tmp_path, capsys, where):
    """One flipped byte in rate_hz read back as a complete log of another rate."""
    raw = bytearray(runs[0])
    s, e, rec = span(runs[0], "header")
    if where == "crc":
        i = e - 1
    else:
        i = raw.index(where.encode(), s, e) + len(where) + 3  # inside the value after the key
    raw[i] ^= 0x01
    p = write(tmp_path, bytes(raw))
    with pytest.raises(LogFileError, match="damaged pkrt log header"):
        read_log(p)
    check_cli(p, tmp_path, capsys, refused="damaged pkrt log header", replay=True)


def test_flipped_end_byte_drops_the_summary_and_says_so(runs, tmp_path, capsys):
    raw = bytearray(runs[0])
    s, e, rec = span(runs[0], "end")
    i = raw.index(b"rms_error", s, e) + 12
    raw[i] ^= 0x10
    p = write(tmp_path, bytes(raw))
    log = read_log(p)
    assert log.summary is None and log.truncated and log.n_cycles == CYCLES
    assert any("end record" in x and "checksum mismatch" in x for x in log.problems)
    w = check_cli(p, tmp_path, capsys)
    assert "end record" in w[0]


def _forged_end(raw: bytes, **change) -> bytes:
    s, e, rec = span(raw, "end")
    body = msgpack.unpackb(rec["body"], raw=False)
    body["summary"].update(change)
    return msgpack.packb(sealed("end", rec["run_id"], rec["seq"] + 1, body), use_bin_type=True)


def test_forged_end_record_appended_is_dropped(runs, tmp_path, capsys):
    """Sealed with the right run id, the next sequence number and a valid CRC: still data after
    the end record, so the genuine summary stays."""
    p = write(tmp_path, runs[0] + _forged_end(runs[0], rms_error=1e-9, fault="forged"))
    log = read_log(p)
    assert log.summary["fault"] is None and log.summary["rms_error"] > 1e-7
    assert log.n_cycles == CYCLES and log.dropped_bytes > 0
    assert any("data after the end record (end record)" in x for x in log.problems)
    w = check_cli(p, tmp_path, capsys, replay=True)
    assert all("after the end record" in x for x in w)


def test_duplicated_block_is_read_once(runs, tmp_path, capsys):
    s, e, _ = span(runs[0], "block", 1)
    raw = runs[0][:e] + runs[0][s:e] + runs[0][e:]
    p = write(tmp_path, raw)
    log = read_log(p)
    orig = read_log(write(tmp_path, runs[0], "orig.pktlog"))
    assert log.n_cycles == CYCLES and log.skipped_records == 1
    np.testing.assert_array_equal(log.cycles, orig.cycles)
    np.testing.assert_array_equal(log.channels["tau"], orig.channels["tau"])
    assert log.summary == orig.summary and not log.truncated
    assert any("block of cycles 256..511" in x and "already read" in x for x in log.problems)
    check_cli(p, tmp_path, capsys, replay=True)


def test_block_resealed_with_a_new_sequence_number_is_not_double_counted(runs, tmp_path, capsys):
    """A copy of block 0 given the next sequence number and a valid CRC before the end
    record: its cycles overlap those already read."""
    s, e, end = span(runs[0], "end")
    _, _, b0 = span(runs[0], "block", 0)
    seq = end["seq"]
    forged = dict(b0, seq=seq, crc=_crc("block", b0["run_id"], seq, _block_key(b0["first"], b0["n"]), b0["data"]))
    end2 = dict(end, seq=seq + 1, crc=_crc("end", end["run_id"], seq + 1, end["body"]))
    raw = runs[0][:s] + msgpack.packb(forged, use_bin_type=True) + msgpack.packb(end2, use_bin_type=True)
    log = read_log(write(tmp_path, raw))
    assert log.n_cycles == CYCLES and log.skipped_records == 1
    assert any("overlaps cycles already read" in x for x in log.problems)


def test_block_cut_out_of_the_middle_is_reported(runs, tmp_path, capsys):
    s, e, _ = span(runs[0], "block", 1)
    log = read_log(write(tmp_path, runs[0][:s] + runs[0][e:]))
    assert log.n_cycles == CYCLES - 256 and 256 not in log.cycles and log.summary is not None
    assert any("1 record(s) missing" in x for x in log.problems)
    assert any("the end record counts 3 blocks, the file holds 2" in x for x in log.problems)
    check_cli(write(tmp_path, runs[0][:s] + runs[0][e:]), tmp_path, capsys)


def test_appended_block_is_dropped(runs, tmp_path, capsys):
    s, e, _ = span(runs[0], "block", 2)
    p = write(tmp_path, runs[0] + runs[0][s:e])
    log = read_log(p)
    assert log.n_cycles == CYCLES and log.summary is not None and log.dropped_bytes == e - s
    assert any("data after the end record (block of cycles 512..700)" in x for x in log.problems)
    check_cli(p, tmp_path, capsys)


def test_block_of_another_run_is_skipped(runs, tmp_path, capsys):
    s, e, _ = span(runs[0], "block", 1)
    sb, eb, _ = span(runs[1], "block", 1)
    raw = runs[0][:e] + runs[1][sb:eb] + runs[0][e:]
    log = read_log(write(tmp_path, raw))
    assert log.n_cycles == CYCLES and log.skipped_records == 1
    assert any("belongs to another run" in x for x in log.problems)


def test_two_logs_concatenated(runs, tmp_path, capsys):
    """Gave a traceback in pkrt replay; now the first log is read and the second dropped."""
    p = write(tmp_path, runs[0] + runs[1])
    log = read_log(p)
    assert log.n_cycles == CYCLES and log.summary is not None and log.dropped_bytes == len(runs[1])
    assert any("another log follows" in x for x in log.problems)
    w = check_cli(p, tmp_path, capsys, replay=True)
    assert all("another log follows" in x for x in w)


def test_first_log_cut_then_another_appended(runs, tmp_path, capsys):
    s, e, _ = span(runs[0], "block", 2)
    log = read_log(write(tmp_path, runs[0][:e] + runs[1]))
    assert log.n_cycles == CYCLES and log.summary is None and log.truncated
    assert any("another log follows" in x for x in log.problems)


def test_truncations(runs, tmp_path, capsys):
    raw = runs[0]
    recs = records(raw)
    header_end = recs[0][1]
    orig = read_log(write(tmp_path, raw, "orig.pktlog"))
    cuts = sorted({header_end, header_end + 1, len(raw) - 1} | {e - 7 for _, e, _ in recs[1:]}
                  | set(range(header_end, len(raw), len(raw) // 9)))
    for n in cuts:
        p = write(tmp_path, raw[:n])
        log = read_log(p)
        assert log.truncated and log.summary is None and log.problems
        k = log.n_cycles
        assert k in (0, 256, 512, CYCLES)
        np.testing.assert_array_equal(log.channels["pos"], orig.channels["pos"][:k])
    check_cli(p, tmp_path, capsys)
    p = write(tmp_path, raw[: header_end - 1])
    with pytest.raises(LogFileError, match="not a pkrt log"):
        read_log(p)
    check_cli(p, tmp_path, capsys, refused="not a pkrt log")


def test_old_version_log_gets_one_clear_line(tmp_path, capsys):
    v1 = {"type": "header", "format": FORMAT, "version": 1, "channels": [["t", 1, "s"]], "run": {"rate_hz": 1000.0}}
    p = write(tmp_path, msgpack.packb(v1))
    check_cli(p, tmp_path, capsys, refused="pkrt log version 1 was written by an older pkrt")


def test_log_info_names_what_was_dropped(runs, tmp_path, capsys):
    s, e, _ = span(runs[0], "block", 0)
    p = write(tmp_path, runs[0][:e] + runs[0][s:e] + runs[0][e:] + runs[1])
    assert main(["log", "info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "dropped: block of cycles 0..255" in out and "dropped: another log follows" in out
    assert main(["log", "info", str(p), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cycles"] == CYCLES and len(info["problems"]) == 2
