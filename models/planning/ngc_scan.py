"""The compiled scanner of the fast G-code reader (``ngc_fast``): numba kernels that read the
lines of a byte block and execute those of the common CAM subset into rows of canonical
commands, exactly as the Python interpreter (``ngc_words`` + ``ngc_interp``) executes them,
and stop at every other line for the interpreter to run (a fallback).

The subset (a line is in it when all of it is): printable ASCII (and tabs), comments in
parentheses or after ``;`` that are not LinuxCNC's active comments (``(MSG,``, ``(DEBUG,``,
... : any comment starting with a word and a comma falls back), an optional ``N`` number
first, and the words G0 G1 G2 G3, G17 G18 G19, G90 G91, G90.1 G91.1, G61 G61.1 G64, X Y Z,
I J K R (arcs), P (arc turns or G64's tolerance), Q (G64), F and S, each number of at most 15
significant digits and 22 decimals (converted exactly: the mantissa and the power of ten are
both exact doubles, so their quotient is the correctly rounded value Python's ``float``
gives). A line the interpreter would refuse is never refused here: it falls back, and the
interpreter gives its error. Arc centres are computed with the interpreter's formulas in the
same order, ``math.hypot`` as CPython 3.11 computes it (``py_hypot``; numba's differs in the
last bit); a comparison within rounding of a tolerance falls back.

State (``ist`` integers, ``fst`` floats, indices below) is the interpreter's modal state the
subset touches, carried across both ways by ``ngc_fast``; positions in program units.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# kernel results
NEED_MORE, FULL, FALLBACK, AT_END = 0, 1, 2, 3
# ist: integer state
MOTION, PLANE, ABSOLUTE, IJK_ABS, BLEND_MODE, LINE, RAW, MOVED, ENABLED = range(9)
N_IST = 9
# fst: float state (POS .. POS + 2: the position)
POS, FEED, SPEED, BLEND, RADIUS_TOL, SPIRAL_TOL, SPIRAL_REL, NAIVE = 0, 3, 4, 5, 6, 7, 8, 9
N_FST = 10
# row kinds
K_TRAVERSE, K_FEED, K_ARC, K_PLANE, K_SPEED = range(5)
# blend modes: G61 exact path (None), G61.1 exact stop ("stop"), G64 (a tolerance)
B_PATH, B_STOP, B_TOL = 0, 1, 2
EOL = 256  # the end of a line (``_sig``)
ROWS_PER_LINE = 3  # speed, plane, motion

_POW10 = np.array([10.0 ** k for k in range(23)])
_TWO53 = 9007199254740992
# letters a subset line may hold (besides N first): G F S X Y Z I J K R P Q
_ALLOWED = np.zeros(26, np.uint8)
for _c in "GFSXYZIJKRPQ":
    _ALLOWED[ord(_c) - 65] = 1
_X, _I, _R, _P, _Q, _F, _S = (ord(c) - 65 for c in "XIRPQFS")
# G groups: motion, plane, distance, arc distance, path control
GM, GPL, GD, GA, GC = range(5)
_AXES = np.array([[0, 1, 2], [2, 0, 1], [1, 2, 0]], np.int64)  # G17, G18, G19: first, second, normal
_CENTRE = np.array([[8, 9], [10, 8], [9, 10]], np.int64)  # letter indices (I J, K I, J K)


@njit(cache=True, _nrt=False)
def _dl_mul(x, y):
    """x * y as hi + lo exactly (Dekker), as CPython's ``dl_mul``."""
    t = x * 134217729.0
    xh = t - (t - x)
    xl = x - xh
    t = y * 134217729.0
    yh = t - (t - y)
    yl = y - yh
    p = xh * yh
    q = xh * yl + xl * yh
    z = p + q
    return z, p - z + q + xl * yl


