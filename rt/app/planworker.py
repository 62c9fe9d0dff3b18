"""Planning of a served machine's motions out of the loop's process: a worker process
(spawn context, started with the server and warmed up: imports and the machine's model loaded)
plans what needs the model (the demo, a task-space CSV: inverse kinematics, time-optimal
timing; task-space moves and jogs: lines through the inverse kinematics) and sends back the
planned arrays (positions, velocities, accelerations at the loop rate). Planning in the loop's
process holds the interpreter lock and the loop's CPU: task-space moves and jogs planned in
the server's thread (20-250 ms each) made the loop's cycles take up to 1.3 ms of CPU time and
11 of them late in 20 requests (loop at SCHED_FIFO; ``pkrt bench --only serve``, ``task_motion``). Units: actuator (m or
rad), seconds.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import Planned, csv_columns

_PLANNER = None  # the worker process' Planner (built by ``_init``)


GCODE_SUFFIXES = (".ngc", ".nc", ".gcode", ".tap", ".cnc", ".g")


def is_gcode(file: str) -> bool:
    """A G-code program: by its suffix, or a text file that is not a CSV (``pkrt plan`` takes
    every file but a .csv for G-code)."""
    from pkrt.rt.core.filekind import CSV, sniff

    suffix = Path(file).suffix.lower()
    if suffix in GCODE_SUFFIXES:
        return True
    return file != "demo" and suffix != ".csv" and sniff(file) != CSV


def needs_model(file: str, axes: list[str]) -> bool:
    """A program planned from the model: the demo, a G-code program, or a CSV of task
    coordinates (its columns after ``t`` start with ``x`` and are not the actuators' names);
    an actuator CSV is not."""
    if file == "demo" or is_gcode(file):
        return True
    cols = csv_columns(file)
    return cols is not None and cols[1:2] == ["x"] and cols[1:] != axes


def plan_program(planner, file: str, theta0: np.ndarray, axes: list[str], speed: float) -> Planned:
    """The program ``file`` ("demo", a G-code program or a CSV path) at the loop rate, starting
    where the machine is (``theta0``): a joint move to its first point put first if needed
    (``program_from``)."""
    from pkrt.rt.app.planner import program_from
    from pkrt.rt.app.reference import plan_reference

    with planner._lock:
        gcode = file if file != "demo" and is_gcode(file) else None
        ref = plan_reference(planner.config, None if gcode else file, mech=planner._mech, axes=axes, gcode=gcode)
    if not isinstance(ref, Planned):
        from pkrt.rt.runtime.machine.trajectory import load_trajectory_csv

        ref = load_trajectory_csv(ref, planner.config.rate_hz, axes)
    return program_from(planner, ref, theta0, axes, speed)


def _init(config, settings) -> None:
    global _PLANNER
    from pkrt.rt.app.planner import Planner

    _PLANNER = Planner(config, settings)


def _warm() -> float:
    """Imports and the machine's model loaded in the worker (s it took)."""
    t0 = time.perf_counter()
    import pkrt.models.kinematics.taskspace  # noqa: F401 (the planning modules, imported once)
    from pkrt.rt.app.reference import machine_mechanism, warm_gcode_check

    try:
        _PLANNER._mech = machine_mechanism(_PLANNER.config)
        warm_gcode_check(_PLANNER.config, _PLANNER._mech)  # the G-code check's kernels loaded
    except Exception:  # noqa: BLE001 - a machine without a model plans only actuator CSVs
        pass
    return time.perf_counter() - t0


def _plan(file: str, theta0: np.ndarray, axes: list[str], speed: float):
    """In the worker: ("ok", Planned) or ("error", one line)."""
    try:
        return "ok", plan_program(_PLANNER, file, theta0, axes, speed)
    except UserError as e:
        return "error", str(e)
    except Exception as e:  # noqa: BLE001 - a plan that fails in the model: one line
        return "error", f"cannot be planned: {type(e).__name__}: {e}"


def _task(spec: dict, theta0: np.ndarray, axes: list[str]):
    """In the worker: ("ok", (Planned, continuous)) or ("error", one line)."""
    try:
        return "ok", _PLANNER.task_motion(theta0, spec, axes)
    except UserError as e:
        return "error", str(e)
    except Exception as e:  # noqa: BLE001 - a plan that fails in the model: one line
        return "error", f"cannot be planned: {type(e).__name__}: {e}"


def _travel(theta0: np.ndarray, direction: np.ndarray, most: float):
    """In the worker: ("ok", (distance, what stops it)) or ("error", one line)."""
    try:
        with _PLANNER._lock:
            return "ok", _PLANNER.travel(theta0, direction, most)
    except UserError as e:
        return "error", str(e)
    except Exception as e:  # noqa: BLE001 - a model that fails: one line
        return "error", f"cannot be computed: {type(e).__name__}: {e}"


class PlanWorker:
    """One planning process for one served machine. ``submit`` returns a ``Future`` whose
    result is ("ok", Planned) or ("error", message)."""

    def __init__(self, config, settings):
        self.config, self.settings = config, settings
        self._lock = threading.Lock()
        self.warm_s: float | None = None
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        """The pool, its process spawned at normal scheduling (``at_normal_priority``: the
        server's threads may be real-time), its threads started here (they keep this thread's
        scheduling: at normal priority, ordinary load could hold one while it holds the
        interpreter lock the loop needs)."""
        from pkrt.rt.runtime.cycle.loop import at_normal_priority

        def spawn() -> ProcessPoolExecutor:
            pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                       initargs=(self.config, self.settings))
            pool._adjust_process_count()  # the process, now (CPython spawns it in the first submit)
            return pool
        pool = at_normal_priority(spawn)
        pool.submit(_warm).add_done_callback(self._warmed)
        return pool

    def _warmed(self, fut: Future) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.warm_s = fut.result()

    def submit(self, file: str, theta0: np.ndarray, axes: list[str], speed: float) -> Future:
        """Plan the program ``file`` (``plan_program``)."""
        return self._submit(_plan, file, theta0, list(axes), speed)

    def submit_task(self, spec: dict, theta0: np.ndarray, axes: list[str]) -> Future:
        """Plan a task-space move or jog (``Planner.task_motion``)."""
        return self._submit(_task, spec, theta0, list(axes))

    def submit_travel(self, theta0: np.ndarray, direction: np.ndarray, most: float) -> Future:
        """The largest travel of the tool along ``direction`` (``Planner.travel``)."""
        return self._submit(_travel, theta0, direction, most)

    def _submit(self, fn, *args) -> Future:
        from concurrent.futures.process import BrokenProcessPool

        with self._lock:
            try:
                return self._pool.submit(fn, *args)
            except (BrokenProcessPool, RuntimeError):  # the worker died (killed, out of memory): a new one
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = self._start()
                return self._pool.submit(fn, *args)

    def close(self) -> None:
        """Stop the worker at once (a plan under way is abandoned)."""
        with self._lock:
            pool = self._pool
            procs = list(getattr(pool, "_processes", {}).values())  # no public way to end a busy worker
            pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                p.terminate()
            for p in procs:
                p.join(5.0)
