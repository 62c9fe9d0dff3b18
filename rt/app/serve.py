"""A served machine from its configuration: the tree, the drives, the loop (``Machine``), the
planner and the control socket (``Server``), started together and torn down together."""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

import numpy as np

from pkrt.rt.app.machinerun import tool_force
from pkrt.rt.app.planner import Planner
from pkrt.rt.app.planworker import PlanWorker
from pkrt.rt.app.server import Server
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.machine.served import Machine
from pkrt.rt.runtime.machine.settings import ServeSettings


def default_socket() -> str:
    """``$XDG_RUNTIME_DIR/pkrt.sock`` (a per-user directory), else ``/tmp/pkrt-UID.sock``."""
    d = os.environ.get("XDG_RUNTIME_DIR")
    return str(Path(d) / "pkrt.sock") if d and Path(d).is_dir() else f"/tmp/pkrt-{os.getuid()}.sock"


def write_token(path: str) -> str:
    """A fresh random token written owner-only to ``path``."""
    tok = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(tok + "\n")
    os.chmod(path, 0o600)
    return tok


class Served:
    """Everything of one served machine. ``start`` runs the loop in a thread (tests, benches);
    ``pkrt serve`` runs ``machine.run`` in its main thread instead. ``hil`` ("can" or
    "serial"): the machine's real driver against its drive emulator in a process of its own,
    stepped timing (``pkrt.rt.app.hil.served_hil_drives``), instead of its configured drives.
    ``plan_process``: programs that need the model (the demo, task-space CSVs) are planned in
    a worker process (``PlanWorker``), never in the loop's process (False: in the server's
    thread, as before issue 23's fix; benchmarks compare the two)."""

    def __init__(self, machine_name, *, socket_path: str | None = None, lockstep: bool = False,
                 log_path: str | None = None, telemetry=None, realtime: bool = False, tcp_port: int | None = None,
                 token: str | None = None, settings: ServeSettings | None = None, overrides: dict | None = None,
                 hil: str | None = None, plan_process: bool = True, inject: str | None = None):
        from pkrt.drivers import open_drives
        from pkrt.rt.runtime.machine.runsetup import load_controller_tree

        from pkrt.rt.core.errors import UserError

        self.emulator = None
        self.emulator_report: dict | None = None
        if hil is not None:
            from pkrt.rt.app.hil import served_hil_config

            if lockstep:
                raise UserError("--bus (HIL emulators) runs in real time (stepped): not with --lockstep")
            if not isinstance(machine_name, (str, Path)):
                raise UserError("a HIL machine is given by its configuration's name or path")
            machine_name = served_hil_config(str(machine_name), hil)
        # a configuration's name or path, or a loaded MachineConfig (tests: a changed rate)
        self.config = config = load_machine(machine_name) if isinstance(machine_name, (str, Path)) else machine_name
        tree = load_controller_tree(config)
        sim = config.backend == "sim"
        if sim and config.drives.plant == "exact":
            raise UserError(f"{config.path}: serving a plant on the exact model is not supported (use a plant tree)")
        if inject is not None and (hil is not None or not sim):
            raise UserError("--inject: the simulated plant in this process only (a drive emulator takes its faults "
                            "from pkrt hil --fault and --inject)")
        self.settings = settings or ServeSettings()
        start = self._start(config, tree)
        if hil is not None:
            from pkrt.rt.app.hil import served_hil_drives

            self.drives, self.emulator = served_hil_drives(config, hil, start)
        else:
            self.drives = open_drives(config, overrides or {})
        try:
            mech = _mechanism(config, inject)
            if inject is not None:
                _inject(config, self.drives, inject, mech)
            self.planner = Planner(config, self.settings)
            self.machine = Machine(config, self.drives, tree, start=start, lockstep=lockstep, log_path=log_path,
                                   telemetry=telemetry, settings=self.settings, realtime=realtime,
                                   pacing="delay" if hil is not None else None, guard=self._guard(start),
                                   tool_force=tool_force(config, mech))
            self.worker = PlanWorker(config, self.settings) if plan_process else None
            self.socket_path = socket_path or default_socket()
            self.server = Server(self.machine, self.planner, self.socket_path, tcp_port=tcp_port, token=token,
                                 worker=self.worker)
        except BaseException:
            self.close_worker()
            self.drives.close()
            self.stop_emulator()
            raise
        self.thread: threading.Thread | None = None
        self.summary: dict | None = None

    def _guard(self, start: np.ndarray):
        """The loop's guard of streams and velocity jogs (``pkrt.models.kinematics.passive.Guard``:
        the passive joints and capsules at each cycle's stopping point), None when the model
        declares none; warmed up here (its first call assembles from the reference)."""
        check = self.planner.passive
        if check is None:
            return None
        from pkrt.models.kinematics.passive import Guard

        guard = Guard(check.mech, check.passive)
        guard(start, start)
        return guard

    @staticmethod
    def _start(config, tree) -> np.ndarray:
        """Where a simulated plant starts: actuators at zero (the reference assembly of the
        shipped models) when that is in range, else the middle of the ranges."""
        lo, hi = config.limits.position[:, 0], config.limits.position[:, 1]
        ref = np.zeros(tree.s)
        if np.all(ref >= lo) and np.all(ref <= hi):
            return ref
        return 0.5 * (lo + hi)

    def start(self, **run_args) -> "Served":
        def target():
            self.summary = self.machine.run(**run_args)

        self.thread = threading.Thread(target=target, name="pkrt-machine-loop", daemon=True)
        self.thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        self.machine.shutdown("served machine closed")
        if self.thread is not None:
            self.thread.join(timeout)
        self.server.close()
        self.close_worker()
        self.drives.close()
        self.stop_emulator()

    def close_worker(self) -> None:
        w, self.worker = getattr(self, "worker", None), None
        if w is not None:
            w.close()

    def stop_emulator(self) -> dict | None:
        """Stop the HIL emulator process (if any); its final report."""
        em, self.emulator = self.emulator, None
        if em is None:
            return None
        self.emulator_report = em.stop()
        return self.emulator_report

    def __enter__(self) -> "Served":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _mechanism(config, inject: str | None):
    """The machine's model when the served machine needs it: for the tool force behind a
    contact (``[protect]`` enabled) or for an injected contact's tool; else None (not loaded)."""
    if not config.protect.enabled and (inject or "").partition("@")[0] not in ("contact", "clamp"):
        return None
    from pkrt.rt.app.reference import machine_mechanism

    return machine_mechanism(config)


def _inject(config, drives, spec: str, mech) -> None:
    """Arm ``KIND@T[=VALUE]`` (``pkrt run --inject``'s faults and contacts) on the simulated
    plant, T in s of the plant's clock (from the machine's start); a contact acts through the
    tool of the plant's own model (``mech``: the machine's, for a contact)."""
    from pkrt.rt.app.machinerun import plant_mechanism, sim_fault
    from pkrt.rt.core.errors import UserError

    kind = spec.partition("@")[0]
    if kind == "slow":
        raise UserError("--inject slow: a run's watchdog test (pkrt run --inject slow@T), not a served machine's")
    sim_fault(drives, spec, config.rate_hz, plant_mechanism(config, mech) if kind in ("contact", "clamp") else None)
