"""argparse types of the verbs' options: vectors, whole and positive numbers; a value that is
not one is refused in one line naming it."""

from __future__ import annotations

import argparse

import numpy as np

from pkrt.rt.core.inputs import excerpt


def vector(text: str) -> np.ndarray:
    """argparse type for comma-separated numbers."""
    try:
        v = np.array([float(x) for x in text.split(",") if x.strip() != ""], dtype=float)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {excerpt(text)}") from None
    if v.size == 0:
        raise argparse.ArgumentTypeError("expected at least one number")
    return v


def whole_number(lowest: int, highest: int = 10 ** 6):
    """argparse type: an integer in [``lowest``, ``highest``]."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:  # not an integer, or of more digits than Python converts
            v = None
        if v is None or not lowest <= v <= highest:
            raise argparse.ArgumentTypeError(f"expected a whole number in [{lowest}, {highest}], got {excerpt(text)}")
        return v
    return parse


def positive_number(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {excerpt(text)}") from None
    if not (np.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {excerpt(text)}")
    return v
