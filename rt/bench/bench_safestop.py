"""The drive-side safety net, measured: SIGKILL to a running ``pkrt run`` whose drives are
emulated in processes of their own, then the time until the emulated drives stopped applying
torque by themselves (``time.monotonic()`` is one clock for every process of the host).

- serial: the Dynamixel servo emulator at the other end of a pty; the servos' Bus Watchdog
  (address 98) stops them.
- can: the CiA 402 emulator over python-can's udp_multicast; the drives' heartbeat consumer
  (0x1016) misses the master's heartbeat and carries out the abort connection option (0x6007).
  The drives' SYNC monitoring is not configured here ([drives] sync_loss_cycles = 0), so
  only the heartbeat can stop the drives.

Both run the Orthoglide demo at 100 Hz (the HIL rate of this shared 2-vCPU machine).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from pkrt.rt.runtime.machine.config import MACHINES_DIR

THETA0 = (-0.1, -0.1, -0.1)  # the demo's start: where the emulated machine stands at power-up


def machine_copy(directory: str | Path, name: str, edits: dict[str, dict[str, str]]) -> str:
    """A copy of the shipped machine configuration ``name`` in ``directory`` with ``edits``
    ({table: {key: TOML value text}}: replaced where the key is, added otherwise) and its tree
    paths made absolute. Returns the new file's path."""
    lines = (MACHINES_DIR / f"{name}.toml").read_text().splitlines()
    out, table, todo = [], None, {t: dict(kv) for t, kv in edits.items()}

    def flush(t):
        for key, value in todo.pop(t, {}).items():
            out.append(f"{key} = {value}")

    for line in lines:
        m = re.match(r"\s*\[([^\]]+)\]", line)
        if m:
            flush(table)
            table = m.group(1)
        else:
            m = re.match(r"\s*([A-Za-z_]+)\s*=", line)
            if m and table in todo and m.group(1) in todo[table]:
                line = f"{m.group(1)} = {todo[table].pop(m.group(1))}"
            elif m and m.group(1) in ("tree", "plant_tree"):
                path = re.search(r'"([^"]+)"', line).group(1)
                line = f'{m.group(1)} = "{MACHINES_DIR / path}"'
        out.append(line)
    flush(table)
    for t in list(todo):
        out.append(f"[{t}]")
        flush(t)
    path = Path(directory) / f"{name}-copy.toml"
    path.write_text("\n".join(out) + "\n")
    return str(path)


def _torque_on(report: dict) -> bool:
    on = report.get("torque_on")
    return any(on) if isinstance(on, list) else bool(on)


def _cycles(report: dict) -> int:
    return int(report.get("emulator_cycles", report.get("cycles", 0)) or 0)


class _Sniffer:
    """Every frame on a udp_multicast bus, stamped with time.monotonic() on receipt."""

    def __init__(self, group: str, port: int):
        import can

        self.bus = can.Bus(interface="udp_multicast", channel=group, port=port)
        self.frames: list[tuple[float, int, bytes]] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop:
            msg = self.bus.recv(0.02)
            if msg is not None:
                self.frames.append((time.monotonic(), msg.arbitration_id, bytes(msg.data)))

    def close(self):
        self._stop = True
        self.thread.join(1.0)
        self.bus.shutdown()


class RunEndedEarly(RuntimeError):
    """``pkrt run`` ended by itself before the kill; ``summary``: its ``--json`` summary (its
    ``fault`` and ``fault_time`` on time.monotonic()), empty when it printed none;
    ``emulator``: the emulated drives' report then."""

    def __init__(self, message: str, summary: dict, emulator: dict):
        super().__init__(message)
        self.summary, self.emulator = summary, emulator


