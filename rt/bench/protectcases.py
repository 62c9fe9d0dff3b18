"""Contact detection's cases, shared by ``pkrt bench --only protect`` and the tests: the machines'
configurations with ``[protect]`` on, their motions, a run with a contact at the tool (a force
step or a clamp) and what it shows, runs of normal motion, and the identified-model case (a truth
plant of other masses and friction, a model identified from its log, as ``pkrt identify`` does).

Machines and motions: the Orthoglide's demo and G-code program (``orthoglide-demo.ngc``), the
Delta's demo (three Adept cycles at 0.5 s, full speed) and the same G-code program, the hexapod's
demo. The CAD case runs the model on a plant of the same model (the hexapod on its plant tree,
the others as shipped); the identified case runs the identified model exact in the loop on the
truth plant (exact, ``plant_model`` = the truth; force noise and position quantum as the identify
benchmark's). Forces: ``FORCE_N`` at the tool (N), ``CLAMP`` stiffness (N/m). Units: SI.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path

import numpy as np

FORCE_N = {"orthoglide": 30.0, "delta": 10.0, "hexapod": 150.0}  # the contact forces at the tool
CLAMP = {"orthoglide": 20e3, "delta": 2e3, "hexapod": 100e3}  # wall stiffness (N/m) for the clamp trials
MOTIONS = {"orthoglide": ("demo", "gcode"), "delta": ("demo", "gcode"), "hexapod": ("demo",)}
GCODE = "orthoglide-demo.ngc"
_PLANS: dict = {}


def protected(config, thresholds=None, reaction: str = "stop", **kw):
    """``config`` with ``[protect]`` enabled (thresholds: given, else the configuration's)."""
    th = config.protect.thresholds if thresholds is None else np.broadcast_to(
        np.asarray(thresholds, float), config.limits.position.shape[:1]).copy()
    return dataclasses.replace(config, protect=dataclasses.replace(config.protect, enabled=True, thresholds=th,
                                                                   reaction=reaction, **kw))


def cad_config(name: str):
    """The machine as shipped, the hexapod on its plant tree (``hexapod-plant.pkt``: a CAD plant
    that runs without the exact reduction at every RK4 stage)."""
    from pkrt.rt.runtime.machine.config import load_machine

    config = load_machine(name)
    if config.drives.plant == "exact":
        drives = dataclasses.replace(config.drives, plant=None, lockstep=False,
                                     plant_tree=str(Path(config.path).parent / f"{name}-plant.pkt"))
        config = dataclasses.replace(config, drives=drives)
    return config


def motion(config, kind: str, mech=None):
    """A machine's motion at its rate, planned once per process: ``demo`` or ``gcode``."""
    from pkrt.models.kinematics.description import MACHINES_DIR
    from pkrt.rt.app.reference import path_planner, plan_gcode, plan_reference

    key = (str(config.model_path), kind, float(config.rate_hz))
    if key not in _PLANS:
        if kind == "demo":
            _PLANS[key] = plan_reference(config, mech=mech)
        else:
            _PLANS[key] = plan_gcode(path_planner(config, mech), str(MACHINES_DIR / GCODE))[0]
    return _PLANS[key]


def random_direction(rng) -> np.ndarray:
    v = rng.normal(size=3)
    return v / np.linalg.norm(v)


@dataclasses.dataclass
class Case:
    """A machine set up for runs: configuration (``[protect]`` on), controller tree, the model in
    the loop (None: the tree), the plant's model callable (exact plant) and mechanism (its tool:
    the contacts' truth), the tool force of the controller's model."""

    name: str
    config: object
    tree: object
    model: object
    plant_model: object
    plant_mech: object
    tool_force: object

    def drives(self, seed: int = 0, contact=None):
        from pkrt.drivers import open_drives

        d = open_drives(self.config, {"seed": seed} if self.config.drives.force_noise > 0 else {},
                        plant_model=self.plant_model)
        if contact is not None:
            d.inject_contact(contact)
        return d

    def run(self, plan, seed: int = 0, contact=None, log: str | None = None, compiled: bool = True) -> dict:
        from pkrt.rt.runtime.machine.run import run_session

        return run_session(self.config, self.drives(seed, contact), trajectory=plan, lockstep=True, tree=self.tree,
                           model=self.model, tool_force=self.tool_force, log_path=log, compiled=compiled)

    def contact(self, kind: str, at: float, force=(0.0, 0.0, 0.0), duration: float = math.inf,
                stiffness: float = 0.0):
        from pkrt.drivers.contact import Contact
        from pkrt.models.kinematics.tooljacobian import ToolJacobian

        return Contact(kind, at, self.config.limits.position.shape[0], ToolJacobian(self.plant_mech), force=force,
                       duration=duration, stiffness=stiffness)


def cad_case(name: str, thresholds=None, reaction: str = "stop") -> Case:
    """The CAD model on a CAD plant, ``[protect]`` on (thresholds: the configuration's unless given)."""
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.kinematics.tooljacobian import ToolJacobian
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree

    config = protected(cad_config(name), thresholds, reaction)
    mech = load_mechanism(config.model_path)
    return Case(name, config, load_controller_tree(config), None, None, mech, ToolJacobian(mech).tool_force)


def identified_case(name: str, folder: Path, duration: float | None = None, thresholds=None,
                    reaction: str = "stop") -> Case:
    """The identified model exact in the loop on the truth plant (``bench_identify.write_truth``:
    a payload off the platform's centre, the first body heavier, friction 0.75x / 0.8x, force
    noise 0.25 % of tau_max per cycle, position quantum): the model identified by
    ``identify_logs`` from a synthetic excitation log of the truth (``tests/identify_data``'s
    Fourier motion through its exact inverse dynamics, friction and force noise; ``duration``
    s: 20, the hexapod 60), its friction as the controller's feedforward. The controller's tree
    (the shipped one) only checks the reference's domain."""
    from pkrt.models.kinematics.description import MACHINES_DIR
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.kinematics.tooljacobian import ToolJacobian
    from pkrt.rt.app.identify import identify_logs
    from pkrt.rt.app.machinerun import simulated_plant_model
    from pkrt.rt.app.reference import ExactInLoop
    from pkrt.rt.bench.bench_identify import MACHINE_CONFIG, truth_levels, write_truth
    from pkrt.rt.bench.identifylog import write_log
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree

    mech = load_mechanism(name)
    truth, cfg_path = write_truth(mech, MACHINES_DIR / MACHINE_CONFIG[name], folder)
    lv = truth_levels(tomllib.loads(cfg_path.read_text()), mech)
    log = folder / "excite.pktlog"
    write_log(log, mech, truth, duration=duration or (60.0 if mech.n_act > 3 else 20.0), viscous=lv["viscous"],
              coulomb=lv["coulomb"], noise=lv["force_noise"], quantum=lv["quantum"])
    config = load_machine(str(cfg_path))
    fr = identify_logs(config, [str(log)], str(folder / "identified.toml"),
                       str(folder / "identified-machine.toml")).report["friction"]
    ctl = dataclasses.replace(config.controller, viscous=np.array(fr["viscous"]), coulomb=np.array(fr["coulomb"]),
                              model="exact")
    config = protected(dataclasses.replace(config, controller=ctl), thresholds, reaction)
    idm = load_mechanism(str(folder / "identified.toml"))
    _, plant_model = simulated_plant_model(config)
    return Case(name, config, load_controller_tree(load_machine(name)), ExactInLoop(idm), plant_model, truth,
                ToolJacobian(idm).tool_force)


def contact_figures(r: dict) -> dict:
    """What a run with a contact showed: detected, the delay from the true onset, the onset
    estimate's error, the stop's time (detection to torque off or hold), the true tool force at
    the detection and its peak, the estimate at the tool, the fault."""
    evs = r["protect"]["contacts"]
    if not evs:
        return {"detected": False, "fault": r["fault"], "peak_force_n": r["protect"].get("true_peak_tool_force_n")}
    ev = evs[0]
    true = ev.get("true") or {}
    onset = true.get("onset_s")
    return {"detected": True, "delay_s": None if onset is None else ev["time_s"] - onset,
            "onset_error_s": None if onset is None else ev["onset_s"] - onset,
            "stop_s": ev.get("reaction_time_s", 0.0 if ev["reaction"] == "torque-off" else None),
            "force_at_detection_n": true.get("tool_force_at_detection_n"),
            "peak_force_n": true.get("peak_tool_force_n"),
            "estimated_tool_force_n": (ev.get("tool_force") or {}).get("norm"),
            "estimated_step_n": (ev.get("tool_force_step") or {}).get("norm"), "axes": ev["axes"],
            "fault": r["fault"]}


def trial_times(plan, n: int, rng, margin_s: float = 0.15) -> np.ndarray:
    """``n`` random contact times within the motion (``margin_s`` from its ends, on the loop's
    period grid)."""
    T = plan.duration
    t = rng.uniform(margin_s, T - margin_s, n)
    return np.round(t * plan.rate_hz) / plan.rate_hz


def normal_runs(case: Case, seconds: float, seed0: int = 0, logs: Path | None = None) -> dict:
    """The machine's motions back to back (each a lockstep run, force noise seeded anew) for at
    least ``seconds`` of motion: runs, seconds, false alarms (contacts detected), the largest
    |residual| per actuator over them (from the runs' logs when ``logs`` is a folder: also kept
    there for ``pkrt protect tune``)."""
    plans = [motion(case.config, m) for m in MOTIONS[case.name]]
    done, runs, alarms, i = 0.0, 0, [], 0
    paths = []
    while done < seconds:
        plan = plans[i % len(plans)]
        log = str(logs / f"normal-{seed0 + i}.pktlog") if logs is not None else None
        r = case.run(plan, seed=seed0 + i, log=log)
        runs += 1
        done += r["duration_s"] or 0.0
        alarms += [{"run": runs, "motion": MOTIONS[case.name][i % len(plans)], **c} for c in r["protect"]["contacts"]]
        if log:
            paths.append(log)
        i += 1
    return {"runs": runs, "seconds": done, "false_alarms": len(alarms), "alarms": alarms[:5], "logs": paths}


__all__ = ["FORCE_N", "CLAMP", "MOTIONS", "Case", "cad_case", "identified_case", "contact_figures",
           "trial_times", "normal_runs", "motion", "protected", "random_direction"]
