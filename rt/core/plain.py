"""Plain data: numpy scalars and arrays, tuples and non-finite floats turned into what JSON
holds (part of the core)."""

from __future__ import annotations

import numpy as np


def to_jsonable(x):
    """``x`` with dicts keyed by strings, lists for tuples and arrays, Python numbers for numpy
    ones, and None for NaN and infinities."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if np.isfinite(v) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x
