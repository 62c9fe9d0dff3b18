"""Versions of the software that produced a file (recorded in tree headers)."""

from __future__ import annotations

import platform
from importlib import metadata

PACKAGES = ("pkrt", "numpy", "scipy", "numba", "msgpack")


def software_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """{"python": "3.x.y", package: installed version or None} for the given packages."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
