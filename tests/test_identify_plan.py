"""``pkrt identify plan`` (an exciting trajectory playable by ``pkrt run --traj``) and the
simulated plant on a truth model the controller does not know (``plant_model``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from pkrt.models.identification.estimate import dump_toml
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.rt.cli import main
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.core.schema import ConfigError
from pkrt.rt.runtime.machine.trajectory import load_trajectory_csv

MACHINES = Path(__file__).resolve().parent.parent / "models" / "machines"


def test_plan_meets_every_limit_and_plays(tmp_path, capsys):
    out = tmp_path / "excite.csv"
    code = main(["identify", "plan", "orthoglide", "-o", str(out), "--f0", "1", "--harmonics", "3",
                 "--periods", "2", "--iterations", "6", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["ok"] and r["checked_at_hz"] == 10000.0
    assert 1 < r["condition_number"] < 1e6
    p, L = r["peaks"], r["limits"]
    assert np.all(np.array(p["velocity"]) <= L["velocity"]) and np.all(np.array(p["force"]) <= L["force"])
    assert np.all(np.array(p["position_min"]) >= L["position"][0]) and np.all(np.array(p["position_max"]) <= L["position"][1])
    assert p["singularity_measure_min"] >= L["singularity_measure"]
    plan = load_trajectory_csv(str(out), 1000.0, ["q1", "q2", "q3"])
    assert plan.pos.shape == (2001, 3)
    # rest at both ends, the same pose (whole periods)
    assert np.abs(plan.vel[[0, -1]]).max() < 1e-6 and np.allclose(plan.pos[0], plan.pos[-1], atol=1e-9)
    assert np.abs(plan.vel).max() > 0.05  # it moves


def test_plan_refuses_bad_options(tmp_path, capsys):
    assert main(["identify", "plan", "orthoglide", "-o", str(tmp_path / "x.csv"), "--margin", "0.6"]) == 2
    assert "--margin" in capsys.readouterr().err


def _truth_config(tmp_path, **drives) -> Path:
    doc = tomllib.loads((MACHINES / "orthoglide-sim.toml").read_text())
    doc["machine"]["model"] = str(MACHINES / "orthoglide.toml")
    doc["machine"]["tree"] = str(MACHINES / "orthoglide.pkt")
    d = doc["drives"]
    d.pop("plant_tree")
    d.update(drives)
    p = tmp_path / "truth-sim.toml"
    p.write_text(dump_toml(doc))
    return p


def test_plant_model_is_a_truth_the_controller_does_not_know(tmp_path):
    from pkrt.drivers.sim import Plant
    from pkrt.rt.app.reference import ExactInLoop

    truth = tmp_path / "truth.toml"
    text = (MACHINES / "orthoglide.toml").read_text().replace("mass = 3.0", "mass = 4.5")
    truth.write_text(text)
    cfg = load_machine(str(_truth_config(tmp_path, plant="exact", plant_model="truth.toml", force_noise=0.5)))
    assert cfg.plant_model_path == str(truth) and cfg.drives.force_noise == 0.5
    m = load_mechanism(cfg.plant_model_path)
    plant = Plant.from_config(cfg, model=ExactInLoop(m))
    assert plant.source["plant_model"] == str(truth)
    # the plant's gravity load is the truth's: the platform 1.5 kg heavier than the model's
    from pkrt.models.identification.regressor import Regressor

    s = 3
    H, D, p = np.zeros((s, s)), np.zeros((s, 6)), np.zeros(s)
    ExactInLoop(m)(np.array([-0.1, -0.1, -0.1]), H, D, p)
    H0, D0, p0 = np.zeros((s, s)), np.zeros((s, 6)), np.zeros(s)
    ExactInLoop(load_mechanism("orthoglide"))(np.array([-0.1, -0.1, -0.1]), H0, D0, p0)
    reg = Regressor(m)
    Y = reg(np.array([-0.1, -0.1, -0.1]), np.zeros(s), np.zeros(s))
    dpi = np.zeros(reg.n_params)
    dpi[reg.names.index("platform.m")] = 1.5
    assert np.allclose(p - p0, -(Y @ dpi), rtol=1e-9, atol=1e-9) and np.abs(p - p0).max() > 5.0


def test_plant_model_needs_the_exact_plant(tmp_path):
    with pytest.raises(ConfigError, match="plant_model.*applies to plant = .exact. only"):
        load_machine(str(_truth_config(tmp_path, plant_tree=str(MACHINES / "orthoglide-plant.pkt"),
                                       plant_model="truth.toml")))


def test_balanced_f0_reaches_a_rate_limit_with_the_full_range():
    """At the balanced frequency the shape that spans its position range also reaches its
    velocity or its acceleration limit, and neither is exceeded."""
    from pkrt.models.identification.excitation import Fourier, Limits, _rest, balanced_f0

    s, K = 3, 4
    half = np.array([0.1, 0.1, 0.2])
    lim = Limits(-half, half, np.array([1.0, 1.0, 1.0]), np.array([20.0, 20.0, 20.0]), np.ones(3))
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = rng.normal(size=s * 2 * (K - 1))
        f0 = balanced_f0(x, K, s, half, lim)
        a, b = _rest(x, K, s)
        th, td, tdd = Fourier(f0, a, b, np.zeros(s)).sample(np.arange(4096) / 4096 / f0)
        g = np.max(np.abs(th) / half)  # the gain that makes the positions span the range
        use = max(np.max(np.abs(td) / lim.velocity), np.max(np.abs(tdd) / lim.acceleration)) / g
        assert use == pytest.approx(1.0, rel=0.02)


def test_plan_duration_rounds_up_to_whole_periods(tmp_path, capsys):
    out = tmp_path / "excite.csv"
    code = main(["identify", "plan", "orthoglide", "-o", str(out), "--f0", "1", "--harmonics", "3",
                 "--duration", "2.5", "--iterations", "4", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["periods"] == 3 and r["duration_s"] == 3.0 and r["rows"] == 3001
    assert r["f0_from"] == "given" and r["f0_hz"] == 1.0
