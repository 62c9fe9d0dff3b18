"""Errors are classed by cause (pkrt.rt.core.errors); the CLI alone maps classes to exit codes."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from pkrt.drivers.base import DriveConfigError, DriveError
from pkrt.models.kinematics.description import ModelError
from pkrt.models.kinematics.mechanism import AssemblyError
from pkrt.rt.core import errors
from pkrt.rt.cli import EXIT_CODES, exit_code, main
from pkrt.rt.runtime.record.logfile import LogFileError
from pkrt.rt.core.treefile import TreeFileError

ROOT = Path(__file__).resolve().parent.parent


def test_every_error_class_has_one_exit_code():
    classes = {c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__}
    assert classes == {cls for cls, _ in EXIT_CODES}
    assert not any(hasattr(c, "exit_code") for c in classes)  # the codes live in the CLI only


@pytest.mark.parametrize("error, code", [
    (errors.UserError("x"), 2), (ModelError("x"), 2), (TreeFileError("x"), 2), (LogFileError("x"), 2),
    (DriveConfigError("x"), 2), (errors.OutputError("x"), 2), (AssemblyError("x"), 2),
    (errors.Fault("x"), 1), (DriveError("x"), 1), (errors.CheckFailed("x"), 1), (errors.Stopped("x"), 1)])
def test_exit_codes_by_class(error, code):
    assert exit_code(error) == code


def test_assembly_failure_is_a_model_failure():
    assert issubclass(AssemblyError, errors.ModelFailure)


def test_no_exit_codes_outside_the_cli():
    for p in [*(ROOT / "rt").rglob("*.py"), *(ROOT / "models").rglob("*.py"), *(ROOT / "drivers").rglob("*.py"),
              *(ROOT / "hil").rglob("*.py")]:
        if "cli" not in p.relative_to(ROOT).parts:
            assert "exit_code" not in p.read_text(), p



@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_an_output_not_written_exits_2(tmp_path, capsys):
    log, traj = tmp_path / "r.pktlog", tmp_path / "hold.csv"  # a trajectory file: no demo to plan
    traj.write_text("t,q1,q2,q3\n" + "".join(f"{t},-0.1,-0.1,-0.1\n" for t in (0, 0.1, 0.2)))
    assert main(["run", "--lockstep", "--traj", str(traj), "--log", str(log), "--no-rt"]) == 0
    capsys.readouterr()
    assert main(["log", "export", str(log), "--csv", "/dev/full"]) == 2  # disk full: OutputError
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pkrt: error: CSV /dev/full: not written: ")
