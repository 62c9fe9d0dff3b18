"""The check before motion where programs run: a 100,000-line relief (placed in the Orthoglide's
workspace by its G54 offset) with an error at line 90,000 is refused naming the file and line
90,000 by ``pkrt run --gcode`` (exit 2, one line, nothing run) and by a served machine's ``run``
(the plan's result, the machine at standstill where it was: nothing moved)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pkrt.rt.bench.camprograms import placed_machine, relief
from pkrt.rt.cli import main
from tests.serving import ready_client, serving

LINE = 90_000


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    d = tmp_path_factory.mktemp("placed")
    machine = placed_machine(d / "orthoglide-relief.toml")
    lines = relief(d / "relief.ngc", lines=100_300).read_text().split("\n")
    lines[LINE - 1] = "G1 X10 Y10 Z-3 A5"  # an unsupported word
    bad = d / "bad.ngc"
    bad.write_text("\n".join(lines))
    return str(machine), bad


def test_pkrt_run_gcode_refuses_line_90000_before_motion(placed, tmp_path, capsys):
    machine, bad = placed
    log = tmp_path / "run.pktlog"
    t0 = time.perf_counter()
    code = main(["run", "--machine", machine, "--gcode", str(bad), "--lockstep", "--log", str(log)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"pkrt: error: {bad}: line {LINE}: word A5 is not supported"), err
    assert err.count("\n") == 1 and not log.exists()
    assert time.perf_counter() - t0 < 60  # the check, not 90,000 lines of planning


def test_a_served_machine_refuses_line_90000_at_standstill(placed, tmp_path):
    machine, bad = placed
    with serving(machine, tmp_path, lockstep=True) as srv, ready_client(srv, 120) as c:
        before = np.array(c.status()["position"])
        r = c.run(str(bad))
        assert r["ok"], r
        out = c.wait_planned(r["job"], timeout=120)
        assert not out["ok"] and f"{bad}: line {LINE}: word A5 is not supported" in out["error"], out
        st = c.status()
        assert st["state"] == "standstill" and st["fault"] is None
        assert np.abs(np.array(st["position"]) - before).max() < 1e-9  # nothing moved
