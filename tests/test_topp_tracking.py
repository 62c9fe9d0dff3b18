"""The Delta's time-optimal Adept cycle tracked in lockstep on the simulated plant (computed
torque on the controller's tree, the finer plant tree): forces within the 20 N m limit at every
cycle and tracking within 2x the hand-timed 0.5 s cycle's; the planner's accelerations are each
period's mean (``PathPlanner.held_acc``), which the tracking depends on."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.drivers import open_drives
from pkrt.models.kinematics.taskspace import TaskKinematics, adept_cycle
from pkrt.rt.app.reference import machine_mechanism, path_planner, plan_adept
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.runtime.logs.logstats import columns
from pkrt.rt.runtime.machine.runsetup import load_controller_tree
from pkrt.rt.runtime.machine.run import run_session


@pytest.fixture(scope="module")
def delta():
    config = load_machine("delta")
    return config, machine_mechanism(config), load_controller_tree(config)


def _run(config, tree, plan, log) -> tuple[dict, np.ndarray]:
    r = run_session(config, open_drives(config, {}), trajectory=plan, lockstep=True, tree=tree, log_path=str(log))
    return r, columns(read_log(str(log)).channels["tau"])


def test_planned_accelerations_are_each_periods_mean(delta):
    config, mech, _ = delta
    plan, _ = plan_adept(path_planner(config, mech), config.demo)
    np.testing.assert_allclose(plan.acc[:-1], np.diff(plan.vel, axis=0) * config.rate_hz, rtol=0, atol=1e-9)
    inst, _ = plan_adept(path_planner(config, mech, held_acc=False), config.demo)
    assert not np.allclose(inst.acc[:-1], np.diff(inst.vel, axis=0) * config.rate_hz, atol=1.0)


def test_time_optimal_cycle_within_the_force_limit_and_2x_the_hand_timed_tracking(delta, tmp_path):
    config, mech, tree = delta
    demo = config.demo
    hand = TaskKinematics(mech).plan(adept_cycle(np.asarray(demo.start, float), config.rate_hz, 0.5, demo.height,
                                                 demo.width, demo.direction))
    optimal, rep = plan_adept(path_planner(config, mech), demo)
    assert optimal.duration < hand.duration
    base, _ = _run(config, tree, hand, tmp_path / "hand.pktlog")
    r, tau = _run(config, tree, optimal, tmp_path / "optimal.pktlog")
    assert r["fault"] is None and r["saturated_cycles"] == 0
    assert np.abs(tau).max() <= config.controller.tau_max.max()
    assert r["max_error"] <= 2 * base["max_error"], (r["max_error"], base["max_error"])
    assert r["rms_error"] <= 2 * base["rms_error"], (r["rms_error"], base["rms_error"])
