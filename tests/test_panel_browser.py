"""The operator panel in a real browser (Debian's Chromium driven by Playwright): a Delta served
in real time at 1 kHz (simulated plant) in this process, ``pkrt panel`` as a process of its
own, the page opened from the URL it printed. An operator's session through the page: enable,
home, jog with the button held and released, steps, a move to a typed target, a program run with
its progress, hold and resume, the override, the emergency stop, its alarm acknowledged, reset;
a held jog stops when the page is left or the panel is killed (and a new panel shows the machine
as it is); the G-code line highlighted. No console error on any page."""

from __future__ import annotations

import os
import time

import pytest
from playwright.sync_api import sync_playwright

from pkrt.rt.app.client import MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.panel.harness import launch, start_panel, stop_panel, versions

pytestmark = pytest.mark.realtime  # a machine served in real time at 1 kHz: with the other real-time tests, one at a time

PROGRAM = "t,theta1,theta2,theta3\n0,0,0,0\n3,0.3,0.2,0.1\n6,0,0,0\n"  # 6 s of actuator values (rad)


def wait(page, js: str, timeout: float = 15.0):
    """Until the expression ``js`` holds in the page (as a function: the page's CSP forbids eval)."""
    return page.wait_for_function(f"() => ({js})", timeout=timeout * 1000)


def state_is(page, state: str, timeout: float = 15.0) -> None:
    wait(page, f"document.getElementById('banner').dataset.state === '{state}'", timeout)


def cells(page, table: str, column: int) -> list[float]:
    return [float(x) for x in page.eval_on_selector_all(f"#{table} tbody tr", f"rows => rows.map(r => r.cells[{column}].textContent)")]


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    d = tmp_path_factory.mktemp("panel-browser")
    (d / "programs").mkdir()
    (d / "programs" / "there-and-back.csv").write_text(PROGRAM)
    srv = Served("delta", socket_path=str(d / "m.sock"), log_path=None)
    srv.start()
    with MachineClient(srv.socket_path, timeout=60) as c:
        yield srv, c, d
    srv.close()


@pytest.fixture(scope="module")
def browser():
    v = versions()
    print(f"browser: {v['chromium']} ({v['executable']}), Playwright {v['playwright']}")
    with sync_playwright() as p:
        b = launch(p)
        print(f"browser version (Playwright): {b.version}")
        yield b
        b.close()


class Console:
    """The page's console errors and uncaught exceptions."""

    def __init__(self, page):
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))


def open_page(browser, url: str):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    console = Console(page)
    page.goto(url)
    wait(page, "window.pkrtPanel?.view?.link?.up === true && !!window.pkrtPanel.view.state")
    return ctx, page, console


def test_an_operators_session(machine, browser, tmp_path):
    srv, c, d = machine
    proc, start = start_panel(srv.socket_path, str(d / "programs"))
    try:
        ctx, page, console = open_page(browser, start["url"])
        assert page.url.endswith("/") and "token" not in page.url  # the token went for a cookie
        assert ctx.cookies()[0]["httpOnly"] and ctx.cookies()[0]["sameSite"] == "Strict"
        if page.get_attribute("#banner", "data-state") == "error_stop":
            page.click("#reset")
        state_is(page, "disabled")
        page.click("#enable")
        state_is(page, "standstill")
        page.click("#home")
        wait(page, "document.getElementById('homed').textContent === 'homed'")
        wait(page, "document.querySelectorAll('#task tbody tr').length === 3 && "
                   "document.querySelectorAll('#jog-task tbody tr').length === 3")  # the tool's readout and jogs

        # jog axis 1 up with the button held longer than the dead-man (keep-alives), then released
        before = cells(page, "joints", 1)[0]
        plus = page.locator("#jog-joint tbody tr").nth(0).locator("button.jog-plus")
        box = plus.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        state_is(page, "moving", 5)
        time.sleep(1.0)  # twice the machine's dead-man time
        assert c.status()["state"] == "moving" and c.status()["motion"]["kind"] == "jog"
        page.mouse.up()
        state_is(page, "standstill", 5)
        after = cells(page, "joints", 1)[0]
        assert after - before > 0.2, (before, after)  # ~1 s at half the jog speed (0.75 rad/s)
        assert "jog released" in " ".join(e["text"] for e in c.call("events", seq=0)["events"][-6:])

        # a step of 0.01 rad, then a task-space step of 1 mm in x
        ref = c.status()["reference"][1]
        page.locator("#jog-joint tbody tr").nth(1).locator("button.step-plus").click()
        wait(page, f"Math.abs(window.pkrtPanel.view.joint.reference[1] - {ref + 0.01}) < 1e-6 "
                   "&& window.pkrtPanel.view.state === 'standstill'")
        x0 = page.evaluate("window.pkrtPanel.view.task.reference[0]")
        page.locator("#jog-task tbody tr").nth(0).locator("button.step-plus").click()
        wait(page, f"Math.abs(window.pkrtPanel.view.task.reference[0] - {x0 + 0.001}) < 1e-6 "
                   "&& window.pkrtPanel.view.state === 'standstill'", 30)

        # a move to a typed joint target
        page.select_option("#move-space", "joint")
        for i, v in enumerate((0.05, 0.1, 0.15)):
            page.fill(f"#move-{i}", str(v))
        page.click("#move-go")
        state_is(page, "moving", 5)
        state_is(page, "standstill", 30)
        assert c.status()["reference"] == pytest.approx([0.05, 0.1, 0.15], abs=1e-9)

        # a program: chosen, its text shown, run with its progress, held, resumed, to its end
        page.select_option("#programs", "there-and-back.csv")
        wait(page, "document.querySelectorAll('#code li').length === 4")
        page.click("#run")
        state_is(page, "moving", 5)
        wait(page, "window.pkrtPanel.view.program && window.pkrtPanel.view.program.progress > 0.3")
        page.click("#hold")
        state_is(page, "holding", 5)
        held = page.evaluate("document.getElementById('progress').value")
        time.sleep(0.5)
        assert c.status()["state"] == "holding"
        assert page.evaluate("document.getElementById('progress').value") == pytest.approx(held, abs=1e-3)
        assert "holding" in page.text_content("#state").lower()
        page.click("#resume")
        state_is(page, "moving", 5)

        # the override while the program runs
        page.locator("#override").fill("50")
        wait(page, "window.pkrtPanel.view.override === 0.5")
        assert c.status()["override"] == 0.5 and page.text_content("#override-value") == "50 %"
        state_is(page, "standstill", 60)
        wait(page, "document.getElementById('progress-text').textContent === '100.0 %'", 5)
        assert c.status()["program"]["progress"] == 1.0

        # the emergency stop, its alarm acknowledged, reset
        page.click("#estop")
        state_is(page, "error_stop", 5)
        assert c.status()["state"] == "error_stop" and c.status()["fault"] == "emergency stop"
        assert page.text_content("#fault") == "fault: emergency stop"
        alarm = page.locator("#event-list tr.alarm.unacked")
        assert alarm.count() == 1 and "emergency stop" in alarm.inner_text()
        page.click("#ack")
        wait(page, "document.querySelectorAll('#event-list tr.unacked').length === 0")
        assert not c.status()["events"]["unacked_alarm"]
        page.click("#reset")
        state_is(page, "disabled", 5)
        page.locator("#override").fill("100")
        wait(page, "window.pkrtPanel.view.override === 1")
        assert console.errors == []
        ctx.close()
    finally:
        assert stop_panel(proc) == 0