def kill_run(bus: str, directory: str | Path, watchdog_ms: int | None = None, cycles: int = 40,
             watch_s: float = 1.0) -> dict:
    """Start the emulated drives (their own process) and ``pkrt run`` against them; once the
    loop has run ``cycles`` cycles with torque on, SIGKILL it and follow the drives for up to
    ``watch_s``. ``watchdog_ms``: Bus Watchdog (serial) or consumer time (CAN; heartbeat every
    10 ms, 0 = off); None keeps the machine's default. Returns ``kill_to_off_s`` (None when the
    drives kept torque on), the emulator's reports before and after and, for CAN, the frames
    seen on the bus (time.monotonic(), COB-ID, data) and the kill time. ``RunEndedEarly`` when
    the run stopped by itself before the kill."""
    from pkrt.hil.can_hil import CanEmulatorProcess, emulator_cpu, udp_channel
    from pkrt.hil.serial_hil import EmulatorProcess
    from pkrt.rt.runtime.machine.config import load_machine

    sniffer = None
    if bus == "serial":
        # at 100 Hz as the CAN run below (the shipped 1 kHz leaves the line no retry)
        drives = {"timeout": "0.003", "retries": "1"}
        if watchdog_ms is not None:
            drives["bus_watchdog_ms"] = str(watchdog_ms)
        path = machine_copy(directory, "orthoglide-serial", {"machine": {"rate_hz": "100.0"}, "drives": drives})
        emu = EmulatorProcess(path, None, None, 100.0)
        extra = ["--port", emu.port]
    else:
        group, port = udp_channel()
        drives = {"interface": '"udp_multicast"', "channel": f'"{group}"', "bus_options": f"{{ port = {port} }}",
                  "tpdo_timeout": "0.005", "max_missed_cycles": "2", "sync_loss_cycles": "0"}
        if watchdog_ms is not None:
            drives.update(heartbeat_ms="10" if watchdog_ms else "0", consumer_timeout_ms=str(watchdog_ms or 50))
        path = machine_copy(directory, "orthoglide-can", {"machine": {"rate_hz": "100.0"}, "drives": drives})
        config = load_machine(path)  # the emulated drives at their [emulator] priority and CPU, as pkrt hil runs them
        emu = CanEmulatorProcess(path, 100.0, "udp_multicast", group, {"port": port}, None, THETA0,
                                 config.emulator.priority, emulator_cpu(config.realtime.cpu))
        sniffer = _Sniffer(group, port)
        extra = []
    run = None
    try:
        run = subprocess.Popen([sys.executable, "-m", "pkrt.rt.cli", "run", "--machine", path, "--no-log",
                                "--duration", "60", "--json", *extra], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120.0
        before = emu.report()
        while not (_cycles(before) >= cycles and _torque_on(before)):
            if run.poll() is not None:
                try:
                    summary = json.loads(run.stdout.read() or "{}")
                except ValueError:
                    summary = {}
                report = emu.report()
                raise RunEndedEarly(f"pkrt run ended (exit {run.returncode}) before the kill: {run.stderr.read()}; "
                                    f"emulator: {report}", summary, report)
            if time.monotonic() > deadline:
                raise RuntimeError(f"pkrt run did not get going: {before}")
            time.sleep(0.02)
            before = emu.report()
        t_kill = time.monotonic()
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        after = emu.report()
        while after.get("torque_off_at") is None and time.monotonic() < t_kill + watch_s:
            time.sleep(0.01)
            after = emu.report()
    finally:
        if run is not None and run.poll() is None:
            run.kill()
            run.wait()
        final = emu.stop()
        if sniffer is not None:
            sniffer.close()
    off = after.get("torque_off_at")
    return {"bus": bus, "kill_to_off_s": None if off is None else off - t_kill, "t_kill": t_kill,
            "before": before, "after": after, "final": final,
            "frames": sniffer.frames if sniffer is not None else None}


def run_safestop_bench(repeats: int = 5) -> dict:
    """Kill-to-torque-off times (ms) per bus at the machines' default watchdog settings."""
    from pkrt.drivers.dynamixel import load_settings
    from pkrt.rt.runtime.machine.config import load_machine

    out = {"repeats": repeats,
           "serial_bus_watchdog_ms": load_settings(load_machine("orthoglide-serial"), {}).bus_watchdog_ms,
           "can_consumer_timeout_ms": 50, "can_heartbeat_ms": 10}
    with tempfile.TemporaryDirectory() as d:
        for bus in ("serial", "can"):
            t = [kill_run(bus, d)["kill_to_off_s"] for _ in range(repeats)]
            ms = np.array([np.nan if x is None else 1e3 * x for x in t])
            out[bus] = {"kill_to_off_ms_median": round(float(np.nanmedian(ms)), 1),
                        "kill_to_off_ms_max": round(float(np.nanmax(ms)), 1),
                        "kept_torque": int(np.isnan(ms).sum()), "all_ms": [round(float(x), 1) for x in ms]}
    return out


if __name__ == "__main__":
    print(json.dumps(run_safestop_bench(), indent=1))
