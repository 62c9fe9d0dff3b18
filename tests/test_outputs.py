"""Every output path of every verb, tried with a missing folder, a folder, a read-only folder
(a read-only tmpfs: root ignores permission bits, not a read-only mount), the command's own
input and a full disk (a small tmpfs filled up): one line on stderr and a non-zero exit each,
the inputs unchanged and no half-written or temporary file left. Disk full in the middle of a
run keeps the summary, with ``log_error`` saying where the log stops."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from pkrt.models.kinematics.description import MACHINES_DIR
from pkrt.rt.cli import main
from pkrt.rt.runtime.record.logfile import read_log


@contextmanager
def tmpfs(path: Path, size: str, ro: bool = False):
    """A tmpfs of ``size`` mounted at ``path`` (skips the test where mounting is not permitted)."""
    path.mkdir()
    opts = f"size={size}" + (",ro" if ro else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> None:
    """Write zeros into ``path/filler`` until the file system is full."""
    fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    log = d / "in.pktlog"
    assert main(["run", "--lockstep", "--duration", "0.3", "--no-rt", "--log", str(log), "--json"]) == 0
    traj = d / "in-traj.csv"  # hold the demo's start for 0.2 s
    q = read_log(log).channels["ref_pos"][0]
    traj.write_text("t,q1,q2,q3\n" + "".join(f"{t},{q[0]:.17g},{q[1]:.17g},{q[2]:.17g}\n" for t in (0.0, 0.1, 0.2)))
    model = d / "fourbar.toml"
    shutil.copy(MACHINES_DIR / "fourbar.toml", model)
    can = d / "can.toml"  # the CAN HIL machine, its files named by absolute paths
    text = (MACHINES_DIR / "orthoglide-can.toml").read_text()
    for name in ("orthoglide.pkt", "orthoglide-plant.pkt"):
        text = text.replace(f'"{name}"', f'"{MACHINES_DIR / name}"')
    can.write_text(text.replace('model = "orthoglide"', f'model = "{MACHINES_DIR / "orthoglide.toml"}"'))
    return {"log": log, "traj": traj, "model": model, "can": can}


# verb -> (argv given the output path, the input that the 'input' case writes onto)
VERBS = {
    "run --log": (lambda i, o, t: ["run", "--lockstep", "--no-rt", "--traj", str(i["traj"]), "--log", str(o),
                                   "--plot", str(t / "run.png")], "traj"),
    "run --plot": (lambda i, o, t: ["run", "--lockstep", "--no-rt", "--traj", str(i["traj"]), "--log",
                                    str(t / "run.pktlog"), "--plot", str(o)], "traj"),
    "log export --csv": (lambda i, o, t: ["log", "export", str(i["log"]), "--csv", str(o)], "log"),
    "log export --traj": (lambda i, o, t: ["log", "export", str(i["log"]), "--traj", str(o)], "log"),
    "log plot -o": (lambda i, o, t: ["log", "plot", str(i["log"]), "-o", str(o)], "log"),
    "replay --log": (lambda i, o, t: ["replay", str(i["log"]), "--lockstep", "--log", str(o)], "log"),
    "build -o": (lambda i, o, t: ["build", str(i["model"]), "-o", str(o), "--kind", "boxes", "--boxes", "1", "--jobs", "1",
                                  "--verify-samples", "0"], "model"),
    # the drives' own log (rt/cli/hil.py, not this module's): a disk that fills during the run is
    # reported in the summary's log_error only, so the full disk here is full from the start
    "hil --log": (lambda i, o, t: ["hil", "--bus", "can", "--machine", str(i["can"]), "--duration", "0.2",
                                   "--log", str(o)], "can"),
}
CASES = ["missing folder", "folder", "read-only folder", "own input", "full disk"]
EXPECT = {"missing folder": "does not exist", "folder": "is a directory", "read-only folder": "not writable",
          "own input": "would destroy that input", "full disk": "No space left on device"}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("verb", VERBS)
def test_every_output_with_every_bad_place(inputs, tmp_path, capfd, verb, case):
    argv_of, own = VERBS[verb]
    before = {k: p.read_bytes() for k, p in inputs.items()}
    work = tmp_path / "work"
    work.mkdir()
    with _place(tmp_path, case) as where:
        out = inputs[own] if case == "own input" else where / "out.file"
        code = main(argv_of(inputs, out, work))
        cap = capfd.readouterr()
        leftovers = sorted(x.name for x in where.iterdir()) if where.is_dir() else []
    lines = cap.err.strip().splitlines()
    assert code == 2, (verb, case, cap.err)
    assert len(lines) == 1 and lines[0].startswith("pkrt: error:") and EXPECT[case] in lines[0], lines
    assert {k: p.read_bytes() for k, p in inputs.items()} == before  # no input touched
    assert leftovers in ([], ["filler"], ["out.file"]), leftovers  # no half-written or temporary file


@contextmanager
def _place(tmp_path: Path, case: str):
    """The folder the output goes into for a case."""
    if case == "missing folder":
        yield tmp_path / "missing"
    elif case == "folder":
        (tmp_path / "f" / "out.file").mkdir(parents=True)  # the output path is a folder
        yield tmp_path / "f"
    elif case == "read-only folder":
        with tmpfs(tmp_path / "ro", "64k", ro=True) as d:
            yield d
    elif case == "full disk":
        with tmpfs(tmp_path / "full", "64k") as d:
            fill(d)
            yield d
    else:
        (tmp_path / "own").mkdir()
        yield tmp_path / "own"


def test_two_outputs_or_an_output_and_an_input_the_same(inputs, tmp_path, capsys):
    x = tmp_path / "x"
    for argv, msg in ((["run", "--lockstep", "--log", str(x), "--plot", str(x)], "is also the --log"),
                      (["log", "export", str(inputs["log"]), "--csv", str(x), "--traj", str(x)], "is also the --csv"),
                      (["run", "--lockstep", "--log", str(MACHINES_DIR / "orthoglide-sim.toml")],
                       "is the machine configuration"),
                      (["run", "--lockstep", "--log", str(MACHINES_DIR / "orthoglide.pkt")], "is the tree")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err, err
    assert not x.exists()


def test_disk_full_during_a_run_keeps_the_summary(tmp_path, capsys):
    """The disk fills after the header and two blocks: the run goes on to its end, the summary
    is printed with log_error saying where the log stops, the log reads back to there, and the
    command says so in one line with exit 2 (the log is an output that was not written)."""
    with tmpfs(tmp_path / "small", "128k") as d:
        log = d / "run.pktlog"
        code = main(["run", "--lockstep", "--duration", "0.7", "--no-rt", "--log", str(log),
                     "--plot", str(tmp_path / "run.png"), "--json"])
        cap = capsys.readouterr()
        summary = json.loads(cap.out)
        lg = read_log(log)
        names = sorted(x.name for x in d.iterdir())
    rows = summary["log_rows_written"]
    assert code == 2 and summary["cycles"] == 701 and summary["fault"] is None
    assert 0 < rows < 701 and rows % 256 == 0
    assert "No space left on device" in summary["log_error"] and f"the log stops after {rows} cycles" in summary["log_error"]
    assert cap.err.strip().splitlines() == [f"pkrt: error: {summary['log_error']}"]
    assert lg.n_cycles == rows and lg.truncated and lg.summary is None and lg.problems
    assert (tmp_path / "run.png").stat().st_size > 0  # the plot of what the log holds
    assert names == ["run.pktlog"]  # no lock or temporary file left


@pytest.mark.realtime
def test_disk_full_during_a_hil_run_is_exit_2(tmp_path, capsys, host_probe):
    """pkrt hil: the disk fills during the run: the summary says where the log stops and the
    command ends with one line and exit 2 (it was exit 0)."""
    from .realtime import anomalies, judge

    def run():
        with tmpfs(tmp_path / f"small{len(list(tmp_path.iterdir()))}", "32k") as d:  # serial: 100 Hz
            code = main(["hil", "--bus", "serial", "--duration", "3", "--log", str(d / "hil.pktlog"), "--json"])
            cap = capsys.readouterr()
        return code, json.loads(cap.out), cap.err

    code, r, err = judge(run, host_probe, find=lambda x: anomalies(x[1]))  # stepped timing (docs/hil.md)
    assert r["fault"] is None, r["fault"]
    assert code == 2 and "No space left on device" in r["log_error"], (code, r.get("log_error"))
    assert err.strip().splitlines() == [f"pkrt: error: log incomplete: {r['log_error']}"]
