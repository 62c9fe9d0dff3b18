"""The operator panel, measured (``pkrt bench --only panel``) on the Delta served in real time at
1 kHz (simulated plant, the loop thread at SCHED_FIFO on its CPU as ``pkrt serve`` runs it, if
permitted), ``pkrt panel`` in its own process and pages in Debian's Chromium (Playwright):

- the loop's compute time per cycle (wall and the loop thread's CPU time) while a program runs,
  side by side: no panel, a plain client asking ``status`` 20 times a second (what the panel
  asks), the panel with no page, the panel with ten pages open, no panel again (the host's load
  drifts); late and long cycles; the pages' updates per second and the panel's CPU share.
- ``estop``: 100 clicks on the page's emergency stop: from the press (the page's clock) to the
  machine's error stop (the loop's fault time), from the click's dispatch by the test driver,
  and from the error stop to the page showing it (against two update periods, 100 ms) and to a
  second page without a browser (a WebSocket client here: the panel's share).

Clocks: the page's ``performance.timeOrigin + now()`` and the host's ``time.time()`` are the
same wall clock; their offset is measured (``clock_offset_ms``) and taken out."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.cycle.loop import percentiles_us

PAGES = 10
PHASE_S = 20.0  # s of loop per side of the comparison
CLICKS = 100
UPDATE_S = 0.05  # the panel's update period per page


def _program(path: Path, seconds: float) -> None:
    """An actuator CSV of ``seconds`` of slow sinusoids (rad), 100 samples a second."""
    t = np.arange(0.0, seconds, 0.01)
    w = np.array([0.9, 1.3, 1.7])
    q = 0.25 + 0.15 * np.sin(np.outer(t, w))
    q[0] = 0.25
    with open(path, "w") as f:
        f.write("t,theta1,theta2,theta3\n")
        for ti, row in zip(t, q):
            f.write(f"{ti:.2f},{row[0]:.6f},{row[1]:.6f},{row[2]:.6f}\n")


STATUS_CLIENT = """
import sys, time
from pkrt.rt.app.client import MachineClient
with MachineClient(sys.argv[1]) as c:
    while True:
        t0 = time.monotonic()
        c.status()
        time.sleep(max(0.0, 1.0 / float(sys.argv[2]) - (time.monotonic() - t0)))
"""


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _phase(m, seconds: float, pages=(), panel_pid: int | None = None) -> dict:
    """The loop's cycles over ``seconds`` from now: compute (wall, CPU), late and long cycles;
    the pages' updates per second; the panel process' CPU share."""
    k0, st0 = m.k, (m.overruns, m.long_cycles, m.long_cycles_cpu)
    up0 = [p.evaluate("window.pkrtPanel.stats.updates") for p in pages]
    cpu0, t0 = (_cpu_s(panel_pid) if panel_pid else 0.0), time.monotonic()
    time.sleep(seconds)
    k1, dt = m.k, time.monotonic() - t0
    idx = np.arange(k0 + 1, k1 + 1) & 0xFFFF
    rates = [(p.evaluate("window.pkrtPanel.stats.updates") - u) / dt for p, u in zip(pages, up0)]
    out = {"cycles": int(k1 - k0), "compute_us": percentiles_us(m.comp[idx]), "compute_cpu_us": percentiles_us(m.comp_cpu[idx]),
           "late_cycles": m.overruns - st0[0], "long_cycles": m.long_cycles - st0[1], "long_cycles_cpu": m.long_cycles_cpu - st0[2]}
    if pages:
        out["updates_per_s_per_page"] = {"min": round(min(rates), 1), "max": round(max(rates), 1)}
    if panel_pid:
        out["panel_cpu_percent"] = round(100 * (_cpu_s(panel_pid) - cpu0) / dt, 1)
    return out


def _clock_offset_ms(page, n: int = 20) -> float:
    """The page's wall clock minus the host's (ms), the median over ``n`` readings."""
    d = []
    for _ in range(n):
        a = time.time()
        b = page.evaluate("performance.timeOrigin + performance.now()")
        d.append(b - 1e3 * (a + time.time()) / 2)
    return float(np.median(d))


class _Watcher:
    """A second page without a browser (a WebSocket in this process): when each state reached
    it (time.monotonic()), to tell the panel's share of a delay from the browser's."""

    def __init__(self, url: str, cookie: str):
        from pkrt.rt.panel.harness import page_socket

        self.ws = page_socket(url, cookie)
        self.seen: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):  # closed at the end
            for text in self.ws:
                msg = json.loads(text)
                state = (msg.get("view") or msg.get("changes") or {}).get("state")
                if state is not None:
                    self.seen.append((time.monotonic(), state))

    def first(self, state: str, after: float) -> float | None:
        return next((t for t, s in list(self.seen) if s == state and t > after), None)


def _estops(m, c, page, clicks: int, watcher: _Watcher) -> dict:
    """``clicks`` presses of the page's emergency stop, the machine reset and enabled between them."""
    box = page.locator("#estop").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    offset = _clock_offset_ms(page)
    press, dispatch, shown, pushed = [], [], [], []
    for _ in range(clicks):
        if c.status()["state"] == "error_stop":
            c.reset()
        if c.status()["state"] == "disabled":
            c.enable()
        page.wait_for_function("() => document.getElementById('banner').dataset.state === 'standstill'", timeout=10000)
        before = m.fault_time
        t_click = time.monotonic()
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.up()
        page.wait_for_function("() => document.getElementById('banner').dataset.state === 'error_stop'", timeout=10000)
        if m.fault_time is None or m.fault_time == before or m.fault_reason != "emergency stop":
            raise RuntimeError(f"the click did not stop the machine ({m.fault_reason})")
        fault_epoch_ms = 1e3 * (m.fault_time + time.time() - time.monotonic())
        pressed = float(page.get_attribute("#estop", "data-pressed-at")) - offset
        at = float(page.get_attribute("#banner", "data-at")) - offset
        press.append(fault_epoch_ms - pressed)
        dispatch.append(1e3 * (m.fault_time - t_click))
        shown.append(at - fault_epoch_ms)
        t_push = watcher.first("error_stop", t_click)
        pushed.append(1e3 * (t_push - m.fault_time) if t_push is not None else np.nan)
    c.reset()

    def ms(v):
        a = np.asarray(v)
        return {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2),
                "max": round(float(a.max()), 2)}

    return {"clicks": clicks, "clock_offset_ms": round(offset, 3), "press_to_error_stop_ms": ms(press),
            "click_dispatch_to_error_stop_ms": ms(dispatch), "error_stop_to_page_ms": ms(shown),
            "error_stop_to_websocket_client_ms": ms([p for p in pushed if np.isfinite(p)]),
            "two_update_periods_ms": 2e3 * UPDATE_S}


