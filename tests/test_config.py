"""Bad machine configurations: one line naming file, table and field, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from pkrt.rt.cli import main

SIM = (Path(__file__).resolve().parent.parent / "models" / "machines" / "orthoglide-sim.toml").read_text()
MACHINES = Path(__file__).resolve().parent.parent / "models" / "machines"


def _write(tmp_path, text):
    # keep the shipped trees and model reachable from the temporary file
    text = text.replace('model = "orthoglide"', f'model = "{MACHINES / "orthoglide.toml"}"')
    text = text.replace('tree = "orthoglide.pkt"', f'tree = "{MACHINES / "orthoglide.pkt"}"')
    text = text.replace('plant_tree = "orthoglide-plant.pkt"', f'plant_tree = "{MACHINES / "orthoglide-plant.pkt"}"')
    f = tmp_path / "m.toml"
    f.write_text(text)
    return str(f)


@pytest.mark.parametrize("old,new,msg", [
    ("[machine]", "[machine", "not a valid TOML file"),
    ("[machine]", "[machin]", "[machine] table missing"),
    ("rate_hz = 1000.0", "rate_hz = 0", "field 'rate_hz'"),
    ('kind = "ct"', 'kind = "lqr"', "[controller], field 'kind'"),
    ("tau_max = 400.0", "tau_max = [400.0, -1.0, 400.0]", "[controller], field 'tau_max'"),
    ("stale_cycles = 3", 'stale_cycles = "three"', "[limits], field 'stale_cycles'"),
    ("mlockall = true", "mlockall = 1", "[realtime], field 'mlockall'"),
    ('backend = "sim"', 'backend = "ethercat"', "[drives], field 'backend'"),
    ("viscous = 20.0                       # N s/m per", "viscous = -20.0 # N s/m per", "field 'viscous'"),
    ('tree = "orthoglide.pkt"', f'tree = "{MACHINES / "fourbar.pkt"}"', "fourbar.pkt: the tree was built from model 'fourbar'"),
])
def test_bad_machine_configuration(tmp_path, capsys, old, new, msg):
    assert old in SIM
    path = _write(tmp_path, SIM.replace(old, new, 1))
    assert main(["run", "--machine", path, "--lockstep", "--no-log", "--duration", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: ") and msg in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("value", ['"wide"', '[["a", 0.0], [-0.2, 0.0], [-0.2, 0.0]]',
                                   "[[nan, 0.0], [-0.2, 0.0], [-0.2, 0.0]]", "[[-0.2, inf], [-0.2, 0.0], [-0.2, 0.0]]"])
def test_position_limits_are_numbers(tmp_path, capsys, value):
    """[limits] position went through np.asarray unchecked: text gave a traceback, and NaN
    passed the low < high check and then never tripped the position limit."""
    text = SIM.replace("[limits]\n", f"[limits]\nposition = {value}\n", 1)
    path = _write(tmp_path, text)
    assert main(["run", "--machine", path, "--lockstep", "--no-log", "--duration", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: ") and "[limits], field 'position'" in err, err
