"""A machine run set up from its configuration: what ``pkrt run`` does between parsing and
printing. It wires the layers together: the configuration (runtime), the drives (drivers), the
reference and the exact model (planned from the models here, before the run), live views, the
loop (``run_session``), and after the run the tool channels and the plot (from the log, never in
the loop). Times in s, rates in Hz."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from pkrt.rt.core.errors import OutputError, UserError
from pkrt.rt.core.outputs import check_outputs
from pkrt.rt.core.plan import Planned
from pkrt.rt.runtime.machine.config import MachineConfig, load_machine

SIM_FAULTS = ("nan", "stale", "push", "freeze", "slow", "contact", "clamp")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a user may ask of a run (``pkrt run``'s options, by the same names)."""

    machine: str = "orthoglide"
    traj: str | None = None  # CSV (actuators or task coordinates) or ROS 2 bag; None: the [demo]
    gcode: str | None = None  # a G-code program (tool in x, y, z), planned in minimum time
    topic: str | None = None  # bag topic
    rate: float | None = None  # Hz; None: the configuration's
    duration: float | None = None  # s; cut the trajectory or hold its end
    lockstep: bool = False
    controller: str | None = None  # "ct" or "pd"
    model: str | None = None  # "tree" or "exact"
    mass_scale: float | None = None  # simulated plant only
    log: str | None = "pkrt-run.pktlog"  # None: no log and no plot
    plot: str | None = None  # None: the log path with .png
    realtime: bool = True  # False: none of the configuration's real-time settings
    inject: str | None = None  # KIND@T[=VALUE], simulated plant fault or contact
    telemetry: str | None = None  # HOST:PORT
    telemetry_rate: float = 50.0  # messages per second
    foxglove: str | None = None  # [HOST:]PORT
    interface: str | None = None  # CAN
    channel: str | None = None  # CAN
    port: str | None = None  # serial
    measure: str | None = None  # CSV: the simulated instrument's readings at the run's dwells (sim only)


# rows of a log whose tool channels ``pkrt run`` computes after the run: 100 s at 1 kHz, 5-12 s
# of forward kinematics; a 1 h lockstep run with a log (3.6 M rows) would take minutes, and a run
# stopped by SIGTERM would outlast systemd's 90 s before SIGKILL
TOOL_ROWS_AFTER_RUN = 100_000


def machine_config(opts: RunOptions) -> MachineConfig:
    """The configuration with the run's overrides (rate, model in the loop, real-time settings)."""
    config = load_machine(opts.machine)
    if opts.rate is not None:
        if not 1 <= opts.rate <= 100000:
            raise UserError("--rate must be in [1, 100000] Hz")
        config = dataclasses.replace(config, rate_hz=float(opts.rate))
    if opts.model is not None:
        config = dataclasses.replace(config, controller=dataclasses.replace(config.controller, model=opts.model))
    if not opts.realtime:
        config = dataclasses.replace(config, realtime=dataclasses.replace(
            config.realtime, priority=0, cpu=-1, mlockall=False))
    return config


def sim_fault(drives, spec: str, rate: float, plant_mech=None):
    """Arm ``KIND@T[=VALUE]`` on the simulated plant; returns an ``on_cycle`` hook for ``slow``
    (a cycle that overruns by 2.5 periods: the watchdog's test), else None. ``contact@`` and
    ``clamp@`` (``pkrt.rt.app.contact``) act through the tool of ``plant_mech``."""
    if spec.partition("@")[0] in ("contact", "clamp"):
        from pkrt.rt.app.contact import arm_contact

        arm_contact(drives, spec, plant_mech)
        return None
    try:
        kind, rest = spec.split("@", 1)
        at, _, val = rest.partition("=")
        at_s = float(at)
        value = float(val) if val else 200.0
    except ValueError:
        raise UserError(f"--inject: expected KIND@T or push@T=FORCE, got '{spec}'") from None
    if not (math.isfinite(at_s) and math.isfinite(value)):  # nan@nan would never fire
        raise UserError(f"--inject: time and force must be finite numbers, got '{spec}'")
    if kind not in SIM_FAULTS:
        raise UserError(f"--inject: unknown fault '{kind}' ({', '.join(SIM_FAULTS)})")
    if kind == "slow":
        def hook(k, t):
            if t >= at_s:
                time.sleep(2.5 / rate)
        return hook
    if not hasattr(drives, "inject"):
        raise UserError("--inject works with the simulated plant only (use pkrt hil --fault for drives)")
    drives.inject(kind, at_s, value)
    return None


