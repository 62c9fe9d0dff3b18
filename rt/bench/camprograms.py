"""Long G-code programs as CAM software writes them, generated to a file (benchmarks and tests
of the streaming pipeline): a relief raster (a height field machined by zig-zag passes of
short G1 segments, as CAMotics, CamBam or FreeCAD Path write them) and a dense finishing pass.
Coordinates in mm about the program's zero; the program places itself with a G54 ... G59
offset set by the caller's machine configuration, not by its coordinates. Deterministic: the
same arguments write the same bytes.
"""

from __future__ import annotations

import math
from pathlib import Path


def _height(x: float, y: float, width: float, depth: float) -> float:
    """A relief's surface (mm, <= 0): smooth bumps, as a 3-D carving's finishing pass."""
    u, v = x / width, y / width
    return -depth * (0.5 + 0.25 * math.sin(7.0 * u) * math.cos(5.0 * v) + 0.25 * math.sin(3.0 * (u + v)))


def relief(path: str | Path, lines: int = 65_000, segment_mm: float = 0.36, width_mm: float = 80.0,
           depth_mm: float = 3.0, feeds: tuple[float, float] = (150.0, 300.0), inch: bool = False) -> Path:
    """A relief raster of about ``lines`` lines: passes along x of ``segment_mm`` G1 segments
    over a ``width_mm`` square, a stepover between passes, the feed alternating between
    ``feeds`` (mm/min) from pass to pass (plunging passes slower). ``inch``: the same program
    written in inches (G20)."""
    path = Path(path)
    k = 1.0 / 25.4 if inch else 1.0
    per_pass = max(2, int(width_mm / segment_mm))
    passes = max(1, (lines - 12) // (per_pass + 1))
    step = width_mm / max(1, passes - 1)
    out = ["%", "(relief raster: pkrt.rt.bench.camprograms)", f"{'G20' if inch else 'G21'} G90 G17 G40 G49 G80",
           "G54", "G64 P0.01", "S12000 M3", f"G0 Z{5.0 * k:.4f}", f"G0 X0 Y0", f"G1 Z{_height(0, 0, width_mm, depth_mm) * k:.4f} F{feeds[0] * k:.1f}"]
    for p in range(passes):
        y = p * step
        xs = range(per_pass + 1) if p % 2 == 0 else range(per_pass, -1, -1)
        feed = feeds[p % 2]
        first = True
        for i in xs:
            x = i * width_mm / per_pass
            z = _height(x, y, width_mm, depth_mm)
            if first:
                out.append(f"G1 X{x * k:.4f} Y{y * k:.4f} Z{z * k:.4f} F{feed * k:.1f}")
                first = False
            else:
                out.append(f"X{x * k:.4f} Z{z * k:.4f}")
    out += [f"G0 Z{5.0 * k:.4f}", "M5", "M30", "%"]
    path.write_text("\n".join(out) + "\n")
    return path


def finishing(path: str | Path, segments: int = 160_000, segment_mm: float = 0.16, feed_mm_min: float = 25_000.0,
              radius_mm: float = 40.0) -> Path:
    """A dense finishing pass: ``segments`` G1 segments of ``segment_mm`` along a spiral of
    circles of about ``radius_mm`` (each segment a chord of the curve, as CAM posts write a
    contour), one programmed feed, constant depth steps."""
    path = Path(path)
    out = ["%", "(dense finishing pass: pkrt.rt.bench.camprograms)", "G21 G90 G17 G40 G49 G80", "G54", "G64 P0.005",
           "S18000 M3", "G0 Z5", f"G0 X{radius_mm:.4f} Y0", f"G1 Z0 F{feed_mm_min / 10:.1f}", f"F{feed_mm_min:.1f}"]
    phi = 0.0
    for _ in range(segments):
        r = radius_mm * (0.6 + 0.4 * math.cos(0.05 * phi))
        phi += segment_mm / r
        z = -1.0 + math.cos(0.002 * phi)  # mm: the depth changes slowly along the contour
        out.append(f"G1 X{r * math.cos(phi):.4f} Y{r * math.sin(phi):.4f} Z{z:.4f}")
    out += ["G0 Z5", "M5", "M30", "%"]
    path.write_text("\n".join(out) + "\n")
    return path


def placed_machine(path: str | Path, machine: str = "orthoglide", g54=(-0.04, -0.04, -0.12)) -> Path:
    """A copy of the machine configuration ``machine`` at ``path`` with ``[gcode] g54`` (m) set,
    so that the programs above (about their zero) sit inside its workspace: with the default,
    an 80 mm relief inside the Orthoglide's. Its files (model, tree, tool table) are the
    original's."""
    import tomllib

    from pkrt.models.identification.estimate import dump_toml
    from pkrt.rt.app.machinefile import absolute_paths
    from pkrt.rt.runtime.machine.config import resolve_machine_path

    src = resolve_machine_path(machine)
    doc = absolute_paths(tomllib.loads(src.read_text(encoding="utf-8")), src.parent)
    doc.setdefault("gcode", {})["g54"] = [float(v) for v in g54]
    path = Path(path)
    path.write_text(dump_toml(doc, f"{src.name} with [gcode] g54 = {list(g54)} (pkrt.rt.bench.camprograms)"),
                    encoding="utf-8")
    return path
