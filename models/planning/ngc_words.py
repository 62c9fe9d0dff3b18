"""RS274/NGC lines read into blocks, as LinuxCNC's interpreter reads them (``interp_read.cc``):
spaces and tabs ignored outside comments, letters of any case, comments in parentheses (one
level, none nested) and after ``;``, an optional block delete ``/`` then an optional line
number ``N`` first, then words: a letter and a number (sign, digits, a decimal point; no
exponent). G codes are kept as ten times their number (G61.1 -> 611, LinuxCNC's convention),
each in its modal group, at most one per group a line; M codes likewise.

What pkrt does not implement is refused here with one line naming the program line and the
word: parameters (``#``), expressions (``[...]``), O-words, and the letters no supported code
uses (A B C U V W D E and the polar ``@ ^``). Which codes are supported is decided by the
interpreter (``ngc_interp``); the tables of every code LinuxCNC knows live here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from pkrt.rt.core.errors import UserError

MAX_ABS = 1e6  # program units: beyond this a number is a mistake, not a coordinate
AXES = {170: (0, 1, 2), 180: (2, 0, 1), 190: (1, 2, 0)}  # plane G17/G18/G19 -> (first, second, normal) axes

# LinuxCNC's modal groups of G codes (x10); group 0 is non-modal
G_GROUPS: dict[int, str] = {}
for _grp, _codes in {
        "non-modal": (40, 100, 280, 281, 300, 301, 520, 530, 920, 921, 922, 923, 53),
        "motion": (0, 10, 20, 30, 50, 51, 52, 330, 331, 382, 383, 384, 385, 700, 710, 711, 712, 720, 721, 722,
                   730, 740, 760, 800, 810, 820, 830, 840, 850, 860, 870, 880, 890),
        "plane": (170, 171, 180, 181, 190, 191), "distance": (900, 910), "arc distance": (901, 911),
        "feed mode": (930, 940, 950), "units": (200, 210), "cutter compensation": (400, 410, 411, 420, 421),
        "tool length offset": (430, 431, 432, 490), "retract mode": (980, 990),
        "coordinate system": (540, 550, 560, 570, 580, 590, 591, 592, 593), "path control": (610, 611, 640),
        "spindle speed mode": (960, 970), "lathe diameter": (70, 80)}.items():
    for _c in _codes:
        G_GROUPS[_c] = _grp

M_GROUPS: dict[int, str] = {}
for _grp, _codes in {"stop": (0, 1, 2, 30, 60), "tool change": (6, 61), "spindle": (3, 4, 5, 19),
                     "coolant": (7, 8, 9), "override": (48, 49, 50, 51, 52, 53),
                     "input/output": (62, 63, 64, 65, 66, 67, 68), "modal state": (70, 71, 72, 73),
                     "subroutine": (98, 99)}.items():
    for _c in _codes:
        M_GROUPS[_c] = _grp

WORD_LETTERS = "FGHIJKLMNPQRSTXYZ"  # the letters of the codes and words pkrt implements
WHY_NOT_LETTER = {
    "A": "pkrt's G-code machines have X, Y and Z only (no rotary axes)",
    "B": "pkrt's G-code machines have X, Y and Z only (no rotary axes)",
    "C": "pkrt's G-code machines have X, Y and Z only (no rotary axes)",
    "U": "pkrt's G-code machines have X, Y and Z only", "V": "pkrt's G-code machines have X, Y and Z only",
    "W": "pkrt's G-code machines have X, Y and Z only", "D": "cutter radius compensation is not supported",
    "E": "E words (threading, analog input) are not supported", "O": "O-words (subroutines, loops, "
    "conditions) are not supported", "@": "polar coordinates are not supported",
    "^": "polar coordinates are not supported", "$": "spindle selection ($) is not supported",
    "#": "parameters (#) are not supported", "[": "expressions ([...]) are not supported",
}
_NUMBER = re.compile(r"[+-]*[0-9.]*")
_VALID = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)\Z")
_SEP = "\x00"  # where a comment was: ends the number before it


class NgcError(UserError):
    """A program line pkrt refuses (one line)."""


@dataclass
class Block:
    """One line: ``words`` (letter -> value, G and M excluded), ``g`` (modal group -> code x10),
    ``m`` (modal group -> code), the comment (the last one, if any) and whether it is empty."""
    line: int
    words: dict[str, float] = field(default_factory=dict)
    g: dict[str, int] = field(default_factory=dict)
    m: dict[str, int] = field(default_factory=dict)
    comment: str | None = None
    delete: bool = False  # starts with the block delete '/'

    @property
    def empty(self) -> bool:
        return not (self.words or self.g or self.m)

    def has(self, letters: str) -> bool:
        return any(k in self.words for k in letters)


def g_name(code: int) -> str:
    """'G61.1' for 611."""
    return f"G{code // 10}" + (f".{code % 10}" if code % 10 else "")


def _strip(text: str, n: int) -> tuple[str, str | None]:
    """The line without spaces, tabs or comments (each comment replaced by ``_SEP``) in upper
    case, and its last comment."""
    out, comment, buf, depth = [], None, [], 0
    for ch in text:
        if depth:
            if ch == ")":
                depth, comment = 0, "".join(buf)
                out.append(_SEP)
            elif ch == "(":
                raise NgcError(f"line {n}: nested comment")
            else:
                buf.append(ch)
        elif ch == ";":
            comment = text[text.index(";") + 1:]
            break
        elif ch == "(":
            depth, buf = 1, []
        elif ch == ")":
            raise NgcError(f"line {n}: ')' without '('")
        elif ch not in " \t\r":
            out.append(ch.upper())
    if depth:
        raise NgcError(f"line {n}: comment not closed (missing ')')")
    return "".join(out), comment


def _number(s: str, pos: int, letter: str, n: int) -> tuple[float, int]:
    m = _NUMBER.match(s, pos)
    text = m.group(0)
    if not text:
        c = s[pos:pos + 1]
        if c in WHY_NOT_LETTER:
            raise NgcError(f"line {n}: {letter}{s[pos:pos + 12]}: {WHY_NOT_LETTER[c]}")
        if c.isalpha():
            raise NgcError(f"line {n}: {letter}{s[pos:pos + 12]}: expressions and functions are not supported")
        raise NgcError(f"line {n}: cannot read '{letter}{s[pos:pos + 12]}' (expected a number after {letter})")
    if not _VALID.match(text):
        raise NgcError(f"line {n}: cannot read the number '{letter}{text[:20]}'")
    v = float(text)
    if not math.isfinite(v) or abs(v) > MAX_ABS:
        raise NgcError(f"line {n}: number {text[:20]} out of range (|value| <= {MAX_ABS:g})")
    return v, m.end()


def read_block(text: str, n: int) -> Block:
    """The block of program line ``n`` (1-based). Raises ``NgcError`` (one line naming the line)
    on anything it cannot read or pkrt does not implement."""
    s, comment = _strip(text, n)
    b = Block(n, comment=comment)
    pos = 0
    if s.startswith("/"):
        b.delete, pos = True, 1
    if s.startswith("N", pos):
        m = re.compile(r"N(\d+)(?:\.\d+)?").match(s, pos)
        if not m:
            raise NgcError(f"line {n}: cannot read the line number '{s[pos:pos + 12]}'")
        pos = m.end()
    while pos < len(s):
        letter = s[pos]
        if letter == _SEP:
            pos += 1
            continue
        if letter in WHY_NOT_LETTER and letter in "O#[":
            raise NgcError(f"line {n}: '{s[pos:pos + 12]}': {WHY_NOT_LETTER[letter]}")
        if not ("A" <= letter <= "Z" or letter in WHY_NOT_LETTER):
            raise NgcError(f"line {n}: cannot read '{s[pos:pos + 12]}' (expected a letter and a number)")
        v, pos = _number(s, pos + 1, letter, n)
        word = f"{letter}{_fmt(v)}"
        if letter in WHY_NOT_LETTER:
            raise NgcError(f"line {n}: word {word} is not supported: {WHY_NOT_LETTER[letter]}")
        if letter == "N":
            raise NgcError(f"line {n}: N must start the line")
        if letter not in WORD_LETTERS:
            raise NgcError(f"line {n}: word {word} is not supported (unknown letter {letter})")
        if letter == "G":
            _add_g(b, v, n)
        elif letter == "M":
            _add_m(b, v, n)
        elif letter in b.words:
            raise NgcError(f"line {n}: {letter} twice in one line")
        else:
            b.words[letter] = v
    return b


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def _add_g(b: Block, v: float, n: int) -> None:
    code = round(v * 10)
    if abs(v * 10 - code) > 1e-6 or code < 0:
        raise NgcError(f"line {n}: G{_fmt(v)} is not a G code")
    grp = G_GROUPS.get(code)
    if grp is None:
        raise NgcError(f"line {n}: {g_name(code)} is not a G code pkrt (or LinuxCNC) knows")
    if grp == "motion" and 800 in (code, b.g.get(grp)) and grp in b.g:  # G80 with a motion: the motion wins
        b.g[grp] = code if b.g[grp] == 800 else b.g[grp]
        return
    if grp in b.g:
        raise NgcError(f"line {n}: {g_name(b.g[grp])} and {g_name(code)} in one line (same modal group: {grp})")
    b.g[grp] = code


def _add_m(b: Block, v: float, n: int) -> None:
    if abs(v - round(v)) > 1e-6 or v < 0:
        raise NgcError(f"line {n}: M{_fmt(v)} is not an M code")
    code = int(round(v))
    grp = M_GROUPS.get(code, "user" if 100 <= code <= 199 else None)
    if grp is None:
        raise NgcError(f"line {n}: M{code} is not an M code pkrt (or LinuxCNC) knows")
    if grp in b.m:
        raise NgcError(f"line {n}: M{b.m[grp]} and M{code} in one line (same modal group: {grp})")
    b.m[grp] = code
