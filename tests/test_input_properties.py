"""Property-based: configuration and model documents with a value of any TOML type at any
field, through the real CLI entry (``pkrt.rt.cli.main`` in this process; a few through a
subprocess too), always end in exit 0, or exit 2 with exactly one ``pkrt: error:`` line on
stderr; never a traceback, never a warning (of any kind: every warning raised in the call is
recorded and must be none).

The documents: the four-bar's configuration on each drive family (the simulated plant: ``pkrt
run`` in lockstep for 10 ms; CiA 402 and Dynamixel, on the Delta: ``pkrt plan`` of a short
actuator path, which reads every table) and the four-bar's description (``pkrt model check``).
Each example replaces, adds or deletes one to three fields (or whole tables) with values drawn
from every TOML type: booleans, integers up to far beyond 64 bits, floats with NaN, infinities
and 1e300, strings (empty, unicode, control characters, 10 kB), dates and times, nested arrays
and inline tables; plausible values too, so that some documents are valid and run.

Reproducible: a fixed profile (``derandomize=True``, no example database), a bounded number of
examples per family (``EXAMPLES``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkrt.rt.cli import main
from tests.test_bad_inputs import CONFIG, MACHINES, MAX_LINE, MODEL

EXAMPLES = 200  # per document family
PROFILE = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                          HealthCheck.data_too_large])

# -- TOML text of any document (the stdlib reads TOML only) ---------------------------------------------


def _key(k: str) -> str:
    return json.dumps(k)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Digits):
        return "9" * v.n
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON escapes are TOML basic-string escapes (\uXXXX, \", \\, \n, ...)
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def toml_text(doc: dict) -> str:
    """Scalars first, then tables and arrays of tables (any other value inline)."""
    def tables(v):
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)
    out = [f"{_key(k)} = {_value(v)}" for k, v in doc.items() if not isinstance(v, dict) and not tables(v)]
    for k, v in doc.items():
        if isinstance(v, dict):
            out += [f"\n[{_key(k)}]"] + [f"{_key(a)} = {_value(b)}" for a, b in v.items()]
        elif tables(v):
            for item in v:
                out += [f"\n[[{_key(k)}]]"] + [f"{_key(a)} = {_value(b)}" for a, b in item.items()]
    return "\n".join(out) + "\n"


# -- values of every TOML type ----------------------------------------------------------------------------

class Digits(int):
    """An integer written with ``n`` nines (a TOML integer of 5000 digits: Python refuses to
    convert one of more than 4300 to text, and so to show it)."""

    def __new__(cls, n: int):
        obj = super().__new__(cls, n)
        obj.n = n
        return obj

    def __repr__(self) -> str:
        return f"Digits({self.n})"


HUGE_INTS = [2 ** 63 - 1, 2 ** 63, -(2 ** 63) - 1, 2 ** 64, 10 ** 400, -(10 ** 400), Digits(5000)]
ODD_FLOATS = [math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-300, 5e-324, 1.7976931348623157e308, -0.0, 1e12,
              1e13]
scalars = st.one_of(
    st.booleans(),
    st.integers(-3, 130),  # plausible: ids, counts, priorities
    st.integers(),
    st.sampled_from(HUGE_INTS),
    st.floats(-10.0, 10.0),  # plausible: most physical values
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_FLOATS),
    st.text(max_size=20),
    st.sampled_from(["", "ct", "exact", "tree", "sim", "cia402", "dynamixel", "socketcan", "virtual", "fourbar.pkt",
                     "fourbar.toml", "delta", "x" * 10_000, "\u00e9\u4e2d\U0001F600", "\x00\x01\x7f", "../" * 40,
                     "revolute", "ground", "output", "circle", "adept-cycle", "none", "quick-stop"]),
    st.datetimes(), st.dates(), st.times(),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                              max_size=3),
                      max_leaves=8)


def _fields(doc: dict) -> list[tuple[str, int | None, str]]:
    """(table, index of an array of tables or None, field) of every field of ``doc``."""
    out = []
    for t, v in doc.items():
        if isinstance(v, dict):
            out += [(t, None, f) for f in v]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out += [(t, i, f) for i, x in enumerate(v) for f in x]
    return out


def magnitudes(lo: float | None, hi: float | None, lo_open: bool = False):
    """Numbers within [lo, hi] spread over every magnitude (1e-300 to 1e12), the bounds
    themselves included: valid values a schema accepts, however extreme."""
    lo = -1e12 if lo is None else lo
    hi = 1e12 if hi is None else hi
    spread = st.builds(lambda m, e, sg: sg * m * 10.0 ** e, st.floats(1.0, 9.99), st.integers(-300, 11),
                       st.sampled_from([1.0, -1.0]))
    inside = spread.filter(lambda x: (lo < x if lo_open else lo <= x) and x <= hi)
    ends = [x for x in (lo, hi, 0.0) if (lo < x if lo_open else lo <= x) and x <= hi]
    return st.one_of(inside, st.sampled_from(ends)) if ends else inside


def plausible(meta: dict, s: int):
    """Values a schema field accepts (of its kind, within its bounds), for documents that get
    past the reader and run with extreme but valid values."""
    from pkrt.rt.core import schema

    kind, lo, hi = meta["kind"], meta["lo"], meta["hi"]
    if meta["choices"]:
        return st.sampled_from(list(meta["choices"]))
    num = magnitudes(lo, hi, meta["lo_open"])
    if meta.get("integer") or kind == schema.INTEGER:
        num = st.integers(int(max(lo if lo is not None else -2 ** 31, -2 ** 31)),
                          int(min(hi if hi is not None else 2 ** 31, 2 ** 31)))
    return {schema.NUMBER: num, schema.INTEGER: num, schema.AXES: num | st.lists(num, min_size=s, max_size=s),
            schema.BOOL: st.booleans(), schema.STRING: st.text(min_size=1, max_size=8),
            schema.CHANNEL: st.text(min_size=1, max_size=8) | st.integers(0, 10),
            schema.IDS: st.lists(num, min_size=s, max_size=s, unique=True),
            schema.PAIRS: st.lists(st.tuples(num, num).filter(lambda p: p[0] < p[1]).map(list), min_size=s, max_size=s),
            schema.NUMBERS: st.lists(num, min_size=1, max_size=6),
            schema.POINTS: st.lists(st.lists(num, min_size=s, max_size=s), min_size=2, max_size=4),
            schema.TABLE: st.dictionaries(st.text(min_size=1, max_size=6), scalars, max_size=2)}[kind]


@st.composite
def mutated(draw, base: dict, known_fields: list[tuple[str, str, object]]):
    """``base`` with one to three edits: a field (present, or one of ``known_fields`` the
    schema has: (table, field, its strategy of accepted values or None)) set to any value or
    to one it accepts, deleted, or a whole table replaced or added."""
    import copy

    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "set", "schema", "valid", "valid", "valid", "del", "table"]))
        present = _fields(doc)
        if kind == "table":
            name = draw(st.sampled_from(sorted(doc) + ["extra", ""]))
            doc[name] = draw(values)
        elif kind in ("schema", "valid") and known_fields:
            t, f, ok = draw(st.sampled_from(known_fields))
            tbl = doc.get(t)
            if isinstance(tbl, dict):
                tbl[f] = draw(ok if kind == "valid" and ok is not None else values)
        elif present:
            t, i, f = draw(st.sampled_from(present))
            tbl = doc[t] if i is None else doc[t][i]
            if kind == "del":
                tbl.pop(f, None)
            else:
                tbl[f] = draw(values)
    return doc


# -- the check -----------------------------------------------------------------------------------------------

def check(argv, capsys, faults: bool = False) -> tuple[int, str]:
    """``pkrt ARGV`` in this process: exit 0, or 2 with one ``pkrt: error:`` line of at most
    ``MAX_LINE`` characters (with ``faults``, a run: or 1, a fault at run time, with its one
    line); no traceback, no warning of any kind."""
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert not caught, [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
    assert "Traceback" not in err and "Warning" not in err, err[-3000:]
    lines = err.strip().splitlines()
    if code == 0:
        assert not any(ln.startswith("pkrt: error") for ln in lines), err
    else:
        assert code == 2 or (faults and code == 1), (code, err[-3000:])
        errors = [ln for ln in lines if ln.startswith("pkrt: error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], err[-3000:]  # reading notes may precede it
        assert all(ln.startswith(("pkrt: warning: ", "pkrt: note: ")) for ln in lines[:-1]), err[-3000:]
        assert len(errors[0]) <= MAX_LINE, (len(errors[0]), errors[0][:300])
    return code, err


STATS: dict[str, dict[int, int]] = {}


def _count(family: str, code: int) -> None:
    STATS.setdefault(family, {0: 0, 1: 0, 2: 0})[code] += 1


# -- the documents ----------------------------------------------------------------------------------------------

def _schema_fields(backend: str, s: int) -> list[tuple[str, str, object]]:
    from pkrt.rt.core import schema
    from pkrt.rt.runtime.machine.config import tables_of

    return [(t, f.name, plausible(f.metadata, s)) for t, cls in tables_of(backend) for f in schema.fields(cls)]


def _config_of(backend: str) -> dict:
    """A valid configuration per drive family: the four-bar's on the simulated plant; the
    Delta's shipped CiA 402 and Dynamixel ones (paths made absolute)."""
    if backend == "sim":
        return json.loads(json.dumps(CONFIG))
    name = {"cia402": "delta-can.toml", "dynamixel": "delta-serial.toml"}[backend]
    doc = tomllib.loads((MACHINES / name).read_text())
    for t in doc.values():
        for k, v in t.items():
            if isinstance(v, str) and (MACHINES / v).is_file():
                t[k] = str(MACHINES / v)
    doc["machine"]["model"] = str(MACHINES / "delta.toml")
    return doc


