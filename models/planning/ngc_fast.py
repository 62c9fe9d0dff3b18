"""The fast G-code reader: a program file read in large byte blocks (never whole) by the
compiled scanner (``ngc_scan``), which executes the lines of the common CAM subset (G0 G1 G2
G3, X Y Z I J K R P F S, N numbers, comments, G17-G19, G90/G91, G90.1/G91.1, G61/G61.1/G64 P
Q: the module docstring of ``ngc_scan`` says exactly) into batches of canonical commands as
arrays (``CanonBatch``), and hands every other line to the Python interpreter
(``ngc_interp.Interpreter``: the definition of the semantics), the modal state carried across
both ways. The commands and the errors are those of ``canon_stream(read_lines(path), setup,
start, path)``, exactly (``tests/test_ngc_fast.py`` compares them field by field on generated
programs and on the rs274 oracle corpus).

``FastReader(path, setup, start)`` yields ``CanonBatch``es and lists of ``Canon`` (the
interpreter's) in program order; ``fast_canon_stream`` yields ``Canon``s one by one (a drop-in
for ``canon_stream(read_lines(path))``, slower than the batches: one object per command).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.errors import UserError

from . import ngc_scan as sc
from .gcode import text_lines
from .ngc_interp import RADIUS_TOL, SPIRAL_REL, SPIRAL_TOL, Canon, Interpreter
from .ngc_setup import Setup
from .ngc_words import NgcError, read_block

BLOCK = 1 << 20  # bytes read at a time
ROWS = 1 << 15  # rows of a batch at most
MOTION_KINDS = ("traverse", "feed", "arc")
_BLENDS = {sc.B_PATH: None, sc.B_STOP: "stop"}
_NAIVE = "naive" in getattr(Canon, "__dataclass_fields__", {})  # the interpreter's canon carries G64's Q


@dataclass
class CanonBatch:
    """Canonical commands of consecutive lines, one row each, in program order: ``kind``
    (``ngc_scan.K_TRAVERSE``, ``K_FEED``, ``K_ARC``, ``K_PLANE``, ``K_SPEED``), ``line``,
    ``start`` and ``end`` (n, 3: program coordinates, program units), ``feed`` (program units
    per minute, inf for a traverse), ``blend_mode`` (``ngc_scan.B_PATH``, ``B_STOP``,
    ``B_TOL``) and ``blend`` (the tolerance), ``centre`` (n, 2: in the plane's axes), ``turn``,
    ``plane`` (170, 180, 190), ``value`` (the plane's code, the S word), ``naive`` (G64's Q, the
    naive-CAM tolerance: P where Q is not given, NaN outside G64). ``units`` (mm per
    program unit) and ``offset`` (work plus tool length offset, program units) hold for every
    row (they change only in lines the interpreter runs)."""
    kind: np.ndarray
    line: np.ndarray
    end: np.ndarray
    start: np.ndarray
    feed: np.ndarray
    blend_mode: np.ndarray
    blend: np.ndarray
    centre: np.ndarray
    turn: np.ndarray
    plane: np.ndarray
    value: np.ndarray
    naive: np.ndarray
    units: float
    offset: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def motions(self) -> np.ndarray:
        """Rows that are motions (bool)."""
        return self.kind <= sc.K_ARC

    def canon(self) -> list[Canon]:
        """The rows as the interpreter's ``Canon`` objects."""
        out = []
        for i in range(len(self.kind)):
            k, ln = int(self.kind[i]), int(self.line[i])
            if k == sc.K_SPEED:
                out.append(Canon("speed", ln, value=float(self.value[i])))
            elif k == sc.K_PLANE:
                out.append(Canon("plane", ln, value=int(self.value[i])))
            else:
                mode = int(self.blend_mode[i])
                arc = k == sc.K_ARC
                extra = {"naive": None if mode != sc.B_TOL else float(self.naive[i])} if _NAIVE else {}
                out.append(Canon(MOTION_KINDS[k], ln, end=self.end[i].copy(), start=self.start[i].copy(),
                                 feed=float(self.feed[i]), blend=_BLENDS.get(mode, float(self.blend[i])),
                                 units=self.units, offset=self.offset.copy(),
                                 centre=(float(self.centre[i, 0]), float(self.centre[i, 1])) if arc else None,
                                 turn=int(self.turn[i]) if arc else 0, plane=int(self.plane[i]) if arc else 170,
                                 **extra))
        return out


class _Rows:
    """The scanner's output arrays (``cap`` rows) and scratch, reused from call to call."""

    def __init__(self, cap: int):
        self.cap = cap
        self.out = (np.zeros(cap, np.int8), np.zeros(cap, np.int64), np.zeros((cap, 3)), np.zeros((cap, 3)),
                    np.zeros(cap), np.zeros(cap, np.int8), np.zeros(cap), np.zeros((cap, 2)),
                    np.zeros(cap, np.int32), np.zeros(cap, np.int16), np.zeros(cap), np.zeros(cap))
        self.scratch = (np.zeros(26), np.zeros(26, np.uint8), np.zeros(5, np.int64), np.zeros(3))

    def batch(self, r: int, units: float, offset: np.ndarray, keep: bool) -> CanonBatch:
        return CanonBatch(*(a[:r].copy() if keep else a[:r] for a in self.out), units=units, offset=offset.copy())


def kernel_allowed(ip: Interpreter) -> bool:
    """The scanner may execute subset lines in the interpreter's present state: not in inverse
    time (G93: F on every motion line means a time)."""
    return not ip.inverse_time


class FastReader:
    """The canonical commands of the program file ``path`` (see the module docstring), read
    lazily: iterate for ``CanonBatch``es and lists of ``Canon``. After iterating: ``lines``
    (program lines read), ``interpreted`` (of them, run by the Python interpreter), ``seen``
    (a line not blank was read), ``read_all`` (to the file's end: no M2, M30 or closing %).
    Raises NgcError / UserError as ``canon_stream(read_lines(path), setup, start, path)``.
    ``keep`` False: each batch's arrays are the reader's own, valid until the next is asked for
    (no copy; the pre-check's way)."""

    def __init__(self, path: str, setup: Setup | None = None, start=(0.0, 0.0, 0.0), block: int = BLOCK,
                 rows: int = ROWS, keep: bool = True):
        self.path, self.block, self.keep = str(path), block, keep
        self.ip = Interpreter(setup or Setup(), start)
        self.rows = _Rows(rows)
        self.ist, self.fst = np.zeros(sc.N_IST, np.int64), np.zeros(sc.N_FST)
        self.seen = self.percent = False
        self.read_all = False  # the file read to its end
        self.interpreted = 0
        self.units, self.offset = 1.0, np.zeros(3)

    @property
    def lines(self) -> int:
        return int(self.ist[sc.LINE])

    # -- the modal state across ---------------------------------------------------------------------
    def _load(self) -> None:
        """The interpreter's state into the scanner's."""
        ip, ist, fst = self.ip, self.ist, self.fst
        ist[sc.MOTION] = -1 if ip.motion is None else ip.motion
        ist[sc.PLANE] = ip.plane // 10 - 17
        ist[sc.ABSOLUTE], ist[sc.IJK_ABS] = int(ip.absolute), int(ip.ijk_absolute)
        ist[sc.BLEND_MODE] = sc.B_PATH if ip.blend is None else sc.B_STOP if ip.blend == "stop" else sc.B_TOL
        ist[sc.MOVED] = 0
        ist[sc.ENABLED] = int(self.seen and kernel_allowed(ip))
        fst[sc.POS:sc.POS + 3] = ip.pos
        fst[sc.FEED], fst[sc.SPEED] = ip.feed, ip.speed
        fst[sc.BLEND] = ip.blend if ist[sc.BLEND_MODE] == sc.B_TOL else 0.0
        naive = getattr(ip, "naive", None)
        fst[sc.NAIVE] = fst[sc.BLEND] if naive is None else naive
        fst[sc.RADIUS_TOL], fst[sc.SPIRAL_TOL], fst[sc.SPIRAL_REL] = RADIUS_TOL[ip.units], SPIRAL_TOL[ip.units], SPIRAL_REL
        probe = ip.emit("traverse", end=np.zeros(3))  # the interpreter's own units and offset of a motion
        ip.out.pop()
        self.units, self.offset = probe.units, probe.offset

    def _store(self) -> None:
        """The scanner's state into the interpreter's (after it executed lines)."""
        ip, ist, fst = self.ip, self.ist, self.fst
        ip.pos = fst[sc.POS:sc.POS + 3].copy()
        ip.motion = None if ist[sc.MOTION] < 0 else int(ist[sc.MOTION])
        ip.plane = 170 + 10 * int(ist[sc.PLANE])
        ip.absolute, ip.ijk_absolute = bool(ist[sc.ABSOLUTE]), bool(ist[sc.IJK_ABS])
        mode = int(ist[sc.BLEND_MODE])
        ip.blend = _BLENDS.get(mode, float(fst[sc.BLEND]))
        if hasattr(ip, "naive"):
            ip.naive = float(fst[sc.NAIVE]) if mode == sc.B_TOL else None
        ip.feed, ip.speed = float(fst[sc.FEED]), float(fst[sc.SPEED])
        if ist[sc.MOVED]:
            ip.cycle["il"] = None  # any motion but a cycle forgets the cycles' initial level

    # -- lines the interpreter runs -----------------------------------------------------------------
    def _python_line(self, line: str) -> None:
        """One program line as ``canon_stream`` runs it (the ``%`` lines, block delete)."""
        ip = self.ip
        self.ist[sc.LINE] += 1
        self.interpreted += 1
        n, bare = int(self.ist[sc.LINE]), line.strip()
        if not self.seen and bare:
            self.seen = True
            if bare == "%":
                self.percent = True
                return
        if self.percent and bare == "%":
            ip.ended = True
            return
        b = read_block(line, n)
        if b.delete and ip.setup.block_delete or b.empty:
            return
        ip.execute(b)

    def _raw_line(self, data: bytes) -> list[Canon]:
        """A raw line (no LF) as ``read_lines`` splits it, each part run by the interpreter."""
        self.ist[sc.RAW] += 1
        out: list[Canon] = []
        for line in text_lines(data, int(self.ist[sc.RAW]), self.path):
            self._python_line(line)
            out += self.ip.out
            self.ip.out.clear()
            if self.ip.ended:
                break
        return out

    # -- the file -----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[CanonBatch | list[Canon]]:
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise UserError(f"{self.path}: cannot read: {e.strerror}") from None
        with f:
            yield from self._blocks(f)

    def _blocks(self, f) -> Iterator[CanonBatch | list[Canon]]:
        rows, carry = self.rows, b""
        self._load()
        while True:
            chunk = f.read(self.block)
            final = not chunk
            data = carry + chunk if carry else chunk
            buf = np.frombuffer(data, np.uint8)
            pos = 0
            while True:
                status, pos, r, a, b = sc.scan(buf, pos, len(buf), final, self.ist, self.fst, rows.out, rows.cap,
                                               *rows.scratch)
                if r:
                    self._store()
                    yield rows.batch(r, self.units, self.offset, self.keep)
                if status == sc.FALLBACK:
                    self._store()
                    out = self._raw_line(data[a:b])
                    if out:
                        yield out
                    if self.ip.ended:
                        return
                    self._load()
                elif status != sc.FULL:
                    break
            if status == sc.AT_END:
                self.read_all = True
                raise NgcError(f"{self.path}: the program ends without M2 or M30 (line {self.lines})")
            carry = data[pos:]


def fast_canon_stream(path: str, setup: Setup | None = None, start=(0.0, 0.0, 0.0)) -> Iterator[Canon]:
    """The canonical commands of program file ``path`` one by one: ``canon_stream(read_lines(path),
    setup, start, path)``'s, read by ``FastReader``."""
    for part in FastReader(path, setup, start):
        yield from part.canon() if isinstance(part, CanonBatch) else part