@njit(cache=True, _nrt=False)
def py_hypot(x, y):
    """``math.hypot(x, y)`` bit for bit as CPython 3.11 computes it (``vector_norm``: lossless
    squares and sums, one differential correction); finite arguments."""
    x, y = abs(x), abs(y)
    mx = max(x, y)
    if mx == 0.0:
        return mx
    e = math.frexp(mx)[1]
    scale = math.ldexp(1.0, -e)
    csum, frac1, frac2 = 1.0, 0.0, 0.0
    for v in (x * scale, y * scale):
        hi, lo = _dl_mul(v, v)
        s = csum + hi
        frac2 += (csum - s) + hi
        csum = s
        frac1 += lo
    h = math.sqrt(csum - 1.0 + (frac1 + frac2))
    hi, lo = _dl_mul(-h, h)
    s = csum + hi
    frac2 += (csum - s) + hi
    csum = s
    frac1 += lo
    h += (csum - 1.0 + (frac1 + frac2)) / (2.0 * h)
    return h / scale


@njit(cache=True, _nrt=False)
def _active_comment(buf, a, b):
    """The comment text buf[a:b] starts with a word and a comma (LinuxCNC's MSG, DEBUG, PRINT,
    LOG..., PROBEOPEN, ABORT, PY: comments with a meaning)."""
    i = a
    while i < b and (buf[i] == 32 or buf[i] == 9):
        i += 1
    k = i
    while i < b and ((65 <= buf[i] <= 90) or (97 <= buf[i] <= 122)):
        i += 1
    if i == k:
        return False
    while i < b and (buf[i] == 32 or buf[i] == 9):
        i += 1
    return i < b and buf[i] == 44


@njit(cache=True, _nrt=False, inline='always')
def _sig(buf, i, b):
    """The next significant character of line buf[i:b] and the index after it, as ``ngc_words``
    reads a line (spaces and tabs skipped, letters in upper case): 0 for a comment (passed),
    EOL at the end (a ';' comment ends it), -1 where the line falls back (an active, nested or
    unclosed comment, a stray ')' or '%')."""
    while i < b:
        ch = buf[i]
        if ch == 32 or ch == 9:
            i += 1
            continue
        if ch == 40:  # '(': a comment to its ')'
            j = i + 1
            while j < b and buf[j] != 41:
                if buf[j] == 40:
                    return -1, b
                j += 1
            if j >= b or _active_comment(buf, i + 1, j):
                return -1, b
            return 0, j + 1
        if ch == 59:  # ';': the rest is a comment
            return (-1 if _active_comment(buf, i + 1, b) else EOL), b
        if ch == 41 or ch == 37:
            return -1, b
        return (ch - 32 if 97 <= ch <= 122 else ch), i + 1
    return EOL, b


@njit(cache=True, _nrt=False)
def _number(buf, i, b):
    """The number after a letter at buf[i:b] as Python's float reads it: (value, the next
    significant character, the index after it); that character -1 where it falls back (not a
    valid number, too many digits, |value| > 1e6)."""
    ch, i = _sig(buf, i, b)
    neg = ch == 45
    if ch == 43 or ch == 45:
        ch, i = _sig(buf, i, b)
    m, digits, frac, dot = 0, 0, 0, False
    while True:
        if 48 <= ch <= 57:
            m = m * 10 + (ch - 48)
            if m > _TWO53:
                return 0.0, -1, b
            digits += 1
            if dot:
                frac += 1
        elif ch == 46 and not dot:
            dot = True
        elif ch == 46 or ch == 43 or ch == 45 or ch < 0:
            return 0.0, -1, b
        else:
            break
        ch, i = _sig(buf, i, b)
    if digits == 0 or frac > 22:
        return 0.0, -1, b
    v = m / _POW10[frac]
    if v > 1e6:
        return 0.0, -1, b
    return (-v if neg else v), ch, i