class LiveViews:
    """The run's live views (UDP telemetry, Foxglove), closed on every way out."""

    def __init__(self, opts: RunOptions, axes: list[str], units: list[str], extra=()):
        self.telemetry = self.foxglove = None
        if opts.telemetry:
            from pkrt.rt.runtime.record.telemetry import Telemetry

            host, _, port = opts.telemetry.rpartition(":")
            if not host or not (port.isascii() and port.isdigit()):
                raise UserError(f"--telemetry: expected HOST:PORT, got '{opts.telemetry}'")
            self.telemetry = Telemetry(host, int(port), opts.telemetry_rate, axes=axes)
        if opts.foxglove:
            from pkrt.rt.runtime.logs.foxglovelive import FoxgloveLive, announce, parse_address
            from pkrt.rt.runtime.machine.runsetup import channel_list

            try:
                self.foxglove = FoxgloveLive(*parse_address(opts.foxglove), opts.telemetry_rate, axes,
                                             channel_list(len(axes), units[0], extra))
            except BaseException:
                self.close()
                raise
            announce(self.foxglove)

    def sink(self):
        """One telemetry sink for the loop (None, one view, or both behind a ``Fanout``)."""
        from pkrt.rt.runtime.record.telemetry import Fanout

        sinks = [x for x in (self.telemetry, self.foxglove) if x is not None]
        return sinks[0] if len(sinks) == 1 else Fanout(sinks) if sinks else None

    def stats(self, summary: dict) -> None:
        if self.telemetry is not None:
            summary["telemetry"] = self.telemetry.stats()
        if self.foxglove is not None:
            summary["foxglove"] = self.foxglove.stats()

    def close(self) -> None:
        for x in (self.telemetry, self.foxglove):
            if x is not None:
                x.close()


def plant_mechanism(config: MachineConfig, mech):
    """The simulated plant's model: ``plant_model`` of its table (a truth the controller's model
    does not know, same actuators), else the machine's model ``mech``."""
    if config.plant_model_path == config.model_path:
        return mech
    from pkrt.models.kinematics.mechanism import load_mechanism

    plant = load_mechanism(config.plant_model_path)
    if plant.actuator_names != mech.actuator_names:
        raise UserError(f"{config.path}: [drives] plant_model {config.plant_model_path}: actuators "
                        f"{', '.join(plant.actuator_names)}, the machine's model has "
                        f"{', '.join(mech.actuator_names)}")
    return plant


def run_reference(config: MachineConfig, opts: RunOptions, axes: list[str], mech=None):
    """The run's reference: a ROS 2 bag's joint states, or the demo / a task-space CSV / a G-code
    program planned from the model, or an actuator CSV's path (the runtime reads it)."""
    from pkrt.rt.runtime.logs.rosbag import is_bag

    if opts.traj and is_bag(opts.traj):
        from pkrt.rt.runtime.logs.rosbag import DEFAULT_TOPIC, trajectory_from_bag

        return trajectory_from_bag(opts.traj, config.rate_hz, axes, opts.topic or DEFAULT_TOPIC)
    if opts.topic:
        raise UserError("--topic applies to a ROS 2 bag given with --traj")
    from pkrt.rt.app.reference import plan_reference

    return plan_reference(config, opts.traj, mech=mech, axes=axes, gcode=opts.gcode)


