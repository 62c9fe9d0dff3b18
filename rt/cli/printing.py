"""What a verb prints: one JSON object (``--json``) or indented plain text."""

from __future__ import annotations

import json

import numpy as np

from pkrt.rt.core.plain import to_jsonable


def emit(result: dict, as_json: bool, text: str | None = None) -> None:
    """Print one JSON object (``--json``) or the human-readable text."""
    if as_json:
        print(json.dumps(to_jsonable(result)))
    else:
        print(text if text is not None else _plain(result))


def _plain(d: dict, indent: str = "") -> str:
    lines = []
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"{indent}{k}:")
            lines.append(_plain(v, indent + "  "))
        else:
            if isinstance(v, np.ndarray):
                v = np.array2string(v, precision=6, suppress_small=False)
            lines.append(f"{indent}{k}: {v}")
    return "\n".join(lines)