@njit(cache=True, _nrt=False)
def _g_code(v, g):
    """File G code v (x10) in its group slot of g; False if it falls back."""
    x = v * 10.0
    c = int(math.floor(x + 0.5))
    if abs(x - c) > 1e-6:
        return False
    if c == 0 or c == 10 or c == 20 or c == 30:
        grp = GM
    elif c == 170 or c == 180 or c == 190:
        grp = GPL
    elif c == 900 or c == 910:
        grp = GD
    elif c == 901 or c == 911:
        grp = GA
    elif c == 610 or c == 611 or c == 640:
        grp = GC
    else:
        return False
    if g[grp] >= 0:
        return False
    g[grp] = c
    return True


@njit(cache=True, _nrt=False)
def _words(buf, a, b, val, have, g):
    """The words of line buf[a:b] into val/have (by letter, reset here) and g (by group); False
    if the line falls back."""
    have[:] = 0
    g[:] = -1
    ch, i = _sig(buf, a, b)
    if ch == 78:  # N first (before any comment)
        ch, i = _sig(buf, i, b)
        if not 48 <= ch <= 57:
            return False
        while 48 <= ch <= 57:
            ch, i = _sig(buf, i, b)
        if ch == 46:  # N10.5: the fraction must be digits
            ch, i = _sig(buf, i, b)
            if not 48 <= ch <= 57:
                return False
            while 48 <= ch <= 57:
                ch, i = _sig(buf, i, b)
    while ch != EOL:
        if ch == 0:
            ch, i = _sig(buf, i, b)
            continue
        if ch < 65 or ch > 90 or not _ALLOWED[ch - 65]:
            return False
        c = ch
        v, ch, i = _number(buf, i, b)
        if ch < 0:
            return False
        if c == 71:
            if not _g_code(v, g):
                return False
        else:
            if have[c - 65]:
                return False
            have[c - 65] = 1
            val[c - 65] = v
    return True


@njit(cache=True, _nrt=False)
def _near(x, limit):
    """x within rounding of ``limit`` (the comparison is left to the interpreter)."""
    return abs(x - limit) <= 1e-9 * max(1.0, abs(limit))


@njit(cache=True, _nrt=False)
def _centre_r(code, c1, c2, e1, e2, radius, fst):
    """An R arc's centre (``Interpreter._centre_r``); ok False where it falls back."""
    if e1 == c1 and e2 == c2:
        return False, 0.0, 0.0
    r = abs(radius)
    mid1, mid2 = (e1 + c1) / 2.0, (e2 + c2) / 2.0
    half = py_hypot(mid1 - e1, mid2 - e2)
    if r == 0.0 or half - r > fst[RADIUS_TOL] or _near(half - r, fst[RADIUS_TOL]):
        return False, 0.0, 0.0
    if _near(half / r, 1 - 1e-12):
        return False, 0.0, 0.0
    if half / r > 1 - 1e-12:
        half = r
    side = -1 if (code == 20) == (radius > 0) else 1
    theta = math.atan2(e2 - c2, e1 - c1) + side * math.pi / 2
    off = r * math.cos(math.asin(half / r))
    return True, mid1 + off * math.cos(theta), mid2 + off * math.sin(theta)


@njit(cache=True, _nrt=False)
def _radii_ok(c1, c2, e1, e2, k1, k2, fst):
    """``Interpreter._check_radii`` passes, clearly (a value within rounding of a limit falls
    back)."""
    r1, r2 = py_hypot(k1 - c1, k2 - c2), py_hypot(k1 - e1, k2 - e2)
    tol = fst[RADIUS_TOL]
    if r1 < tol or r2 < tol or _near(r1, tol) or _near(r2, tol):
        return False
    err, stol = abs(r1 - r2), fst[SPIRAL_TOL]
    rel = err / max(r1, r2)
    if _near(err, 100 * stol) or _near(err, stol) or _near(rel, fst[SPIRAL_REL]):
        return False
    return not (err > 100 * stol or (rel > fst[SPIRAL_REL] and err > stol))