def run_outputs(config: MachineConfig, opts: RunOptions) -> tuple[str | None, str | None]:
    """The run's log and plot paths, checked before anything runs (never over an input)."""
    from pkrt.rt.runtime.machine.runsetup import run_inputs

    log = opts.log
    plot = (opts.plot or str(Path(log).with_suffix(".png"))) if log else None
    if opts.gcode and opts.traj:
        raise UserError("give --traj or --gcode, not both")
    if opts.measure is not None:
        if config.backend != "sim":
            raise UserError(f"--measure: the simulated instrument reads the simulated plant's tool ([drives] backend "
                            f"= \"sim\"; this machine's is \"{config.backend}\"); on real drives, measure the tool "
                            f"with your instrument at each dwell and give its file to pkrt calibrate")
        if not log:
            raise UserError("--measure: the readings are taken at the dwells of the run's log; drop --no-log")
    check_outputs({"--log": log, "--plot": plot, "--measure": opts.measure},
                  run_inputs(config, opts.traj or opts.gcode))
    return log, plot


def simulated_plant_model(config: MachineConfig):
    """(the machine's mechanism, the simulated plant's exact model) for ``plant = "exact"``;
    (None, None) otherwise (a plant tree, or real drives)."""
    if config.backend != "sim" or config.drives.plant != "exact":
        return None, None
    from pkrt.rt.app.reference import ExactInLoop, machine_mechanism

    mech = machine_mechanism(config)
    return mech, ExactInLoop(plant_mechanism(config, mech))


def exact_model_for(config: MachineConfig, traj, axes: list[str], lockstep: bool):
    """The reference as planned arrays, the exact model for the loop and its cost per call
    measured before the loop (``[controller] model = "exact"``)."""
    from pkrt.rt.app.reference import exact_model

    traj = planned_reference(config, traj, axes)
    model, figures = exact_model(config, traj, lockstep)
    return traj, model, figures


def run_machine(opts: RunOptions) -> dict:
    """Run the machine as ``opts`` asks; return the run's summary (``run_session``'s, plus
    ``lockstep_by``, ``exact_model_us``, live view figures, ``tool_channels``, ``tool_error``,
    ``plot``/``plot_error``). Drives, ports and sockets are released on every way out."""
    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree, tree_axes
    from pkrt.rt.runtime.machine.run import run_session

    config = machine_config(opts)
    overrides = {k: v for k, v in (("interface", opts.interface), ("channel", opts.channel),
                                   ("port", opts.port), ("mass_scale", opts.mass_scale)) if v is not None}
    log, plot = run_outputs(config, opts)
    tree = load_controller_tree(config)
    axes, units = tree_axes(tree)
    by_config = config.backend == "sim" and config.drives.lockstep and not opts.lockstep  # a plant too slow
    lockstep = opts.lockstep or by_config                                                 # for real time
    mech, plant_model = simulated_plant_model(config)
    contact = opts.inject is not None and opts.inject.partition("@")[0] in ("contact", "clamp")
    if mech is None and (contact or config.protect.enabled):  # the tool's Jacobian: contacts, their forces
        from pkrt.rt.app.reference import machine_mechanism

        mech = machine_mechanism(config)
    drives = open_drives(config, overrides, plant_model=plant_model)
    views = None
    plant_positions = None
    try:
        plant_mech = plant_mechanism(config, mech) if contact and config.backend == "sim" else None
        slow = sim_fault(drives, opts.inject, config.rate_hz, plant_mech) if opts.inject is not None else None
        from pkrt.rt.runtime.machine.protect import run_channels

        views = LiveViews(opts, axes, units, run_channels(config, drives, len(axes)))  # the run's log channels
        traj, model, exact_figures = checked_reference(config, opts, axes, mech, lockstep)
        hook = slow
        if opts.measure is not None:  # the plant's own positions where the reference rests
            from pkrt.rt.app.measurements import PlantPositions

            traj = planned_reference(config, traj, axes)
            hook = plant_positions = PlantPositions(drives, traj, slow)
        summary = run_session(config, drives, trajectory=traj, duration=opts.duration, model=model,
                              lockstep=lockstep, log_path=log, controller=opts.controller,
                              telemetry=views.sink(), on_cycle=hook, tree=tree,
                              pacing="skip" if slow is not None else None,  # --inject slow: the watchdog's test
                              tool_force=tool_force(config, mech))
    finally:
        drives.close()
        if views is not None:
            views.close()
    if by_config:
        summary["lockstep_by"] = "[drives] lockstep = true"
    if exact_figures is not None:
        summary["exact_model_us"] = exact_figures  # before the loop; in the loop: controller_us
    views.stats(summary)
    if log:
        after_run(summary, log, plot)
    if plant_positions is not None:
        summary.update(_measurements(config, mech, log, plant_positions, opts.measure))
    return summary


