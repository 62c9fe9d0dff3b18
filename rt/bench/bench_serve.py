"""A served machine, measured (``pkrt bench --only serve``): the round trip of a command
(client -> Unix socket -> the loop's next cycle -> reply) on the Delta's simulated plant
served in real time at 1 kHz; the live-target generator's (ruckig) cost per cycle with a new
target every cycle for 60 s of loop time, alone and in a served Delta in lockstep (the limits
held at every sample); live targets at 1 kHz for 60 s in real time through the socket, with
the limits checked at every sample, the generator's cost per update in the loop, the cycles
it overran (``long_cycles``) apart from the host's delays, and the stream's round trips; and
``run demo`` on the Delta served in real time, planned in the worker process (issue 23's fix)
and, for comparison, in the server's thread as before it (``Served(plan_process=False)``):
the reply's wall time, the time to motion start, and the loop's cycles during the planning
(the most CPU time and wall time one took, the long and late ones); task-space moves and jogs
the same way, in the planning process and in the server's thread."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from pkrt.rt.runtime.cycle.loop import percentiles_us


def _round_trips(n: int = 400) -> dict:
    from pkrt.rt.app.client import MachineClient
    from pkrt.rt.app.serve import Served

    with tempfile.TemporaryDirectory() as d:
        with Served("delta", socket_path=str(Path(d) / "b.sock"), log_path=None) as srv:
            srv.start()
            with MachineClient(srv.socket_path) as c:
                c.enable()
                out = {}
                for cmd in ("status", "alive"):
                    t = np.empty(n)
                    for i in range(n):
                        t0 = time.perf_counter()
                        c.call(cmd)
                        t[i] = time.perf_counter() - t0
                        time.sleep(0.0013 * (i % 3))  # requests land at different phases of the period
                    out[cmd] = percentiles_us(t)
                st = c.status()
            out["overruns"] = st["overruns"]
            out["state"] = st["state"]
    return out


def _generator_cost(seconds: float = 60.0) -> dict:
    from pkrt.rt.runtime.machine.live import LiveTarget

    dt = 1e-3
    n = int(seconds / dt)
    lo, hi = np.full(3, -0.28), np.full(3, 0.98)
    src = LiveTarget(np.zeros(3), np.zeros(3), 0.0, np.full(3, 1.5), np.full(3, 40.0), lo, hi, dt, 0.2)
    w = np.array([1.0, 1.3, 1.7])
    cost = np.empty(n)
    held = True
    for k in range(n):
        tgt = 0.3 + 0.3 * np.sin(w * k * dt)
        t0 = time.perf_counter()
        src.set_target(tgt, k * dt)
        src.step(dt)
        cost[k] = time.perf_counter() - t0
        held &= bool(np.all(src.pos >= lo) and np.all(src.pos <= hi))
    return {"cycles": n, "us_per_cycle": percentiles_us(cost), "limits_held": held and src.limit_error is None}


STREAM_PRIORITY = 80  # the real-time stream's loop thread: SCHED_FIFO, as [realtime] priority asks (if permitted)
IN_FLIGHT = 4  # stream requests sent ahead of their replies (JSON lines: replies come in order)


def _stream_realtime(seconds: float = 60.0, priority: int = 0) -> dict:
    """The Delta's simulated plant served in real time at 1 kHz, a client sending a new target
    every millisecond for ``seconds`` through the socket, pipelined (up to ``IN_FLIGHT``
    requests ahead of their replies, which a reader thread takes): every reference sample
    within the soft limits, the generator's cost per update in the loop (wall and CPU time),
    the cycles whose own work overran the period (``long_cycles``; ``long_cycles_cpu`` in the
    loop thread's CPU time: what pkrt's work caused) apart from the host's delays, and the
    round trip of each stream command. ``priority`` > 0: the loop thread at that SCHED_FIFO
    priority (``[realtime] priority``, as ``pkrt serve`` asks for it), if permitted."""
    import dataclasses
    import json

    from pkrt.rt.app.client import MachineClient
    from pkrt.rt.app.serve import Served
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.machine.live import LiveTarget

    with tempfile.TemporaryDirectory() as d:
        log = str(Path(d) / "s.pktlog")
        from pkrt.rt.runtime.machine.config import load_machine

        config = load_machine("delta")
        config = dataclasses.replace(config, realtime=dataclasses.replace(config.realtime, priority=priority))
        with Served(config, socket_path=str(Path(d) / "s.sock"), log_path=log, realtime=priority > 0) as srv:
            srv.start()
            m = srv.machine
            lo, hi = m.lo, m.hi
            with MachineClient(srv.socket_path) as c:
                c.enable()
                c.home()
                n_max = int(seconds * 1000) + 10
                sent_at, rtt = np.zeros(n_max), np.full(n_max, np.nan)
                slots = threading.Semaphore(IN_FLIGHT)
                errors: list[str] = []

                def reader():
                    for line in c.f:
                        r = json.loads(line)
                        i = r.get("id")
                        if i is None:
                            break
                        rtt[i] = time.perf_counter() - sent_at[i]
                        if not r["ok"] and not errors:
                            errors.append(r["error"])
                        slots.release()

                th = threading.Thread(target=reader, daemon=True)
                th.start()
                w = np.array([1.0, 1.3, 1.7])
                sent, gen = 0, None
                t0 = time.monotonic()
                while (t := time.monotonic() - t0) < seconds and sent < n_max and not errors:
                    slots.acquire()
                    req = {"cmd": "stream", "id": sent, "target": (0.3 + 0.3 * np.sin(w * t)).tolist()}
                    sent_at[sent] = time.perf_counter()
                    c.sock.sendall((json.dumps(req) + "\n").encode())
                    sent += 1
                    if gen is None and isinstance(m.source, LiveTarget):
                        gen = m.source
                    pause = t0 + sent * 1e-3 - time.monotonic()  # one target per millisecond
                    if pause > 0:
                        time.sleep(pause)
                streamed = time.monotonic() - t0
                for _ in range(IN_FLIGHT):  # every reply in
                    slots.acquire(timeout=30)
                c.sock.sendall(b'{"cmd": "status"}\n')  # no id: ends the reader
                th.join(30)
                end = time.monotonic() + 30
                while c.status()["state"] not in ("standstill", "error_stop") and time.monotonic() < end:
                    time.sleep(0.01)
                st = c.status()
            srv.close()
            summary = srv.summary or {}
        data = read_log(log)
        ref = data.channels["ref_pos"]
        comp = data.channels["compute_us"]
        moving = data.channels["state"] == 3
    costs = gen.costs() if gen is not None else np.zeros(0)
    cpu = gen.costs(cpu=True) if gen is not None else np.zeros(0)
    done = rtt[:sent][np.isfinite(rtt[:sent])]
    return {"seconds": seconds, "sched_fifo": m.rt_report.get("sched_fifo"), "streamed_s": round(streamed, 3), "targets_sent": sent,
            "targets_per_s": round(sent / streamed, 1), "refused": errors[0] if errors else None, "fault": st["fault"],
            "generator_updates": int(len(costs)), "generator_us": percentiles_us(costs),
            "generator_cpu_us": percentiles_us(cpu),
            "limits_held_every_sample": bool(np.all(ref >= lo - 1e-12) and np.all(ref <= hi + 1e-12)),
            "long_cycles": st["long_cycles"], "long_cycles_cpu": st["long_cycles_cpu"],
            "late_cycles": st["overruns"], "pacing": st["pacing"],
            "host_delays": {k: v for k, v in summary.get("host_delays", {}).items() if k != "at"},
            "cycle_compute_us_while_streaming": percentiles_us(comp[moving] * 1e-6),
            "stream_round_trip_us": percentiles_us(done)}


def _stream_lockstep(seconds: float = 60.0) -> dict:
    """A new target every cycle for ``seconds`` of loop time, the Delta served in lockstep
    (targets submitted in the loop's thread): every reference sample within the soft limits,
    the run's compute time per cycle."""
    from pkrt.rt.app.serve import Served
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.machine.states import State

    with tempfile.TemporaryDirectory() as d:
        log = str(Path(d) / "l.pktlog")
        with Served("delta", socket_path=str(Path(d) / "l.sock"), lockstep=True, log_path=log) as srv:
            m = srv.machine
            n = int(seconds * m.config.rate_hz)
            w = np.array([1.0, 1.3, 1.7])
            lo, hi = m.lo.copy(), m.hi.copy()

            def hook(m):
                k = m.cycles
                if k == 1:
                    m.submit({"cmd": "enable"})
                elif k == 2:
                    m.submit({"cmd": "home"})
                elif 3 <= k < n + 3:
                    m.submit({"cmd": "stream", "target": np.clip(0.3 + 0.6 * np.sin(w * k * 1e-3), lo, hi).tolist()})
                elif k > n + 3 and m.state is not State.MOVING and m.state is not State.STOPPING:
                    m.shutdown("bench done")
            t0 = time.perf_counter()
            summary = m.run(max_cycles=n + 5000, on_cycle=hook)
            wall = time.perf_counter() - t0
        data = read_log(log)
        ref = data.channels["ref_pos"]
    return {"loop_seconds": seconds, "cycles": summary["cycles"], "fault": summary["fault"], "wall_s": wall,
            "limits_held_every_sample": bool(np.all(ref >= lo) and np.all(ref <= hi)),
            "cycle_compute_us": summary["compute_us"]}


def _run_demo(plan_process: bool) -> dict:
    """``run demo`` on the served Delta (real time, 1 kHz): reply and motion-start times (ms of
    wall time from sending the request), the loop's cycles from the request to motion start."""
    from pkrt.rt.app.client import MachineClient
    from pkrt.rt.app.serve import Served

    with tempfile.TemporaryDirectory() as d:
        with Served("delta", socket_path=str(Path(d) / "r.sock"), log_path=None, plan_process=plan_process) as srv:
            srv.start()
            m = srv.machine
            with MachineClient(srv.socket_path, timeout=600) as c:
                c.enable()
                c.home()
                if srv.worker is not None:  # the worker warmed up, as a served machine's is long before
                    end = time.monotonic() + 120
                    while srv.worker.warm_s is None and time.monotonic() < end:
                        time.sleep(0.05)
                before = c.status()
                t0 = time.perf_counter()
                r = c.run("demo", speed=1.0)
                reply = time.perf_counter() - t0
                while True:
                    st = c.status()
                    if st["state"] != "standstill" or (st["planning"] is None and st["plan_result"]):
                        break
                    time.sleep(0.001)
                start = time.perf_counter() - t0
                k0, k1 = before["cycle"] + 1, st["cycle"]
                idx = np.arange(k0, k1 + 1) & 0xFFFF
                cpu, wall = m.comp_cpu[idx], m.comp[idx]
                warm = srv.worker.warm_s if srv.worker is not None else None
                c.stop()
    return {"ok": bool(r.get("ok")), "reply_ms": reply * 1e3, "motion_start_ms": start * 1e3,
            "state": st["state"], "cycles_during": int(k1 - k0 + 1),
            "max_cycle_cpu_us": float(cpu.max() * 1e6), "max_cycle_wall_us": float(wall.max() * 1e6),
            "long_cycles": st["long_cycles"] - before["long_cycles"],
            "long_cycles_cpu": st["long_cycles_cpu"] - before["long_cycles_cpu"],
            "late_cycles": st["overruns"] - before["overruns"],
            "worker_warm_s": warm}


TASK_REQUESTS = ({"cmd": "move", "space": "task", "target": [0.03, 0.02, -0.70], "task_speed": 0.2},
                 {"cmd": "jog", "space": "task", "step": [-0.02, 0.0, 0.01]},
                 {"cmd": "jog", "space": "task", "direction": [0.0, 1.0, 0.0], "speed": 0.05},
                 {"cmd": "move", "space": "task", "target": [0.0, 0.0, -0.68], "task_speed": 0.2})


def _task_motion(repeats: int = 5, plan_process: bool = True, priority: int = STREAM_PRIORITY) -> dict:
    """Task-space moves and jogs on the served Delta (real time, 1 kHz, the loop thread at
    SCHED_FIFO ``priority`` as ``pkrt serve`` runs it, if permitted), planned in the planning
    process (``plan_process``; False: in the server's thread beside the loop, as before): each
    request's reply time (ms, the planning included; the first one waits for the worker's
    warm-up) and, over the cycles from the request to its reply (the cycle taking the plan
    over included), the most CPU and wall time a cycle took and the cycles that were long (own
    work over a period, in wall and in CPU time) or late."""
    import dataclasses

    from pkrt.rt.app.client import MachineClient
    from pkrt.rt.app.serve import Served
    from pkrt.rt.runtime.machine.config import load_machine

    config = load_machine("delta")
    config = dataclasses.replace(config, realtime=dataclasses.replace(config.realtime, priority=priority))
    reply, cpu_max, wall_max, long_n, long_cpu_n, late_n, cycles = [], 0.0, 0.0, 0, 0, 0, 0
    with tempfile.TemporaryDirectory() as d:
        with Served(config, socket_path=str(Path(d) / "t.sock"), log_path=None, realtime=priority > 0,
                    plan_process=plan_process) as srv:
            srv.start()
            m = srv.machine
            with MachineClient(srv.socket_path, timeout=120) as c:
                c.enable()
                c.home()
                for _ in range(repeats):
                    for req in TASK_REQUESTS:
                        before = c.status()
                        t0 = time.perf_counter()
                        r = c.request(dict(req))
                        reply.append(time.perf_counter() - t0)
                        if not r.get("ok"):
                            raise RuntimeError(f"{req}: {r.get('error')}")
                        after = c.status()
                        idx = np.arange(before["cycle"] + 1, after["cycle"] + 1) & 0xFFFF
                        cycles += len(idx)
                        cpu_max = max(cpu_max, float(m.comp_cpu[idx].max(initial=0.0)))
                        wall_max = max(wall_max, float(m.comp[idx].max(initial=0.0)))
                        long_n += after["long_cycles"] - before["long_cycles"]
                        long_cpu_n += after["long_cycles_cpu"] - before["long_cycles_cpu"]
                        late_n += after["overruns"] - before["overruns"]
                        if req["cmd"] == "jog" and "direction" in req:
                            time.sleep(0.3)
                            c.release()
                        c.wait_state("standstill", timeout=60)
                fault = c.status()["fault"]
    return {"sched_fifo": m.rt_report.get("sched_fifo"), "requests": len(reply),
            "reply_ms": percentiles_us(np.array(reply) * 1e-3), "cycles_during": cycles,
            "max_cycle_cpu_us": cpu_max * 1e6, "max_cycle_wall_us": wall_max * 1e6, "long_cycles": long_n,
            "long_cycles_cpu": long_cpu_n, "late_cycles": late_n, "fault": fault}


def planning_bench() -> dict:
    """``run demo`` planned in the worker process (now) and in the server's thread (before)."""
    return {"load_avg_1min": __import__("os").getloadavg()[0], "worker_process": _run_demo(True),
            "server_thread_before": _run_demo(False)}


def run_serve_bench() -> dict:
    return {"load_avg_1min": __import__("os").getloadavg()[0], "round_trip_us": _round_trips(),
            "live_target_generator": _generator_cost(), "stream_lockstep": _stream_lockstep(),
            "stream_real_time": _stream_realtime(priority=STREAM_PRIORITY), "run_demo": planning_bench(),
            "task_motion": {"planning_process": _task_motion(), "server_thread_before": _task_motion(plan_process=False)}}