# the cases issue 34 found, always tried first: (table, index or None, field, value)
CONFIG_EXAMPLES = {
    "sim": [("limits", None, "velocity", 1e300), ("demo", None, "move_time", 1e12), ("controller", None, "kp", [[1.0]]),
            ("drives", None, "seed", 10 ** 400)],
    "cia402": [("drives", None, "node_ids", [[1], [2], [3]]), ("drives", None, "channel", "x" * 60_000),
               ("drives", None, "bus_options", {"a": [1, [2]]})],
    "dynamixel": [("drives", None, "ids", [[1, 2], 2, 3]), ("drives", None, "port", Digits(5000))],
}
MODEL_EXAMPLES = [("model", None, "gravity", [0.0, 1e300, 0.0]), ("bodies", 0, "inertia", [[1.0, 2.0], [3.0]]),
                  ("actuators", 0, "range", [-1e300, 1e300]), ("bodies", 1, "name", "x" * 60_000)]


def _examples(base: dict, edits):
    """``hypothesis.example`` of ``base`` with each of ``edits`` applied."""
    import copy

    from hypothesis import example

    def wrap(f):
        for t, i, k, v in edits:
            doc = copy.deepcopy(base)
            (doc[t] if i is None else doc[t][i])[k] = v
            f = example(doc)(f)
        return f
    return wrap


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("docs")
    for name in ("fourbar.toml", "fourbar.pkt", "fivebar.pkt"):
        os.symlink(MACHINES / name, d / name)
    shutil.copy(MACHINES / "fourbar.pkt", d / "fourbar-plant.pkt")  # the plant on a copy of the tree: fast
    (d / "path.csv").write_text("theta1,theta2,theta3\n0.1,0.1,0.1\n0.15,0.12,0.1\n")
    return d