def checked_reference(config: MachineConfig, opts: RunOptions, axes: list[str], mech, lockstep: bool):
    """The run's reference checked before motion (a G-code program is checked as it is planned,
    with its lines), and the exact model for the loop when the controller uses it: (traj, model
    or None, its figures or None)."""
    traj = run_reference(config, opts, axes, mech)
    if opts.gcode is None:
        from pkrt.rt.app.reference import check_reference

        check_reference(config, traj, axes, mech)
    if config.controller.model == "exact":  # built here from the model, measured before the loop
        return exact_model_for(config, traj, axes, lockstep)
    return traj, None, None


def _measurements(config: MachineConfig, mech, log, plant_positions, measure: str) -> dict:
    """``--measure``: the simulated tracker's readings of the true tool at the run's dwells,
    written to ``measure``: {"measure": figures} or {"measure_error": why}."""
    from pkrt.rt.app.measurements import measure_run
    from pkrt.rt.app.reference import machine_mechanism

    try:
        plant = plant_mechanism(config, mech or machine_mechanism(config))
        return {"measure": measure_run(config, plant, log, plant_positions, measure)}
    except (OSError, UserError) as e:
        return {"measure_error": str(e)}


def planned_reference(config: MachineConfig, traj, axes: list[str]) -> Planned:
    """The reference as planned arrays (an actuator CSV loaded as the runtime would)."""
    from pkrt.rt.runtime.machine.trajectory import load_trajectory_csv

    return traj if isinstance(traj, Planned) else load_trajectory_csv(traj, config.rate_hz, axes)


def tool_force(config: MachineConfig, mech):
    """The tool force behind a contact's residual (``pkrt.rt.app.contact.tool_force_of``) when
    ``[protect]`` is enabled."""
    if not config.protect.enabled or mech is None:
        return None
    from pkrt.rt.app.contact import tool_force_of

    return tool_force_of(mech)


def after_run(summary: dict, log: str, plot: str) -> None:
    """Tool channels (forward kinematics of the log, for a log of at most
    ``TOOL_ROWS_AFTER_RUN`` rows) and the plot, into ``summary``; a failure is reported there
    (``plot_error``), never raised: the run and its log stand."""
    try:
        from pkrt.rt.app.toolchannels import tool_channels, tool_error
        from pkrt.rt.runtime.record.logfile import read_log
        from pkrt.rt.runtime.logs.logstats import plot_log

        data = read_log(log)
        if data.n_cycles > TOOL_ROWS_AFTER_RUN:  # a long run (or one stopped by a signal) ends promptly
            tool = {"channels": [], "coordinates": [], "rows": data.n_cycles, "seconds": 0.0,
                    "note": f"tool channels left out after the run: {data.n_cycles} rows, more than "
                            f"{TOOL_ROWS_AFTER_RUN} (27-59 us of forward kinematics a row and channel); "
                            f"'pkrt log plot' and 'pkrt log export --csv/--mcap' compute them"}
        else:
            data, tool = tool_channels(data)
        summary["tool_channels"] = tool
        summary["tool_error"] = tool_error(data)
        plot_log(data, plot)
        summary["plot"] = plot
    except (ImportError, OSError, UserError, OutputError) as e:
        summary["plot"] = None
        summary["plot_error"] = str(e)
