"""Canned cycles G73, G81, G82, G83, G85, G86, G89 expanded into traverses, feeds, dwells and
spindle commands as LinuxCNC's ``interp_cycles.cc`` expands them (``convert_cycle``,
``convert_cycle_xy`` and its ZX and YZ twins, ``CYCLE_MACRO``), in any plane: (aa, bb) the
plane's axes, cc its normal (the hole's axis); R the retract plane, the normal word (Z in G17)
the hole's bottom, G98 retracts to the level the cycles started from (if above R), G99 to R;
L repeats (incremental in G91: each repeat moves by X Y again); P dwell (s), Q peck (program
units). Each cycle runs in exact path mode, as LinuxCNC's does.
"""

from __future__ import annotations

import numpy as np

from .ngc_words import AXES, Block, g_name

CYCLES = (730, 810, 820, 830, 850, 860, 890)  # G73, G81, G82, G83, G85, G86, G89 (x10)
PECK_CLEARANCE_INCH = 0.010  # LinuxCNC's G83_RAPID_DELTA: back off above the last peck by this


def cycle(ip, code: int, b: Block) -> None:
    """Execute canned cycle ``code`` (x10) of block ``b`` on ``ip`` (an ``ngc_interp.Interpreter``)."""
    w, name = b.words, g_name(code)
    if ip.inverse_time:
        raise ip.err(f"{name} in inverse time feed mode (G93)")
    if ip.feed == 0.0:
        raise ip.err(f"{name} with zero feed rate (F)")
    first = ip.motion != code
    if "R" not in w and first:
        raise ip.err(f"{name} needs R (the retract plane)")
    r_word = w.get("R", ip.cycle["r"])
    repeats = int(w.get("L", 1))
    if repeats == 0:
        raise ip.err(f"{name} with L0 (zero repeats)")
    a1, a2, a3 = AXES[ip.plane]
    A, B, C = "XYZ"[a1], "XYZ"[a2], "XYZ"[a3]
    if first and C not in w:
        raise ip.err(f"{name} needs {C} (the bottom of the hole) the first time")
    c_word = w.get(C, ip.cycle["cc"])
    for k, why in (("P", "P (the dwell)"), ("Q", "Q (the peck)")):
        uses = code in ((820, 860, 890) if k == "P" else (730, 830))
        if uses and first and k not in w:
            raise ip.err(f"{name} needs {why} the first time")
    p, q = w.get("P", ip.cycle["p"]), w.get("Q", ip.cycle["q"])
    if code in (730, 830) and q <= 0:
        raise ip.err(f"{name} with Q <= 0 (the peck must be positive)")
    if code == 860 and ip.spindle == "off":
        raise ip.err(f"{name} with the spindle stopped (M3 or M4 first)")
    pos = ip.pos
    current_cc = pos[a3]
    old_cc = ip.cycle["il"]
    if old_cc is None:
        old_cc = ip.cycle["il"] = current_cc
    if ip.absolute:
        inc_a = inc_b = 0.0
        r, cc = r_word, c_word
        aa, bb = w.get(A, pos[a1]), w.get(B, pos[a2])
    else:
        inc_a, inc_b = w.get(A, 0.0), w.get(B, 0.0)
        r = r_word + old_cc
        cc = r + c_word
        aa, bb = pos[a1], pos[a2]
    if r < cc:
        raise ip.err(f"{name}: R ({r:g}) below the bottom of the hole ({cc:g})")

    def at(u, v, h):
        e = np.empty(3)
        e[a1], e[a2], e[a3] = u, v, h
        return e

    def trav(h):
        ip.move("traverse", at(aa, bb, h), blend=None)

    def feed(h):
        ip.move("feed", at(aa, bb, h), blend=None)

    if old_cc < r:  # below the R plane: straight up to it first
        ip.move("traverse", at(pos[a1], pos[a2], r), blend=None)
        old_cc = current_cc = r
    clear = r if ip.retract_r else old_cc
    clearance = PECK_CLEARANCE_INCH * (25.4 if ip.units == 21 else 1.0)
    spindle = ip.spindle
    for rep in range(repeats, 0, -1):
        aa, bb = aa + inc_a, bb + inc_b
        if rep == repeats and current_cc > r:
            trav(current_cc)
            trav(r)
        else:
            trav(clear)
            if clear > r:
                trav(r)
        if code in (730, 830):  # pecks: down by q, out (G83: to R; G73: a little), back in
            depth = r - q
            while depth > cc:
                feed(depth)
                if code == 830:
                    trav(r)
                trav(depth + clearance)
                depth = depth - q
        feed(cc)
        if code in (820, 860, 890):
            ip.emit("dwell", value=p)
        if code == 850:
            feed(r)
        if code == 860:
            ip.emit("spindle", value="off")
        (feed if code == 890 else trav)(clear)
        if code == 860:
            ip.emit("spindle", value=spindle)
    ip.pos = at(aa, bb, clear)
    ip.cycle.update(r=r_word, cc=c_word, p=p, q=q)
    ip.motion = code
