"""No module of the package (``rt/``, ``models/``, ``drivers/``, ``hil/``) above ``LIMIT`` lines,
and none of ``drivers/`` or ``hil/`` above ``DEVICE_LIMIT`` (issue 33); no class above
``CLASS_LIMIT`` lines (issue 42): a long module or class is cut along a seam a reader
recognises, into modules named for what they hold. A file above its
limit for now is named in ``KNOWN_OVER``; an entry there that is no longer above fails too,
so the set never outlives its reason."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("rt", "models", "drivers", "hil")
LIMIT = 700  # lines, any module
DEVICE_LIMIT = 500  # lines, a module of drivers/ or hil/ (drive families and their emulators)
CLASS_LIMIT = 300  # lines, any class (its decorators excluded)

# classes above the limit for now ("path:Class"); an entry no longer above fails too
KNOWN_LONG_CLASSES: set[str] = {"drivers/cia402.py:CiA402Drives", "drivers/dynamixel.py:DynamixelDrives",
                                "models/planning/ngc_interp.py:Interpreter"}

# none on 2026-11-28 (rt/core/tree.py, 750 lines, was split in issue 33: workspace.py)
KNOWN_OVER: set[str] = set()


def limit_of(rel: str) -> int:
    """The line limit of the module at ``rel`` (a path below the repository's root)."""
    return DEVICE_LIMIT if rel.split("/", 1)[0] in ("drivers", "hil") else LIMIT


def oversized(root: Path) -> dict[str, tuple[int, int]]:
    """``path -> (lines, limit)`` of every module of the package's folders under ``root`` above
    its limit."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > limit_of(rel):
                out[rel] = (n, limit_of(rel))
    return out


def test_no_module_above_its_limit():
    over = {k: v for k, v in oversized(ROOT).items() if k not in KNOWN_OVER}
    assert not over, "modules above their line limit (split them along a seam):\n" + "\n".join(
        f"  {k}: {n} lines, limit {lim}" for k, (n, lim) in sorted(over.items()))


def test_every_known_exception_is_still_over():
    stale = sorted(KNOWN_OVER - set(oversized(ROOT)))
    assert not stale, f"no longer above the limit: remove from KNOWN_OVER: {stale}"


def test_the_limits_name_a_long_module(tmp_path):
    """The check itself: a module one line over its limit is named, one at its limit is not."""
    sizes = {"hil/long.py": 501, "drivers/fits.py": 500, "rt/core/long.py": 701, "models/fits.py": 700,
             "models/sub/long.py": 701, "hil/sub/fits.py": 12}
    for rel, n in sizes.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * n, encoding="utf-8")
    assert oversized(tmp_path) == {"hil/long.py": (501, 500), "rt/core/long.py": (701, 700),
                                   "models/sub/long.py": (701, 700)}


def long_classes(root: Path) -> dict[str, int]:
    """``"path:Class" -> lines`` of every class (nested ones included) of the package's folders
    under ``root`` above ``CLASS_LIMIT`` lines."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LIMIT:
                    out[f"{rel}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_no_class_above_its_limit():
    found = long_classes(ROOT)
    over = {k: v for k, v in found.items() if k not in KNOWN_LONG_CLASSES}
    assert not over, "classes above the limit (split them along a seam):\n" + "\n".join(
        f"  {k}: {n} lines, limit {CLASS_LIMIT}" for k, n in sorted(over.items()))
    stale = sorted(KNOWN_LONG_CLASSES - set(found))
    assert not stale, f"no longer above the limit: remove from KNOWN_LONG_CLASSES: {stale}"
    assert not [k for k in found if k.startswith("rt/runtime/")]  # the runtime's: none, no exception


def test_the_class_limit_names_a_long_class(tmp_path):
    (tmp_path / "rt" / "x").mkdir(parents=True)
    body = "    x = 1\n"
    (tmp_path / "rt" / "x" / "m.py").write_text("class Long:\n" + body * CLASS_LIMIT + "\n\nclass Fits:\n"
                                                 + body * (CLASS_LIMIT - 1), encoding="utf-8")
    assert long_classes(tmp_path) == {"rt/x/m.py:Long": CLASS_LIMIT + 1}
