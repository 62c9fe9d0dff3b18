"""No function in ``rt/``, ``drivers/`` or ``hil/`` above cyclomatic complexity ``LIMIT``
(radon's measure: 1 + one per branch, loop, boolean operator, except and comprehension
clause), unless ``ALLOWED`` names it with a one-line reason (issue 21).

Functions, methods, nested functions (closures) and methods of nested classes are each
measured on their own, as ``radon cc -s`` lists them. An ``ALLOWED`` entry that no longer
names a function above the limit fails too, so the table never outlives its reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from radon.visitors import ComplexityVisitor

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("rt", "drivers", "hil")
LIMIT = 20

# "path:qualified name" -> why this one stays above LIMIT (one line); empty: none does
ALLOWED: dict[str, str] = {}


def _functions(fns, classes, prefix: str = ""):
    """(qualified name, complexity, line) of every function, closure and method, nested
    classes included."""
    for f in fns:
        name = f"{prefix}{f.name}"
        yield name, f.complexity, f.lineno
        yield from _functions(f.closures, [], f"{name}.")
    for c in classes:
        yield from _functions(c.methods, c.inner_classes, f"{prefix}{c.name}.")


def complexities(source: str, where: str) -> dict[str, tuple[int, int]]:
    """``where:qualified name`` -> (complexity, line) for every function of ``source``."""
    v = ComplexityVisitor.from_code(source)
    return {f"{where}:{name}": (cc, line) for name, cc, line in _functions(v.functions, v.classes)}


def measure() -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            out.update(complexities(path.read_text(encoding="utf-8"), rel))
    return out


@pytest.fixture(scope="module")
def measured() -> dict[str, tuple[int, int]]:
    return measure()


def test_no_function_above_the_limit_without_a_reason(measured):
    over = {k: v for k, v in measured.items() if v[0] > LIMIT and k not in ALLOWED}
    assert not over, "above cyclomatic complexity %d (split it, or add it to ALLOWED with a reason):\n%s" % (
        LIMIT, "\n".join(f"  {k} (line {line}): {cc}" for k, (cc, line) in sorted(over.items())))


def test_every_allowed_entry_is_still_needed(measured):
    stale = [k for k in ALLOWED if k not in measured or measured[k][0] <= LIMIT]
    assert not stale, "ALLOWED entries that no longer name a function above %d (remove them): %s" % (
        LIMIT, ", ".join(f"{k} ({measured[k][0] if k in measured else 'not found'})" for k in stale))
    assert all(r.strip() and "\n" not in r for r in ALLOWED.values())


def _branches(indent: str, n: int) -> str:
    return "".join(f"{indent}if x == {i}:\n{indent}    x += 1\n" for i in range(n))


def test_the_measure_sees_methods_closures_and_nested_classes():
    """A function with LIMIT branches measures LIMIT + 1 wherever it is defined."""
    src = ("def flat(x):\n" + _branches("    ", LIMIT) + "    return x\n"
           "class A:\n    class B:\n        def m(self, x):\n" + _branches("            ", LIMIT)
           + "def outer():\n    def inner(x):\n" + _branches("        ", LIMIT) + "    return inner\n")
    got = complexities(src, "x.py")
    assert got["x.py:flat"][0] == LIMIT + 1
    assert got["x.py:A.B.m"][0] == LIMIT + 1
    assert got["x.py:outer.inner"][0] == LIMIT + 1 and got["x.py:outer"][0] == 1
