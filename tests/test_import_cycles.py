"""No import cycle between the package's modules (rt, models, drivers, hil): the module import
graph (grimp, as import-linter builds it, imports inside functions included, plus the imports
made through ``importlib``) has no strongly connected component of more than one module. A
module that calls ``importlib.import_module`` (or ``__import__``) is taken to import every module
of the package that a string constant in it names (``"pkrt.drivers.sim:SimDrives"`` names
``pkrt.drivers.sim``): the factories' tables (drive backends, CLI verbs, benchmark sections) and
literal arguments alike. The other tests introduce a cycle, a plain one and one through
``importlib``, into a copy of the package and check that it is found and named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rt", "models", "drivers", "hil")

# Runs in a child process whose path holds only the laid-out package (as a wheel installs it).
FIND_CYCLES = r"""
import json, sys
import grimp

import ast, importlib.util

graph = grimp.build_graph("pkrt", include_external_packages=False)
edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}

# imports through importlib: every module named by a string constant of a module that calls it
for m in edges:
    origin = importlib.util.find_spec(m).origin
    if origin is None:  # the namespace package pkrt itself
        continue
    tree = ast.parse(open(origin, encoding="utf-8").read())
    calls = any(isinstance(n, ast.Call) and ((isinstance(n.func, ast.Attribute) and n.func.attr == "import_module")
                                             or (isinstance(n.func, ast.Name) and n.func.id in ("import_module", "__import__")))
                for n in ast.walk(tree))
    if not calls:
        continue
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            name = n.value.split(":")[0]
            if name in edges and name != m:
                edges[m].add(name)
edges = {m: sorted(v) for m, v in edges.items()}

# Tarjan's strongly connected components, iteratively (no recursion limit)
index, low, on_stack, stack, sccs, counter = {}, {}, set(), [], [], [0]
for root in edges:
    if root in index:
        continue
    work = [(root, 0)]
    while work:
        v, i = work.pop()
        if i == 0:
            index[v] = low[v] = counter[0]; counter[0] += 1
            stack.append(v); on_stack.add(v)
        for j in range(i, len(edges[v])):
            w = edges[v][j]
            if w not in index:
                work.append((v, j + 1)); work.append((w, 0))
                break
            if w in on_stack:
                low[v] = min(low[v], index[w])
        else:
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on_stack.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])

def a_cycle(comp):
    # a shortest cycle through the component's first module (breadth-first inside it)
    members, start = set(comp), comp[0]
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in edges[v]:
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp

print(json.dumps({"modules": len(edges), "cycles": [a_cycle(c) for c in sccs]}))
"""


def import_cycles(package_root: Path) -> dict:
    """{"modules": n, "cycles": [[a, b, ..., a], ...]} for the package laid out at package_root
    (a folder holding ``pkrt/``)."""
    r = subprocess.run([sys.executable, "-c", FIND_CYCLES], cwd=package_root, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(package_root)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _layout(tmp_path: Path, copied: str | None = None) -> Path:
    """pkrt/ as a wheel installs it: the four folders linked, ``copied`` one copied instead."""
    (tmp_path / "pkrt").mkdir()
    for name in PACKAGES:
        if name == copied:
            shutil.copytree(ROOT / name, tmp_path / "pkrt" / name,
                            ignore=shutil.ignore_patterns("__pycache__", "machines", "*.nbi", "*.nbc"))
        else:
            (tmp_path / "pkrt" / name).symlink_to(ROOT / name)
    return tmp_path


def test_no_module_imports_its_importer(tmp_path):
    found = import_cycles(_layout(tmp_path))
    assert found["modules"] > 140  # the whole package was read (145 modules on 2026-11-28)
    assert not found["cycles"], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found["cycles"])


def test_an_introduced_cycle_is_found_and_named(tmp_path):
    """mechanism imports joints; joints importing mechanism back (inside a function, as a lazy
    import would) is a cycle."""
    root = _layout(tmp_path, copied="models")
    joints = root / "pkrt" / "models" / "kinematics" / "joints.py"
    joints.write_text(joints.read_text() + "\n\ndef _back():\n    from . import mechanism  # noqa: F401\n")
    cycles = [c for c in import_cycles(root)["cycles"] if c[0].startswith("pkrt.models.")]
    assert len(cycles) == 1, cycles
    assert {"pkrt.models.kinematics.joints", "pkrt.models.kinematics.mechanism"} <= set(cycles[0]), cycles
    assert cycles[0][0] == cycles[0][-1]


def test_a_cycle_through_importlib_is_found_and_named(tmp_path):
    """inputs imports errors; errors importing inputs back through ``importlib.import_module``
    (a name looked up at its first use, as a module ``__getattr__`` would) is a cycle."""
    root = _layout(tmp_path, copied="rt")
    errors = root / "pkrt" / "rt" / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _back():\n    import importlib\n\n"
                      "    return importlib.import_module(\"pkrt.rt.core.inputs\")\n")
    cycles = [c for c in import_cycles(root)["cycles"] if c[0].startswith("pkrt.rt.core.")]
    assert len(cycles) == 1, cycles
    assert {"pkrt.rt.core.errors", "pkrt.rt.core.inputs"} <= set(cycles[0]), cycles
