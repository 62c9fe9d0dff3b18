"""The panel's tool-path preview in a real browser (Debian's Chromium driven by Playwright): an
Orthoglide served in real time with a G54 offset that places the generated CAM programs in its
workspace, ``pkrt panel`` as a process of its own. A 100,000-segment relief chosen on the page
is checked whole in the panel's process and its preview drawn (the path's pixels counted on the
canvas, in every view); a program refused by the check says why; a program run from the page
has its executed part drawn in the executed colour after some motion, the rest still in the
feed colour, the tool's cross at the live position. No console error."""

from __future__ import annotations

import os

import pytest
from pkrt.rt.app.client import MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.bench.camprograms import placed_machine, relief
from pkrt.rt.panel.harness import start_panel, stop_panel
from tests.test_panel_browser import browser, Console, state_is, wait  # noqa: F401 (browser: the fixture)

pytestmark = pytest.mark.realtime  # a machine served in real time at 1 kHz: with the other real-time tests, one at a time

# the page's colours (toolpath.js): feed, executed, tool
COLOURS = {"feed": (79, 195, 247), "done": (255, 183, 77), "tool": (255, 23, 68)}
COUNT_PIXELS = """() => {
  const c = document.getElementById('toolpath'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const want = %s, out = {};
  for (const k of Object.keys(want)) out[k] = 0;
  for (let i = 0; i < d.length; i += 4)
    for (const [k, [r, g, b]] of Object.entries(want))
      if (Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) < 60) out[k]++;
  out.total = c.width * c.height;
  return out;
}"""


def pixels(page) -> dict:
    import json

    return page.evaluate(COUNT_PIXELS % json.dumps(COLOURS))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("panel-preview")
    programs = d / "programs"
    programs.mkdir()
    relief(programs / "relief-100k.ngc", lines=100_300)  # 100,140 lines: 100,027 segments
    relief(programs / "relief-short.ngc", lines=700, width_mm=20.0, feeds=(1200.0, 1500.0))
    text = (programs / "relief-short.ngc").read_text().split("\n")
    text[200] = "G1 X300"  # far beyond the workspace
    (programs / "relief-bad.ngc").write_text("\n".join(text))
    srv = Served(str(placed_machine(d / "orthoglide-relief.toml")), socket_path=str(d / "m.sock"), log_path=None)
    srv.start()
    with MachineClient(srv.socket_path, timeout=60) as c:
        yield srv, c, programs
    srv.close()


def test_the_tool_path_of_a_100000_segment_program_and_its_executed_part(setup, browser):
    srv, c, programs = setup
    proc, start = start_panel(srv.socket_path, str(programs))
    try:
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = ctx.new_page()
        console = Console(page)
        page.goto(start["url"])
        wait(page, "window.pkrtPanel?.view?.link?.up === true && !!window.pkrtPanel.view.state")

        # the long program chosen: checked whole in the panel's process, its preview drawn
        page.select_option("#programs", "relief-100k.ngc")
        wait(page, "Number(document.getElementById('toolpath').dataset.points) > 1000", 60)
        n = int(page.get_attribute("#toolpath", "data-points"))
        assert n <= 20_000
        assert "relief-100k.ngc: 100139 lines" in page.evaluate(  # M30 ends it before its last line, '%'
            "(() => { const p = window.pkrtPanel.toolpath.preview; return `${p.name}: ${p.total} lines`; })()")
        assert page.evaluate("window.pkrtPanel.toolpath.preview.motions.feed") > 100_000
        for v in ("xy", "xz", "yz", "iso"):
            page.select_option("#toolpath-view", v)
            page.wait_for_timeout(300)
            px = pixels(page)
            share = 0.01 if v == "xy" else 0.002  # seen from the side the relief is a thin band below the traverses
            assert px["feed"] > share * px["total"], (v, px)  # the path is there, in the feed colour
            assert px["done"] == 0  # nothing run yet
        page.select_option("#toolpath-view", "xy")

        # a program the check refuses: the page says why
        page.select_option("#programs", "relief-bad.ngc")
        wait(page, "window.pkrtPanel.toolpath.note.startsWith('not runnable')", 60)
        assert "line 201" in page.evaluate("window.pkrtPanel.toolpath.note")

        # a program run from the page: its executed part in the executed colour as it goes
        page.click("#enable")
        state_is(page, "standstill", 30)
        page.click("#home")
        wait(page, "document.getElementById('homed').textContent === 'homed'", 60)
        page.select_option("#programs", "relief-short.ngc")
        wait(page, "Number(document.getElementById('toolpath').dataset.points) > 100", 60)
        page.click("#run")
        wait(page, "window.pkrtPanel.view.program?.kind === 'gcode' && window.pkrtPanel.view.program.line > 40", 120)
        wait(page, "Number(document.getElementById('toolpath').dataset.executed) > 20", 10)
        page.wait_for_timeout(300)
        px = pixels(page)
        assert px["done"] > 200 and px["feed"] > 200 and px["tool"] > 5, px  # executed, still to run, the tool
        assert page.evaluate("window.pkrtPanel.view.program.progress") < 1
        shot = os.environ.get("PKRT_PREVIEW_SCREENSHOT")  # the documentation's picture: docs/panel-toolpath.png
        if shot:
            page.locator("#pathbox").screenshot(path=shot)
        c.stop()
        state_is(page, "standstill", 30)
        assert console.errors == []
        ctx.close()
    finally:
        stop_panel(proc)
