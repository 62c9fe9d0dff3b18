"""LinuxCNC's standalone RS274/NGC interpreter ``rs274`` as the oracle of pkrt's G-code
interpreter: a program run through both with the same tool table and work offsets, their
canonical commands compared.

``rs274`` comes from Debian's linuxcnc-uspace package, unpacked (not installed) by
``.ci/rs274`` into ``.ci/linuxcnc`` (or found on the PATH, or at ``$PKRT_RS274``). Its quirks
(docs/gcode.md): the standalone interpreter reads tool-table lengths and the parameter file's
work offsets in inches whatever the program's units, so both are written in inches here; it
starts with the program position at 0 (pkrt: at machine zero), so pkrt is started at the G54
offset; it rewrites the parameter file and maps its tool table to ``$HOME/.tool.mmap`` (two runs sharing
that file crash with SIGBUS), so each run gets a fresh directory, which is also its HOME.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
UNPACKED = ROOT / ".ci" / "linuxcnc"
HOW = ("LinuxCNC's rs274 (the G-code oracle) is missing: run .ci/rs274 (apt-get download linuxcnc-uspace, "
       "dpkg -x into .ci/linuxcnc, apt-get install libboost-python1.74.0 libmodbus5 libedit2), or set "
       "PKRT_RS274 to an rs274 binary")
_LINE = re.compile(r"^\s*\d+\s+N\S*\s+([A-Z_0-9]+)\((.*)\)\s*$")


def rs274() -> tuple[str, dict] | None:
    """The rs274 binary and its environment, or None."""
    env = dict(os.environ)
    if os.environ.get("PKRT_RS274"):
        return (os.environ["PKRT_RS274"], env) if os.path.isfile(os.environ["PKRT_RS274"]) else None
    b = UNPACKED / "usr" / "bin" / "rs274"
    if b.is_file():
        libs = f"{UNPACKED / 'usr' / 'lib'}:{UNPACKED / 'usr' / 'lib' / 'linuxcnc'}"
        env["LD_LIBRARY_PATH"] = libs + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        return str(b), env
    found = shutil.which("rs274")
    return (found, env) if found else None


def require_rs274() -> tuple[str, dict]:
    """The oracle, or a failure (never a skip) that says how to get it."""
    import pytest

    got = rs274()
    if got is None:
        pytest.fail(HOW, pytrace=False)
    return got


def write_setup(d: Path, setup) -> tuple[Path, Path]:
    """The tool table and parameter file of ``setup`` (pkrt's, in mm) for rs274, in inches."""
    tbl, var = d / "tools.tbl", d / "params.var"
    lines = [f"T{t.number} P{t.pocket} X{t.offset[0] / 25.4:.10f} Y{t.offset[1] / 25.4:.10f} "
             f"Z{t.offset[2] / 25.4:.10f} D{t.diameter / 25.4:.10f}" for t in setup.tools.values()]
    tbl.write_text("\n".join(lines) + "\n")
    params = ["5220 1"]
    for i in range(1, 7):
        off = setup.offset(i) / 25.4
        params += [f"{5201 + 20 * i + k} {off[k]:.10f}" for k in range(3)]
    var.write_text("\n".join(params) + "\n")
    return tbl, var


def run_rs274(text: str, setup, block_delete: bool = False) -> tuple[list[tuple[str, list[str]]], str]:
    """The canonical commands rs274 prints for ``text`` [(name, arguments)], and its error
    message ('' when it ran to the end). It stops at the first error (``-n 2``)."""
    binary, env = require_rs274()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        tbl, var = write_setup(d, setup)
        prog = d / "p.ngc"
        prog.write_text(text)
        args = [binary, "-t", str(tbl), "-v", str(var), "-n", "2"] + (["-b"] if block_delete else []) + ["-g", str(prog)]
        # HOME: rs274 maps its tool table to $HOME/.tool.mmap; two runs at once on one file crash
        # (SIGBUS, nothing printed: seen with 16 runs in parallel), so each run has its own
        r = subprocess.run(args, capture_output=True, text=True, env={**env, "HOME": str(d)}, timeout=60, cwd=d)
    if r.returncode < 0 or r.returncode > 128:  # killed by a signal: no answer, never an empty one
        raise RuntimeError(f"rs274 ended on signal {-r.returncode if r.returncode < 0 else r.returncode - 128}: "
                           f"{r.stderr.strip()[-200:]}")
    out = []
    for line in r.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            out.append((m.group(1), [a.strip() for a in m.group(2).replace(", ", ",").split(",")] if m.group(2) else []))
    err = "\n".join(x for x in r.stderr.splitlines() if x.strip() and x.strip() != "executing")
    return out, err


def oracle_commands(printed) -> list[tuple]:
    """rs274's commands reduced to what is compared: motions, dwells, spindle, coolant, tool
    and stop commands, with the feed and plane each motion runs with."""
    out, feed, plane = [], 0.0, 170
    planes = {"CANON_PLANE_XY": 170, "CANON_PLANE_XZ": 180, "CANON_PLANE_YZ": 190}
    for name, a in printed:
        if name == "SET_FEED_RATE":
            feed = float(a[0])
        elif name == "SELECT_PLANE":
            plane = planes[a[0]]
        elif name == "STRAIGHT_TRAVERSE":
            out.append(("traverse", *map(float, a[:3])))
        elif name == "STRAIGHT_FEED":
            out.append(("feed", *map(float, a[:3]), feed))
        elif name == "ARC_FEED":
            v = [float(x) for x in a[:6]]
            out.append(("arc", *v[:4], int(v[4]), v[5], plane, feed))
        elif name == "DWELL":
            out.append(("dwell", float(a[0])))
        elif name == "SET_SPINDLE_SPEED":
            out.append(("speed", float(a[1])))
        elif name in ("START_SPINDLE_CLOCKWISE", "START_SPINDLE_COUNTERCLOCKWISE", "STOP_SPINDLE_TURNING"):
            out.append(("spindle", {"START_SPINDLE_CLOCKWISE": "cw", "START_SPINDLE_COUNTERCLOCKWISE": "ccw"}.get(name, "off")))
        elif name in ("MIST_ON", "MIST_OFF", "FLOOD_ON", "FLOOD_OFF"):
            out.append((name.split("_")[0].lower(), name.endswith("_ON")))
        elif name == "SELECT_TOOL":
            out.append(("select_tool", int(a[0])))
        elif name == "CHANGE_TOOL":
            out.append(("change_tool",))
        elif name == "USE_TOOL_LENGTH_OFFSET":
            out.append(("tool_offset", *map(float, a[0].split())))
        elif name in ("PROGRAM_STOP", "OPTIONAL_PROGRAM_STOP"):
            out.append(("stop", "M0" if name == "PROGRAM_STOP" else "M1"))
        elif name == "PROGRAM_END":
            out.append(("end",))
    return out


def pkrt_commands(canon) -> list[tuple]:
    """pkrt's canonical commands reduced as ``oracle_commands`` reduces rs274's."""
    out = []
    for c in canon:
        k = c.kind
        if k == "traverse":
            out.append(("traverse", *c.end))
        elif k == "feed":
            out.append(("feed", *c.end, c.feed))
        elif k == "arc":
            a1, a2, a3 = {170: (0, 1, 2), 180: (2, 0, 1), 190: (1, 2, 0)}[c.plane]
            out.append(("arc", c.end[a1], c.end[a2], *c.centre, c.turn, c.end[a3], c.plane, c.feed))
        elif k in ("dwell", "speed", "spindle", "mist", "flood", "select_tool", "stop"):
            out.append((k, c.value))
        elif k == "change_tool":
            out.append(("change_tool",))
        elif k == "tool_offset":
            out.append(("tool_offset", *c.value))
        elif k == "end":
            out.append(("end",))
    return out


def differences(ours: list[tuple], theirs: list[tuple], tol: float = 0.5e-4 + 1e-9) -> list[str]:
    """Where two reduced command lists differ (numbers to ``tol``, rs274 prints 4 decimals)."""
    diffs = []
    if len(ours) != len(theirs):
        diffs.append(f"{len(ours)} commands against rs274's {len(theirs)}")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        same = len(a) == len(b) and a[0] == b[0] and all(
            (abs(float(x) - float(y)) <= tol if _num(x) and _num(y) else x == y)
            for x, y in zip(a[1:], b[1:]))
        if not same:
            diffs.append(f"#{i}: pkrt {_show(a)} / rs274 {_show(b)}")
    return diffs


def _num(x) -> bool:
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool)


def _show(t: tuple) -> str:
    return "(" + ", ".join(f"{x:.5f}" if isinstance(x, (float, np.floating)) else str(x) for x in t) + ")"
