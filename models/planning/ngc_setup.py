"""What a G-code program runs against besides its text: the tool table (LinuxCNC's ``.tbl``
format, so users keep theirs), the work offsets G54-G59 and the operator's switches (block
delete, optional stop). Lengths in mm (the interpreter's machine units).

A tool table line: ``T<tool> P<pocket> [X<x>] [Y<y>] [Z<z>] [D<diameter>] ... ;comment``,
words in any order and case; the tool's X, Y, Z offsets are its length offsets (G43 Hn);
A B C U V W I J Q (rotary axes, lathe tools) are accepted and must be zero or absent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError

UNIT_MM = {"mm": 1.0, "inch": 25.4}
_WORD = re.compile(r"([A-Za-z])([+-]?(?:\d+\.?\d*|\.\d+))\Z")


@dataclass(frozen=True)
class Tool:
    number: int
    pocket: int
    offset: np.ndarray  # mm (x, y, z): the tool's length offsets
    diameter: float = 0.0  # mm
    comment: str = ""


@dataclass
class Setup:
    """``tools`` by number; ``offsets`` G54..G59 (1..6) -> (x, y, z) mm from machine zero;
    ``block_delete``: skip lines starting with '/' (the switch on; LinuxCNC's default: off);
    ``optional_stop``: M1 stops as M0 does (the switch on, the default)."""
    tools: dict[int, Tool] = field(default_factory=dict)
    offsets: dict[int, np.ndarray] = field(default_factory=dict)
    block_delete: bool = False
    optional_stop: bool = True
    tool_table: str | None = None  # the file the tools came from (messages)

    def offset(self, index: int) -> np.ndarray:
        return np.asarray(self.offsets.get(index, np.zeros(3)), float)


def read_tool_table(path: str, units: str = "mm") -> dict[int, Tool]:
    """The tools of a LinuxCNC tool table, lengths converted from ``units`` ("mm" or "inch")
    to mm. Raises UserError (one line naming the file and line) on anything malformed."""
    scale = UNIT_MM[units]
    try:
        text = open(path, "rb").read().decode("utf-8")
    except OSError as e:
        raise UserError(f"{path}: cannot read the tool table: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text tool table (not UTF-8)") from None
    tools: dict[int, Tool] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        body, _, comment = raw.partition(";")
        if not body.strip():
            continue
        vals: dict[str, float] = {}
        for tok in body.split():
            m = _WORD.match(tok)
            if not m:
                raise UserError(f"{path}: line {n}: cannot read '{tok[:20]}' (a letter and a number)")
            k = m.group(1).upper()
            if k in vals:
                raise UserError(f"{path}: line {n}: {k} twice")
            if k not in "TPXYZDABCUVWIJQ":
                raise UserError(f"{path}: line {n}: unknown word {k} in a tool table")
            vals[k] = float(m.group(2))
        if "T" not in vals:
            raise UserError(f"{path}: line {n}: no tool number (T)")
        t = vals["T"]
        if t != int(t) or t <= 0:
            raise UserError(f"{path}: line {n}: tool number T must be a whole number > 0, got {t:g}")
        if int(t) in tools:
            raise UserError(f"{path}: line {n}: tool {int(t)} twice")
        for k in "ABCUVWIJQ":
            if vals.get(k, 0.0) != 0.0:
                raise UserError(f"{path}: line {n}: {k} offsets (rotary axes, lathe tools) are not supported")
        off = np.array([vals.get(k, 0.0) for k in "XYZ"]) * scale
        if not np.all(np.abs(off) < 1e4):
            raise UserError(f"{path}: line {n}: tool offsets beyond 10 m")
        tools[int(t)] = Tool(int(t), int(vals.get("P", t)), off, abs(vals.get("D", 0.0)) * scale, comment.strip())
    return tools