@njit(cache=True, _nrt=False)
def _arc(code, plane, ijk_abs, end, val, have, fst):
    """Centre and turns of an arc line (``Interpreter._arc``): (ok, k1, k2, turns)."""
    a1, a2 = _AXES[plane, 0], _AXES[plane, 1]
    first, second = _CENTRE[plane, 0], _CENTRE[plane, 1]
    ijk = have[8] or have[9] or have[10]
    if have[_R] == ijk:  # neither, or both
        return False, 0.0, 0.0, 0
    if ijk:
        for k in range(8, 11):
            if have[k] and k != first and k != second:
                return False, 0.0, 0.0, 0
        if ijk_abs and not (have[first] and have[second]):
            return False, 0.0, 0.0, 0
    elif not (have[_X + a1] or have[_X + a2]):
        return False, 0.0, 0.0, 0
    turns = int(math.floor(val[_P] + 0.5)) if have[_P] else 1
    c1, c2, e1, e2 = fst[POS + a1], fst[POS + a2], end[a1], end[a2]
    if have[_R]:
        ok, k1, k2 = _centre_r(code, c1, c2, e1, e2, val[_R], fst)
        if not ok:
            return False, 0.0, 0.0, 0
    else:
        o1 = val[first] if have[first] else 0.0
        o2 = val[second] if have[second] else 0.0
        k1, k2 = (o1, o2) if ijk_abs else (c1 + o1, c2 + o2)
        if not _radii_ok(c1, c2, e1, e2, k1, k2, fst):
            return False, 0.0, 0.0, 0
    return True, k1, k2, (-turns if code == 20 else turns)


@njit(cache=True, _nrt=False)
def _motion_of(val, have, g, ist):
    """The motion (x10) the line makes (-1: none), or -2 where it falls back (the checks of
    ``Interpreter.check`` on the subset's words)."""
    axes = have[_X] or have[_X + 1] or have[_X + 2]
    ijk = have[8] or have[9] or have[10]
    cur = ist[MOTION]
    if g[GM] >= 0:
        motion = g[GM]
    elif axes:
        if not (cur == 0 or cur == 10 or cur == 20 or cur == 30):
            return -2
        motion = cur
    elif ijk and (cur == 20 or cur == 30):
        motion = cur
    else:
        motion = -1
    arc = motion == 20 or motion == 30
    for k in (_F, _S, _P):
        if have[k] and val[k] < 0:
            return -2
    if (ijk or have[_R]) and not arc:
        return -2
    if have[_P]:
        if not (g[GC] == 640 or arc) or (g[GC] == 640 and arc):
            return -2
        if arc and (abs(math.floor(val[_P] + 0.5) - val[_P]) > 0.001 or math.floor(val[_P] + 0.5) < 1):
            return -2
    if have[_Q] and g[GC] != 640:
        return -2
    return motion


@njit(cache=True, _nrt=False)
def _row(out, r, kind, line, fst, value):
    out[0][r] = kind
    out[1][r] = line
    out[10][r] = value
    for k in range(3):
        out[3][r, k] = fst[POS + k]


