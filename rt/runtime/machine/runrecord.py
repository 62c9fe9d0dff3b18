"""What a run (``pkrt.rt.runtime.machine.run.Session``) records: its log (the header that names
the machine, model, tree, controller, reference and software, and the channels of each cycle),
the row staged by numpy slices (the cycle before its fused staging: benchmarks), and the
summary the log is closed with. Units: actuator units (m or rad, N or N m), seconds,
microseconds (``*_us``).
"""

from __future__ import annotations

import numpy as np

from pkrt.rt.core.tree import Tree
from pkrt.rt.core.versions import software_versions
from pkrt.rt.runtime.cycle.loop import percentiles_us
from pkrt.rt.runtime.machine.runsetup import channel_list, file_hash, run_inputs


def open_log(r, tree: Tree, trajectory, extra) -> None:
    """Run ``r``'s log writer and its row (``row``, ``slices``, ``views``): a ``LogWriter`` with the
    run's header when it has a log path, a plain row for telemetry only, or the staging kernel's
    row alone. ``extra``: the channels beyond the run's (``protect.channels``)."""
    config, s, units, c = r.config, tree.s, r.units, r.config.controller
    r.writer = None
    r.row = r.slices = r.views = None
    if r.log_path:
        from pkrt.rt.runtime.record.logfile import LogWriter
        from pkrt.rt.core.outputs import check_output

        check_output(r.log_path, "log", run_inputs(config, trajectory))
        r.stop_signals.abort = False  # a signal only asks while the log opens: a half-made writer cannot be closed
        header = {"machine": config.raw, "machine_path": config.path,
                  "model_name": tree.header.get("model", {}).get("name"),
                  "model_hash": tree.header.get("model", {}).get("content_hash"), "tree_path": config.tree,
                  "tree_hash": file_hash(config.tree), "rate_hz": config.rate_hz, "axes": r.axes,
                  "units": units, "controller": {"kind": r.kind, "model": r.model_kind, "kp": c.kp.tolist(),
                                                 "kd": c.kd.tolist(), "tau_max": c.tau_max.tolist()},
                  "trajectory": r.ref.description, "lockstep": r.lockstep,
                  "versions": software_versions(("pkrt", "numpy", "numba")), "plant": r.drives.describe()}
        r.writer = LogWriter(r.log_path, header, channel_list(s, units[0], extra))
        r.row, r.slices, r.views = r.writer.row, r.writer.slices, r.writer.views
    elif r.telemetry is not None:  # no log: the same staging row, for telemetry only
        sl, n = {}, 0
        for name, width, _ in channel_list(s, units[0], extra):
            sl[name], n = slice(n, n + width), n + width
        r.row, r.slices = np.zeros(n), sl
        r.views = {name: r.row[x] for name, x in sl.items()}
    else:  # neither: the staging kernel still records the error
        r.row = np.zeros(4 + 7 * s + sum(w for _, w, _ in extra))


def stage_views(r, k: int, t: float, fb, wake_s: float, flags: int, refs: tuple, comp: float) -> None:
    """The cycle's log row and telemetry sample by numpy slice assignments (``old_cycle``);
    ``refs``: the cycle's reference (pos, vel, acc), ``comp``: the cycle's compute time (s)."""
    v = r.views
    v["t"][0] = t
    v["ref_pos"][...], v["ref_vel"][...], v["ref_acc"][...] = refs
    v["pos"][...] = fb.position
    v["vel"][...] = fb.velocity
    v["tau"][...] = r.ctrl.tau if r.drives.torque_on else 0.0
    v["tau_model"][...] = r.ctrl.tau_model
    v["wake_us"][0] = wake_s * 1e6
    v["compute_us"][0] = comp * 1e6
    v["flags"][0] = flags
    if r.writer:
        r.writer.commit()
    if r.telemetry is not None:
        r.telemetry.maybe_send(k, t, r.row, r.slices)


def summary(r) -> dict:
    """Run ``r``'s summary (errors in actuator units, times in microseconds); the log is closed with it."""
    ran, period, cycles, wall, parts = r.ran, r.period, r.cycles, r.wall, r.parts
    fault, errs = r.fault_reason, r.errs
    compute, wake = percentiles_us(r.comp[ran]), percentiles_us(r.wake[ran])
    if cycles:  # the ring keeps the last cycles' percentiles; the maxima are the whole run's
        compute["max"], wake["max"] = r.comp_max * 1e6, r.wake_max * 1e6
    summary = {
        "machine": r.config.name, "controller": r.kind, "model": r.model_kind,
        "lockstep": r.lockstep,
        "compiled_cycles": r.block.cycles if r.block is not None else 0,
        "rate_hz": r.config.rate_hz,
        "duration_s": cycles and (r.last_k * period), "cycles": cycles,
        "overruns": r.overruns, "faults": int(fault is not None), "fault": fault,
        "fault_cycle": r.fault_cycle, "fault_time": r.fault_time, "torque_off_cycle": r.torque_off_cycle,
        "pacing": "lockstep" if r.lockstep else r.pacing, "host_delays": r.delays.summary(),
        **errs.summary(),
        "units": r.units, "saturated_cycles": r.saturated,
        "compute_us": compute, "wake_latency_us": wake,
        "timing_window_cycles": min(cycles, r.window),  # the percentiles' sample: the last cycles
        # the cycle's parts: drivers (read + write + the simulated plant's step), controller
        # (model + law), the loop's own overhead (safety, bookkeeping, log and telemetry
        # staging); each part in ``cycle_parts`` (p50, p99, max and mean, us), over the whole run
        "drive_us": parts.percentiles_us("drives"), "controller_us": parts.percentiles_us("controller"),
        "loop_overhead_us": parts.percentiles_us("overhead"),
        "cycle_without_drives_us": parts.percentiles_us("without_drives"),
        "cycle_parts": parts.summary(),
        # loop time covered (skipped periods included: the loop kept the wall clock's pace) per wall second
        "realtime_factor": ((r.last_k + 1) * period / wall) if wall > 0 else None,
        # the same per second of the loop thread's CPU time (what a loaded host does not change)
        "realtime_factor_cpu": ((r.last_k + 1) * period / r.cpu) if r.cpu > 0 else None,
        "realtime": r.rt_report or {"mode": "lockstep" if r.lockstep else "not requested"},
        "trajectory": r.ref.description.get("kind"), "reference_stream": r.ref.figures(),
        "log": r.log_path, "program_events": r.next_event, "outputs": r.drives.output_changes,
        "drives": r.drives.describe(), "memory": r.memory,
        "protect": r.protect.summary(),
    }
    if r.writer:
        counts = r.writer.close({k2: v2 for k2, v2 in summary.items() if k2 != "realtime"})
        summary["log_dropped_blocks"] = counts.get("dropped_blocks")
        summary["log_rows_written"] = counts.get("rows_written")
        summary["log_error"] = counts.get("error")  # e.g. disk full: says where the log stops
    return summary
