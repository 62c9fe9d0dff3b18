"""Export formats and the Foxglove live view. Figures only, medians, side by side in one run.

- Export of a 10 s lockstep run of the Orthoglide demo (10001 cycles at 1 kHz): cycles per
  second and bytes per cycle for MCAP (JSON channels), ROS 2 bag (MCAP storage, CDR
  JointState) and CSV (median of 3 each).
- The loop with ``--foxglove`` and one subscribed WebSocket client (another process, as
  Foxglove is), with ``--foxglove`` and no client, and without: real-time runs of the same
  reference (alternating, 3 rounds each; medians), compute and wake-latency p99, and
  the per-call cost of the telemetry hook (idle: no client; staging a row: client subscribed).

Run: ``.venv/bin/python -m pkrt.rt.bench.bench_formats`` or ``pkrt bench --only formats``
(about a minute).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

EXPORT_SECONDS = 10.0
LOOP_SECONDS = 5.0


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def export_figures(log, tmp: Path, repeats: int = 3) -> dict:
    from pkrt.rt.runtime.logs.logstats import export_csv
    from pkrt.rt.runtime.logs.mcapexport import export_mcap
    from pkrt.rt.runtime.logs.rosbag import export_ros2

    out = {}
    for name, fn, suffix in (("mcap_json", export_mcap, ".mcap"), ("ros2_bag", export_ros2, ""),
                             ("csv", export_csv, ".csv")):
        times = []
        for i in range(repeats):
            p = tmp / f"{name}{i}{suffix}"
            t0 = time.perf_counter()
            fn(log, str(p))
            times.append(time.perf_counter() - t0)
            size = _size(p)
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        med = float(np.median(times))
        out[name] = {"seconds_median": med, "cycles_per_s": log.n_cycles / med, "bytes_per_cycle": size / log.n_cycles}
    for name in ("mcap_json", "ros2_bag"):
        out[f"{name}_over_csv"] = {"speed": out[name]["cycles_per_s"] / out["csv"]["cycles_per_s"],
                                   "bytes": out[name]["bytes_per_cycle"] / out["csv"]["bytes_per_cycle"]}
    return out


CLIENT = """
import asyncio, json, sys
import websockets

async def main(port):
    n = 0
    async with websockets.connect(f"ws://127.0.0.1:{port}", subprotocols=["foxglove.sdk.v1"]) as ws:
        sid = 0
        try:
            async for raw in ws:
                if isinstance(raw, str):
                    m = json.loads(raw)
                    if m["op"] == "advertise":
                        subs = [{"id": sid + i + 1, "channelId": c["id"]} for i, c in enumerate(m["channels"])]
                        sid += len(subs)
                        await ws.send(json.dumps({"op": "subscribe", "subscriptions": subs}))
                else:
                    n += 1
        except websockets.ConnectionClosed:
            pass
    print(n)