def _verb(backend: str, path: Path, folder: Path) -> list:
    if backend == "sim":
        return ["run", "--machine", path, "--lockstep", "--duration", "0.01", "--no-log", "--no-rt"]
    return ["plan", folder / "path.csv", "--machine", path, "-o", folder / f"out-{backend}.csv", "--grid", "20"]


@pytest.mark.parametrize("backend", ["sim", "cia402", "dynamixel"])
def test_any_configuration_document(backend, folder, capsys):
    base = _config_of(backend)
    code, err = check(_verb(backend, _write(folder, backend, base), folder), capsys)
    assert code == 0, err  # the base runs

    @PROFILE
    @given(mutated(base, _schema_fields(backend, 1 if backend == "sim" else 3)))
    @_examples(base, CONFIG_EXAMPLES[backend])
    def run(doc):
        code, _ = check(_verb(backend, _write(folder, backend, doc), folder), capsys, faults=backend == "sim")
        _count(backend, code)

    run()
    print(f"\n{backend}: {STATS[backend]}")  # exit codes seen (pytest -s shows them)
    assert STATS[backend][2] > 0


def _write(folder: Path, name: str, doc: dict) -> Path:
    p = folder / f"{name}.toml"
    p.write_text(toml_text(doc), encoding="utf-8")
    return p


vec3 = st.lists(magnitudes(None, None), min_size=3, max_size=3)
MODEL_FIELDS = [("model", "name", None), ("model", "gravity", vec3), ("model", "singular_threshold", magnitudes(0, 1e12, True)),
                ("tool", "body", st.sampled_from(["input", "coupler", "output", "ground"])), ("tool", "point", vec3),
                ("tool", "rotation", vec3), ("tool", "coordinates", st.sampled_from([["x"], ["y"], ["z"], ["x", "y"]])),
                ("assembly", "theta", st.lists(magnitudes(-10, 10), min_size=1, max_size=1))]


def test_any_model_document(folder, capsys):
    code, err = check(["model", "check", _write(folder, "model", MODEL)], capsys)
    assert code == 0, err

    @PROFILE
    @given(mutated(MODEL, MODEL_FIELDS))
    @_examples(MODEL, MODEL_EXAMPLES)
    def run(doc):
        code, _ = check(["model", "check", _write(folder, "model", doc)], capsys)
        _count("model", code)

    run()
    print(f"\nmodel: {STATS['model']}")
    assert STATS["model"][2] > 0


@pytest.mark.parametrize("case", range(4))
def test_documents_through_the_console_script(case, folder):
    """A few generated documents through a real process: stderr as a user sees it."""
    import random

    rng = random.Random(case)
    doc = json.loads(json.dumps(CONFIG))
    t = rng.choice(["controller", "limits", "drives", "demo"])
    doc[t][rng.choice(sorted(doc[t]))] = rng.choice([[[1.0]], 10 ** 400, 1e300, "x" * 60_000, {"a": [1, {}]}, []])
    p = folder / f"proc-{case}.toml"
    p.write_text(toml_text(doc))
    r = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "run", "--machine", str(p), "--lockstep", "--duration",
                        "0.01", "--no-log", "--no-rt"], capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 0 or (r.returncode == 2 and len(lines) == 1 and lines[0].startswith("pkrt: error: ")
                                 and len(lines[0]) <= MAX_LINE), r.stderr[-2000:]