def hold_jog(page, c) -> None:
    """Press and keep holding the first axis' jog button (minus: away from the last position)."""
    if c.status()["state"] == "error_stop":
        c.reset()
    if c.status()["state"] == "disabled":
        c.enable()
    c.wait_state("standstill")
    minus = page.locator("#jog-joint tbody tr").nth(0).locator("button.jog-minus")
    minus.wait_for()
    box = minus.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    state_is(page, "moving", 5)


def stops(c, within: float) -> float:
    """Seconds until the machine is at standstill again (fails after ``within``)."""
    t0 = time.monotonic()
    while c.status()["state"] != "standstill":
        assert time.monotonic() - t0 < within, c.status()["state"]
        time.sleep(0.005)
    return time.monotonic() - t0


def test_a_held_jog_stops_when_the_page_is_left_or_the_panel_dies(machine, browser):
    srv, c, d = machine
    proc, start = start_panel(srv.socket_path, str(d / "programs"))
    try:
        ctx, page, console = open_page(browser, start["url"])
        hold_jog(page, c)
        page.goto("about:blank")  # leaving the page: released at once
        assert stops(c, 2.0) < 2.0
        ctx.close()
        assert console.errors == []

        proc2, start2 = start_panel(srv.socket_path, str(d / "programs"))
        ctx, page, console = open_page(browser, start2["url"])
        hold_jog(page, c)
        proc2.kill()  # the panel dies with the jog held: its connection to the machine closes
        stops(c, 2.0)
        ev = c.call("events", seq=max(0, c.status()["events"]["last"] - 10))["events"]
        assert any("dead-man: the client went away" in e["text"] for e in ev)
        state_is(page, "offline", 5)  # the page says it lost the panel
        ctx.close()
        stop_panel(proc2)

        # a new panel holds nothing of the old one: its page shows the machine as it is
        proc3, start3 = start_panel(srv.socket_path, str(d / "programs"))
        ctx, page, console = open_page(browser, start3["url"])
        state_is(page, "standstill")
        assert page.locator("#event-list tbody tr").count() > 5  # the machine's journal
        assert console.errors == []
        ctx.close()
        assert stop_panel(proc3) == 0
    finally:
        stop_panel(proc)


def test_the_gcode_line_being_run_is_highlighted(browser, tmp_path):
    from pathlib import Path

    models = Path(__file__).resolve().parent.parent / "models" / "machines"
    srv = Served("orthoglide", socket_path=str(tmp_path / "o.sock"), log_path=None)
    srv.start()
    proc, start = start_panel(srv.socket_path, str(models))
    try:
        ctx, page, console = open_page(browser, start["url"])
        page.click("#enable")
        state_is(page, "standstill")
        page.click("#home")
        wait(page, "document.getElementById('homed').textContent === 'homed'")
        page.select_option("#programs", "orthoglide-demo.ngc")
        wait(page, "document.querySelectorAll('#code li').length > 10")
        page.click("#run")
        wait(page, "document.getElementById('message').dataset.error !== undefined || (window.pkrtPanel.view.program "
                   "&& window.pkrtPanel.view.program.kind === 'gcode' && window.pkrtPanel.view.program.line !== null)", 60)
        assert page.get_attribute("#message", "data-error") is None, page.text_content("#message")
        line = page.evaluate("window.pkrtPanel.view.program.line")
        current = page.locator("#code li.current")
        assert current.count() == 1
        assert page.evaluate("[...document.querySelectorAll('#code li')].indexOf(document.querySelector('#code li.current')) + 1") == line
        assert current.inner_text().startswith("N")  # a program line, not a comment
        shot = os.environ.get("PKRT_PANEL_SCREENSHOT")  # the documentation's picture: docs/panel.png
        if shot:
            time.sleep(2.0)  # the live plot filled
            page.screenshot(path=shot)
        assert console.errors == []
        ctx.close()
    finally:
        stop_panel(proc)
        srv.close()