def run_panel_bench(pages: int = PAGES, seconds: float = PHASE_S, clicks: int = CLICKS) -> dict:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UserError("the panel benchmark drives a browser: pip install 'pkrt[test]' (Playwright) and "
                        "apt-get install chromium") from None
    from pkrt.rt.app.client import MachineClient
    from pkrt.rt.app.serve import Served
    from pkrt.rt.panel.harness import launch, start_panel, stop_panel, versions

    with tempfile.TemporaryDirectory() as d, sync_playwright() as pw:
        prog = Path(d) / "waves.csv"
        _program(prog, 3 * seconds + 60)
        browser = launch(pw)
        with Served("delta", socket_path=str(Path(d) / "p.sock"), log_path=None, realtime=True,
                    plan_process=False) as srv:  # an actuator CSV: nothing to plan out of process
            srv.start()
            m = srv.machine
            with MachineClient(srv.socket_path, timeout=60) as c:
                c.enable()
                c.home()
                c.run(str(prog))
                time.sleep(1.0)  # past the move to the program's start
                out = {"browser": versions()["chromium"], "playwright": versions()["playwright"],
                       "sched_fifo": m.rt_report.get("sched_fifo"), "pages": pages}
                out["no_panel"] = _phase(m, seconds)
                poller = subprocess.Popen([sys.executable, "-c", STATUS_CLIENT, srv.socket_path, "20"])
                try:
                    time.sleep(1.0)
                    out["status_client_20hz"] = _phase(m, seconds)  # what the panel asks, from a plain client
                finally:
                    poller.kill()
                    poller.wait()
                proc, start = start_panel(srv.socket_path)
                try:
                    time.sleep(2.0)  # the panel's imports and the model for its task readout
                    out["panel_no_page"] = _phase(m, seconds, panel_pid=proc.pid)
                    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                    opened = []
                    for i in range(pages):
                        page = ctx.new_page()
                        page.goto(start["url"] if i == 0 else start["url"].split("?")[0])
                        page.wait_for_function("() => window.pkrtPanel?.view?.state === 'moving'", timeout=30000)
                        opened.append(page)
                    out[f"panel_{pages}_pages"] = _phase(m, seconds, opened, proc.pid)
                    ctx.close()
                finally:
                    stop_panel(proc)
                out["no_panel_again"] = _phase(m, seconds)  # the host's load may have changed meanwhile
                c.stop()
                c.wait_state("standstill", timeout=60)
                proc, start = start_panel(srv.socket_path)
                try:
                    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                    page = ctx.new_page()
                    page.goto(start["url"])
                    cookie = "; ".join(f"{k['name']}={k['value']}" for k in ctx.cookies())
                    watcher = _Watcher(start["url"], cookie)
                    out["estop"] = _estops(m, c, page, clicks, watcher)
                    watcher.ws.close()
                    ctx.close()
                finally:
                    stop_panel(proc)
                out["fault_at_end"] = c.status()["fault"]
        browser.close()
    return out