@njit(cache=True, _nrt=False)
def execute_line(line, ist, fst, out, r, val, have, g, end):
    """The words of program line ``line`` (``_words``) executed onto the state, its rows written
    from row r: the new row count, or -1 if it falls back (nothing changed then). ``end``: (3,)
    scratch."""
    motion = _motion_of(val, have, g, ist)
    if motion == -2:
        return -1
    feed = val[_F] if have[_F] else fst[FEED]
    plane = ist[PLANE] if g[GPL] < 0 else g[GPL] // 10 - 17
    absolute = ist[ABSOLUTE] if g[GD] < 0 else int(g[GD] == 900)
    ijk_abs = ist[IJK_ABS] if g[GA] < 0 else int(g[GA] == 901)
    for k in range(3):
        end[k] = fst[POS + k]
        if have[_X + k]:
            end[k] = val[_X + k] if absolute else fst[POS + k] + val[_X + k]
    k1, k2, turn = 0.0, 0.0, 0
    if motion > 0 and feed == 0.0:
        return -1
    if motion == 20 or motion == 30:
        ok, k1, k2, turn = _arc(motion, plane, ijk_abs, end, val, have, fst)
        if not ok:
            return -1
    # the line is the subset's: its effects, in the interpreter's order
    fst[FEED] = feed
    if have[_S]:
        fst[SPEED] = val[_S]
        _row(out, r, K_SPEED, line, fst, val[_S])
        r += 1
    if g[GPL] >= 0:
        ist[PLANE] = plane
        _row(out, r, K_PLANE, line, fst, g[GPL])
        r += 1
    if g[GC] >= 0:
        ist[BLEND_MODE] = B_PATH if g[GC] == 610 else B_STOP if g[GC] == 611 else B_TOL
        fst[BLEND] = val[_P] if g[GC] == 640 and have[_P] else 0.0
        fst[NAIVE] = val[_Q] if have[_Q] else fst[BLEND]  # G64's Q (naive CAM), P without it, as LinuxCNC
    ist[ABSOLUTE], ist[IJK_ABS] = absolute, ijk_abs
    if motion >= 0:
        kind = K_TRAVERSE if motion == 0 else K_FEED if motion == 10 else K_ARC
        _row(out, r, kind, line, fst, 0.0)
        for k in range(3):
            out[2][r, k] = end[k]
            fst[POS + k] = end[k]
        out[4][r] = math.inf if motion == 0 else feed
        out[5][r] = ist[BLEND_MODE]
        out[6][r] = fst[BLEND]
        out[11][r] = fst[NAIVE] if ist[BLEND_MODE] == B_TOL else math.nan
        out[7][r, 0], out[7][r, 1] = k1, k2
        out[8][r] = turn
        out[9][r] = 170 + 10 * plane
        r += 1
        ist[MOTION] = motion
        ist[MOVED] = 1
    return r


@njit(cache=True, _nrt=False)
def _raw_end(buf, pos, end):
    """(end of the raw line starting at pos (its '\\n' or the buffer's end), whether it holds
    only printable ASCII and tabs, a CR only before its LF)."""
    i, clean = pos, True
    while i < end:
        ch = buf[i]
        if ch == 10:
            break
        if ch < 32 and ch != 9:
            if not (ch == 13 and i + 1 < end and buf[i + 1] == 10):
                clean = False
        elif ch > 126:
            clean = False
        i += 1
    return i, clean


@njit(cache=True, _nrt=False, nogil=True)
def scan(buf, pos, end, final, ist, fst, out, cap, val, have, g, point):
    """Lines of buf[pos:end] executed until one falls back, the rows are full, or the block
    ends. Returns (status, pos, rows, a, b): FALLBACK with the raw line buf[a:b] (no LF) for the
    interpreter (pos after it; the line counters not advanced for it), FULL, NEED_MORE (pos at
    the start of an incomplete line) or AT_END (``final``: all read). ``ist[ENABLED]`` 0: every
    line falls back. val, have, g, point: scratch."""
    r = 0
    while True:
        if pos >= end:
            return (AT_END if final else NEED_MORE), pos, r, 0, 0
        if r + ROWS_PER_LINE > cap:
            return FULL, pos, r, 0, 0
        stop, clean = _raw_end(buf, pos, end)
        if stop >= end and not final:
            return NEED_MORE, pos, r, 0, 0
        nxt = stop + 1
        b = stop - 1 if stop > pos and buf[stop - 1] == 13 else stop
        if not (clean and ist[ENABLED]):
            return FALLBACK, nxt, r, pos, stop
        if not _words(buf, pos, b, val, have, g):
            return FALLBACK, nxt, r, pos, stop
        got = execute_line(ist[LINE] + 1, ist, fst, out, r, val, have, g, point)
        if got < 0:
            return FALLBACK, nxt, r, pos, stop
        r = got
        ist[LINE] += 1
        ist[RAW] += 1
        pos = nxt
