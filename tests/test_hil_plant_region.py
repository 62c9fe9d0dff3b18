"""HIL on a plant tree that covers only a region (as hexapod-plant.pkt does): a run that leaves
the region has no physics there, so the emulated drives fault (CiA 402: EMCY 0x7300 on every
drive; Dynamixel: a hardware error on every servo) and the run stops with torque off, the
emulator's report saying why, instead of integrating clamped dynamics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pkrt.hil.can_hil import run_can_hil
from pkrt.hil.serial_hil import run_serial_hil
from pkrt.models.trees.shipped import MACHINES
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.trees.build import build_tree
from pkrt.models.trees.settings import BuildSettings
from pkrt.rt.core.treefile import save_tree

from .plans import demo_reference
from .realtime import judge

pytestmark = pytest.mark.realtime


@pytest.fixture(scope="module")
def region_tree(tmp_path_factory):
    """The Orthoglide over [-0.16, 0.0] m per axis: the demo leaves it in its first move."""
    tree, _ = build_tree(load_mechanism("orthoglide"), BuildSettings(kind="boxes", boxes=2, region=(-0.16, 0.0),
                                                                     verify_samples=0), jobs=1, progress=False)
    path = tmp_path_factory.mktemp("region") / "orthoglide-region.pkt"
    save_tree(tree, path)
    return path


def _config(tmp_path: Path, name: str, tree: Path) -> str:
    text = (MACHINES / f"{name}.toml").read_text()
    text = re.sub(r'^tree = "orthoglide.pkt"', f'tree = "{MACHINES / "orthoglide.pkt"}"', text, flags=re.M)
    text = re.sub(r'^model = "orthoglide"', f'model = "{MACHINES / "orthoglide.toml"}"', text, flags=re.M)
    text = re.sub(r'^plant_tree = "orthoglide-plant.pkt"', f'plant_tree = "{tree}"', text, flags=re.M)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return str(path)


def test_can_drives_fault_when_the_plant_leaves_its_tree(region_tree, tmp_path):
    r = run_can_hil(_config(tmp_path, "orthoglide-can", region_tree), duration=1.5, interface="virtual",
                    rate_hz=200.0, reference=demo_reference)
    assert r["fault"] is not None and "EMCY 0x7300" in r["fault"], r["fault"]
    assert set(r["emulator"]["drive_states"]) <= {"FAULT_REACTION_ACTIVE", "FAULT"}  # torque off
    assert "simulated plant left its tree's box at position" in r["emulator"]["plant_error"]


def test_serial_servos_stop_when_the_plant_leaves_its_tree(region_tree, tmp_path, host_probe):
    """At 1 kHz in the default stepped timing (this run failed on "no valid feedback in 3 cycles"
    in wall-clock timing whenever the host paused the emulator's vCPU)."""
    r = judge(lambda: run_serial_hil(_config(tmp_path, "orthoglide-serial", region_tree), duration=1.5,
                                     reference=demo_reference), host_probe, expected="hardware error")
    assert r["fault"] is not None and "hardware error" in r["fault"], r["fault"]
    assert r["emulator"]["torque_on"] == [False] * 3 and r["emulator"]["nonzero_after_off"] == 0
    assert "simulated plant left its tree's box at position" in r["emulator"]["plant_error"]
