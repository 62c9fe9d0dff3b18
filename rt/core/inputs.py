"""What every reader of a user's input shares: TOML documents read in one place, short
excerpts of bad values for one-line messages, and numeric guards.

- ``read_toml(path, error)``: a file's TOML document, or ``error`` (a ``UserError`` class) with
  one line for every way a file can fail to be one (not UTF-8, a syntax error, an integer of
  more digits than Python converts, nesting too deep to parse).
- ``excerpt(value)``: a value as a message shows it, at most ``EXCERPT`` characters (a 59 kB
  string or a 500-digit integer is cut, with its size said).
- ``shorten_tokens(text)``: a message with every overlong word cut the same way (the CLI's last
  guard: no message echoes a whole file).
- ``finite_result(values, what)``: ``values`` computed from a user's input, refused with a
  ``UserError`` naming ``what`` (the field or option) when they overflowed; computed under
  ``quiet()`` (numpy's floating-point warnings off), so no warning reaches the terminal.
- ``numeric_warnings_raised()``: the CLI's last guard, around a whole verb: numpy's
  floating-point warnings (overflow, invalid value, division by zero) raised as exceptions,
  which ``numeric_error`` turns into one line naming where the computation failed (exit 2), or
  which a run's loop takes as a fault (torque off). The readers refuse what they can name
  (``LARGEST`` in ``schema``, ``finite_result``) before it gets there.
"""

from __future__ import annotations

import math
import tomllib
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError

EXCERPT = 80  # characters of a value shown in a message
_LONG_TOKEN = 120  # a word of a message longer than this is cut to an excerpt


def excerpt(value, limit: int = EXCERPT) -> str:
    """``repr(value)`` (a string: quoted) cut to ``limit`` characters, its size said when cut;
    an integer too long for that says how many digits it has (Python refuses to convert one
    of more than 4300 digits to text)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}an integer of about {digits} digits"
    try:
        text = repr(value)
    except ValueError:  # an integer nested in a list, beyond the conversion limit
        return f"a {type(value).__name__} holding an integer too long to show"
    except RecursionError:
        return f"a {type(value).__name__} nested too deep to show"
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text)} characters)"


def shorten_tokens(text: str, limit: int = EXCERPT) -> str:
    """``text`` with every word (run of characters without white space) longer than
    ``_LONG_TOKEN`` cut to ``limit`` characters, its size said; a word naming an existing
    file (a message's leading ``path:``) is kept whole."""
    if len(text) <= _LONG_TOKEN:
        return text

    def short(w: str) -> str:
        if len(w) <= _LONG_TOKEN or (len(w) < 4096 and "/" in w and Path(w.rstrip(":,;")).exists()):
            return w
        return f"{w[:limit - 3]}... ({len(w)} characters)"
    return " ".join(short(w) for w in text.split(" "))


def read_toml(path, error: type[UserError] = UserError) -> dict:
    """The TOML document of ``path``; ``error`` (one line naming the file) when it is not one."""
    raw = Path(path).read_bytes()
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise error(f"{path}: not a valid TOML file: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise error(f"{path}: not a valid TOML file: {shorten_tokens(str(e))}") from None
    except ValueError as e:  # an integer of more digits than Python converts (4300)
        raise error(f"{path}: not a valid TOML file: {shorten_tokens(str(e).split(';')[0])}") from None
    except RecursionError:
        raise error(f"{path}: not a valid TOML file: values nested too deep") from None


@contextmanager
def quiet():
    """numpy's floating-point warnings off inside (overflow, invalid, division by zero): the
    results say what went wrong (``finite_result``)."""
    with np.errstate(all="ignore"):
        yield


def finite_result(values, what: str, got=None) -> np.ndarray:
    """``values`` (array-like) if every one is finite, else a ``UserError``: ``what`` (the
    field or option the values came from) is too large to compute with (``got``: the input
    shown, as an excerpt)."""
    a = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(a)):
        shown = "" if got is None else f", got {excerpt(got)}"
        raise UserError(f"{what}: values too large to compute with (the result overflows){shown}")
    return a


_NUMERIC = r"(overflow|invalid value|divide by zero|underflow) encountered"


@contextmanager
def numeric_warnings_raised():
    """numpy's floating-point warnings raised as ``RuntimeWarning`` exceptions inside (the
    filter is the process's: threads started inside raise them too)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=_NUMERIC, category=RuntimeWarning)
        yield


class NumericFailure(UserError):
    """A computation on the user's values overflowed or became undefined (one line, exit 2)."""


def numeric_error(w: RuntimeWarning) -> NumericFailure:
    """The one-line error of a raised numeric warning: what numpy said and the pkrt function
    where it happened (an input value is out of the range that computation takes)."""
    root = Path(__file__).resolve().parents[2]  # the source tree: rt/, models/, drivers/, hil/
    frames = [f for f in traceback.extract_tb(w.__traceback__) if Path(f.filename).resolve().is_relative_to(root)]
    last = frames[-1] if frames else None
    where = f" in {Path(last.filename).resolve().relative_to(root)}:{last.lineno} ({last.name})" if last else ""
    return NumericFailure(f"numeric failure ({shorten_tokens(str(w))}){where}: an input value is too large or "
                          f"not physical for this computation")