asyncio.run(main(int(sys.argv[1])))
"""


class Client:
    """A WebSocket client (foxglove.sdk.v1) in another process, as Foxglove is, subscribed to
    every channel; ``close()`` returns the number of messages it received."""

    def __init__(self, live):
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(live.port)], stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while live.subscriptions < len(live.topics) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.subscribed = live.subscriptions >= len(live.topics)

    def close(self) -> int:
        out, _ = self.proc.communicate(timeout=20)  # the server stopped: the client ends
        return int(out.strip() or 0)


def hook_cost(n: int = 20000) -> dict:
    """Seconds per ``maybe_send`` call: idle (no client) and staging a row at every call."""
    from pkrt.rt.runtime.logs.foxglovelive import FoxgloveLive
    from pkrt.rt.runtime.machine.runsetup import channel_list

    live = FoxgloveLive("127.0.0.1", 0, 1e9, ["q1", "q2", "q3"], channel_list(3, "m"), n_slots=n + 2)
    row = np.zeros(live._ring.shape[1] - 2)  # the ring holds t and cycle before the row
    try:
        t0 = time.perf_counter()
        for k in range(n):
            live.maybe_send(k, k * 1e-3, row, {})
        idle = (time.perf_counter() - t0) / n
        c = Client(live)
        t0 = time.perf_counter()
        for k in range(n, 2 * n):
            live.maybe_send(k, k * 1e-3, row, {})
        staged = (time.perf_counter() - t0) / n
    finally:
        live.close()
    c.close()
    return {"idle_us": idle * 1e6, "staging_a_row_us": staged * 1e6}


def loop_figures(rounds: int = 3) -> dict:
    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.logs.foxglovelive import FoxgloveLive
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.machine.runsetup import channel_list, load_controller_tree, tree_axes
    from pkrt.rt.runtime.machine.run import run_session

    config = load_machine("orthoglide")
    tree = load_controller_tree(config)
    demo = plan_reference(config)
    axes, units = tree_axes(tree)
    res: dict[str, list] = {"without": [], "foxglove_no_client": [], "foxglove_one_client": []}
    clients = []
    for _ in range(rounds):
        for mode in res:
            live = client = None
            if mode != "without":
                live = FoxgloveLive("127.0.0.1", 0, 50.0, axes, channel_list(len(axes), units[0]))
                client = Client(live) if mode == "foxglove_one_client" else None
            d = open_drives(config)
            try:
                s = run_session(config, d, trajectory=demo, duration=LOOP_SECONDS, tree=tree, telemetry=live)
            finally:
                d.close()
                if live is not None:
                    live.close()
                    st = live.stats()
                    clients.append({"mode": mode, "rows_staged": st["staged"], "rows_dropped": st["dropped"],
                                    "rows_sent": st.get("sent"),
                                    "client_messages": client.close() if client else None,
                                    "subscribed": client.subscribed if client else None})
            res[mode].append({"compute_us": s["compute_us"], "wake_latency_us": s["wake_latency_us"],
                              "overruns": s["overruns"], "fault": s["fault"]})

    def med(mode, key, q):
        return float(np.median([r[key][q] for r in res[mode]]))

    out = {"rate_hz": config.rate_hz, "seconds_per_run": LOOP_SECONDS, "rounds": rounds,
           "realtime": "configuration's settings (SCHED_FIFO etc. where allowed)"}
    for mode in res:
        out[mode] = {"compute_p50_us": med(mode, "compute_us", "p50"), "compute_p99_us": med(mode, "compute_us", "p99"),
                     "wake_p99_us": med(mode, "wake_latency_us", "p99"),
                     "overruns": [r["overruns"] for r in res[mode]], "faults": [r["fault"] for r in res[mode]]}
    out["compute_p99_ratio_foxglove_over_without"] = (out["foxglove_one_client"]["compute_p99_us"]
                                                      / max(out["without"]["compute_p99_us"], 1e-9))
    out["wake_p99_ratio_foxglove_over_without"] = (out["foxglove_one_client"]["wake_p99_us"]
                                                   / max(out["without"]["wake_p99_us"], 1e-9))
    out["compute_p99_ratio_no_client_over_without"] = (out["foxglove_no_client"]["compute_p99_us"]
                                                       / max(out["without"]["compute_p99_us"], 1e-9))
    out["foxglove_rows"] = clients
    return out


def run_formats_bench() -> dict:
    from pkrt.drivers import open_drives
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree
    from pkrt.rt.runtime.machine.run import run_session

    tmp = Path(tempfile.mkdtemp(prefix="pkrt-bench-formats-"))
    try:
        config = load_machine("orthoglide")
        d = open_drives(config)
        try:
            run_session(config, d, trajectory=plan_reference(config), duration=EXPORT_SECONDS, lockstep=True,
                        log_path=str(tmp / "run.pkl"), tree=load_controller_tree(config))
        finally:
            d.close()
        log = read_log(tmp / "run.pkl")
        return {"export": {"cycles": log.n_cycles, **export_figures(log, tmp)},
                "foxglove_hook": hook_cost(), "loop": loop_figures()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(json.dumps(run_formats_bench(), indent=2))
