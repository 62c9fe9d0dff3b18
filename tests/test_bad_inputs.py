"""Every malformed input a user can produce gets one clean line and exit 2, never a traceback.

A corpus of bad inputs of each kind pkrt reads (machine descriptions, machine configurations,
trees, run logs, trajectory CSVs, options, output paths), generated from shipped files by
mutation, runs through the real CLI entry (``pkrt.rt.cli.main``, the console script's code
path; a few through a subprocess too). Each must exit 2 with exactly one line on stderr,
starting ``pkrt: error:``. The base machine is the four-bar (one axis, a 5 kB tree) on the
simulated plant, so that every case fails fast where the input is read.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkrt.rt.cli import main

ROOT = Path(__file__).resolve().parent.parent
MACHINES = ROOT / "models" / "machines"
BIG = 10 ** 400  # an integer no float holds
RUN = ["--duration", "0.01", "--lockstep", "--no-log", "--no-rt"]

# -- a small TOML writer (the stdlib reads TOML only) ------------------------------------------------


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def _is_tables(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def toml_dumps(doc: dict) -> str:
    """TOML text of ``doc``: scalars at the top, then tables and arrays of tables."""
    out = [f"{json.dumps(k)} = {_value(v)}" for k, v in doc.items() if not isinstance(v, dict) and not _is_tables(v)]
    for k, v in doc.items():
        if isinstance(v, dict):
            out.append(f"\n[{json.dumps(k)}]")
            out += [f"{json.dumps(a)} = {_value(b)}" for a, b in v.items()]
        elif _is_tables(v):
            for item in v:
                out.append(f"\n[[{json.dumps(k)}]]")
                out += [f"{json.dumps(a)} = {_value(b)}" for a, b in item.items()]
    return "\n".join(out) + "\n"


# -- the base files ----------------------------------------------------------------------------------

MODEL = tomllib.loads((MACHINES / "fourbar.toml").read_text())

CONFIG = {
    "machine": {"name": "fourbar-sim", "model": "fourbar.toml", "tree": "fourbar.pkt", "rate_hz": 1000.0},
    "controller": {"kind": "ct", "bandwidth_hz": 5.0, "tau_max": 5.0, "viscous": 0.0, "coulomb": 0.0},
    "demo": {"points": [[-0.5], [0.5]], "move_time": 0.5, "dwell": 0.1},
    "limits": {"velocity": 10.0, "acceleration": 200.0, "following_error": 0.5, "stale_cycles": 3,
               "watchdog_cycles": 5},
    "drives": {"backend": "sim", "plant_tree": "fourbar-plant.pkt", "substeps": 1, "noise": 0.0, "seed": 0},
    "realtime": {"priority": 0, "cpu": -1, "mlockall": False, "gc_freeze": False},
}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A folder with the four-bar's description, trees and configuration, the five-bar's tree
    (another machine), a trajectory CSV and a short run log."""
    d = tmp_path_factory.mktemp("base")
    for name in ("fourbar.toml", "fourbar.pkt", "fivebar.pkt"):
        shutil.copy(MACHINES / name, d / name)
    shutil.copy(MACHINES / "fourbar.pkt", d / "fourbar-plant.pkt")  # the plant on the same tree: fast
    (d / "fourbar-sim.toml").write_text(toml_dumps(CONFIG))
    (d / "traj.csv").write_text("t,theta\n0,0\n0.5,0.1\n1,0.2\n")
    assert main(["run", "--machine", str(d / "fourbar-sim.toml"), "--lockstep", "--duration", "0.05",
                 "--no-rt", "--log", str(d / "run.pktlog"), "--plot", str(d / "run.png")]) == 0
    return d


MAX_LINE = 1000  # characters of an error line: values appear as excerpts, never whole


def check_one_line(code: int, err: str, argv) -> None:
    lines = err.strip().splitlines()
    assert "Traceback" not in err, (argv, err[-3000:])
    assert code == 2, (argv, code, err[-3000:])
    assert len(lines) == 1 and lines[0].startswith("pkrt: error: "), (argv, err[-3000:])
    assert len(lines[0]) <= MAX_LINE, (argv, len(lines[0]), lines[0][:300])


def run_cli(argv: list[str], capsys) -> None:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    check_one_line(code, capsys.readouterr().err, argv)


def run_on_file(content: bytes, path: Path, capsys, *verb) -> None:
    """Write ``content`` to ``path``, then run ``pkrt VERB... PATH``."""
    path.write_bytes(content)
    run_cli([*verb, path], capsys)


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def sample(bads: list, n: int) -> list[tuple[int, object]]:
    """The first bad value (a huge integer) and every third of the others, starting at
    ``n`` mod 3: each field gets a few, the fields together get them all (a shorter suite)."""
    return [(0, bads[0])] + [(k, bads[k]) for k in range(1 + n % 3, len(bads), 3)]


# -- machine descriptions ------------------------------------------------------------------------------

# bad values by the kind of field they replace (each is refused whatever the field)
NOT_A_NUMBER = [BIG, -BIG, math.inf, -math.inf, math.nan, "1.0", True, [1.0], {"a": 1.0}]
NOT_A_VECTOR = [BIG, 1.0, "x", [], [BIG, 0.0, 0.0], [0.0, -BIG, 0.0], [math.inf, 0.0, 0.0], [math.nan, 0, 0],
                [0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [True, 0.0, 0.0], ["a", "b", "c"], [[0.0], [0.0], [0.0]],
                {"x": 1.0}]
NOT_A_NAME = [BIG, 1, 1.5, True, "", [], ["a"], {"a": "b"}]

MODEL_FIELDS = {  # (table, index or None) -> {field: bad values}
    ("model", None): {"name": NOT_A_NAME, "gravity": NOT_A_VECTOR, "singular_threshold": NOT_A_NUMBER + [0.0, -1.0]},
    ("bodies", 0): {"name": NOT_A_NAME + ["ground", "coupler"], "mass": NOT_A_NUMBER + [0.0, -1.0],
                    "inertia": NOT_A_VECTOR[:-2] + [[1.0, 0.0, 0.0], [-1.0, 1.0, 1.0], [[1, 2, 3], [4, 5, 6], [7, 8, 9]]],
                    "position": NOT_A_VECTOR, "rotation": NOT_A_VECTOR, "com": NOT_A_VECTOR},
    ("joints", 0): {"name": NOT_A_NAME + ["A"], "type": NOT_A_NAME + ["hinge"], "body1": NOT_A_NAME + ["nobody"],
                    "body2": NOT_A_NAME + ["ground"], "point1": NOT_A_VECTOR, "point2": NOT_A_VECTOR,
                    "axis1": NOT_A_VECTOR + [[0.0, 0.0, 0.0]], "ref1": NOT_A_VECTOR + [[0.0, 0.0, 1.0]],
                    "ref2": NOT_A_VECTOR},
    ("joints", 1): {"axis2": NOT_A_VECTOR, "at": NOT_A_VECTOR},
    ("actuators", 0): {"name": NOT_A_NAME, "joint": NOT_A_NAME + ["Z"],
                       "range": [BIG, [0.0], [1.0, 0.0], [0.0, BIG], [-BIG, 0.0], [math.nan, 1.0], ["a", "b"], [0, 0]],
                       "offset": NOT_A_NUMBER},
    ("assembly", None): {"theta": [BIG, [BIG], [-BIG], [math.inf], [math.nan], ["a"], [0.0, 0.0], [], [True]]},
}

MODEL_REQUIRED = {"model": ("name", "gravity"), "bodies": ("name", "mass", "inertia"),
                  "joints": ("name", "type", "body1", "body2", "point1", "axis1"),
                  "actuators": ("name", "joint", "range")}


def _model_cases():
    cases = []
    for (table, idx), fields in MODEL_FIELDS.items():
        for field, bads in fields.items():
            for k, bad in sample(bads, len(cases)):
                cases.append((f"{table}-{field}-{k}", ("set", table, idx, field, bad)))
            if field in MODEL_REQUIRED.get(table, ()):
                cases.append((f"{table}-{field}-missing", ("del", table, idx, field, None)))
    for table, idx in MODEL_FIELDS:
        cases.append((f"{table}-unknown-key", ("set", table, idx, "colour_typo", 1.0)))
    cases += [("unknown-table", ("top", "extras", None, None, {"a": 1})),
              ("tool-unknown-key", ("top", "tool", None, None, {"body": "output", "pointt": [0, 0, 0]})),
              ("tool-bad-body", ("top", "tool", None, None, {"body": "nobody"})),
              ("tool-big-point", ("top", "tool", None, None, {"body": "output", "point": [BIG, 0, 0]})),
              ("tool-coordinates", ("top", "tool", None, None, {"body": "output", "coordinates": ["x", "q"]})),
              ("tool-not-a-table", ("top", "tool", None, None, 3)),
              ("model-not-a-table", ("top", "model", None, None, [1, 2])),
              ("bodies-not-tables", ("top", "bodies", None, None, [1, 2])),
              ("no-joints", ("top", "joints", None, None, [])),
              ("assembly-not-a-table", ("top", "assembly", None, None, 1.0))]
    return cases


def _mutated(doc: dict, op) -> dict:
    kind, table, idx, field, value = op
    doc = copy.deepcopy(doc)
    if kind == "top":
        doc[table] = value
        return doc
    tbl = doc.setdefault(table, {}) if idx is None else doc[table][idx]
    if kind == "del":
        tbl.pop(field, None)
    else:
        tbl[field] = value
    return doc


@pytest.mark.parametrize("op", [c[1] for c in _model_cases()], ids=[c[0] for c in _model_cases()])
def test_bad_model_value(op, tmp_path, capsys):
    p = tmp_path / "m.toml"
    p.write_text(toml_dumps(_mutated(MODEL, op)))
    run_cli(["model", "check", p], capsys)


def test_unknown_model_key_names_the_key_and_the_file(tmp_path, capsys):
    p = tmp_path / "m.toml"
    p.write_text(toml_dumps(_mutated(MODEL, ("set", "bodies", 1, "mas", 1.0))))
    assert main(["model", "check", str(p)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and "'mas'" in err and "unknown" in err


TEXTS = {  # broken files of every kind that stands where a TOML file is read
    "empty": b"", "spaces": b"   \n\n", "syntax": b"[model\nname = ", "duplicate-key": b"[model]\nname='a'\nname='b'\n",
    "binary": bytes(range(256)), "latin1": "[model]\nname = 'caf\xe9'\n".encode("latin-1"),
    "nul": b"[model]\x00\n", "csv": b"t,theta\n0,0\n", "png": b"\x89PNG\r\n\x1a\n0000",
    "huge-int": b"[model]\nname = 'x'\ngravity = [0, 0, " + str(BIG).encode() + b"]\n",
    "inf": b"[model]\nname = 'x'\ngravity = [0, 0, inf]\n",
    "deep": b"[model]\nname = 'x'\ngravity = " + b"[" * 200 + b"]" * 200 + b"\n",
}


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_broken_model_file(name, tmp_path, capsys):
    run_on_file(TEXTS[name], tmp_path / "m.toml", capsys, "model", "check")


@FUZZ
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_random_model_file(tmp_path, capsys, data):
    run_on_file(b"[model]\n" + data, tmp_path / "m.toml", capsys, "model", "check")


# -- machine configurations ----------------------------------------------------------------------------

def _config_cases():
    from pkrt.rt.core import schema
    from pkrt.rt.runtime.machine.config import tables_of

    cases = []
    for table, cls in tables_of("sim"):
        for f in schema.fields(cls):
            m = f.metadata
            kind = m["kind"]
            bads = [BIG, -BIG, [], {"a": 1}]
            if kind in (schema.NUMBER, schema.INTEGER, schema.AXES):
                bads += [math.inf, math.nan, "1", True]
                if kind == schema.AXES:
                    bads += [[1.0, 2.0], [BIG], [math.nan]]
                if m["lo"] is not None:
                    bads.append(m["lo"] - 1)
                if kind == schema.INTEGER:
                    bads += [1.5, 2 ** 63, -(2 ** 63) - 1]  # integers fit 64 bits
            elif kind == schema.BOOL:
                bads += [1, "true", 0.0]
            elif kind == schema.STRING:
                bads += [1, True, 1.5, ""]
                if m["choices"] or f.name in ("model", "tree", "plant_tree"):
                    bads.append("no-such-thing")
            elif kind in (schema.NUMBERS, schema.POINTS, schema.PAIRS):
                bads += [1.0, "x", [BIG], [[BIG]], [[math.nan, 1.0]], [["a"]], [[1.0], [1.0, 2.0]]]
            for k, bad in sample(bads, len(cases)):
                if f.name == "plant" and bad == "no-such-thing":
                    continue  # reported as "give plant or plant_tree, not both", tested below
                cases.append((f"{table}-{f.name}-{k}", ("set", table, None, f.name, bad)))
            if default_required(f):
                cases.append((f"{table}-{f.name}-missing", ("del", table, None, f.name, None)))
        cases.append((f"{table}-unknown-key", ("set", table, None, "colour_typo", 1)))
        cases.append((f"{table}-not-a-table", ("top", table, None, None, [1, 2])))
    cases += [("unknown-table", ("top", "extras", None, None, {"a": 1})),
              ("emulator-table-for-sim", ("top", "emulator", None, None, {"plant_tree": "fourbar.pkt"})),
              ("backend-unknown", ("set", "drives", None, "backend", "ethercat")),
              ("plant-and-plant-tree", ("set", "drives", None, "plant", "exact")),
              ("plant-tree-of-another-machine", ("set", "drives", None, "plant_tree", "fivebar.pkt")),
              ("tree-of-another-machine", ("set", "machine", None, "tree", "fivebar.pkt")),
              ("tree-is-the-config", ("set", "machine", None, "tree", "fourbar-sim.toml")),
              ("tree-is-a-folder", ("set", "machine", None, "tree", ".")),
              ("plant-tree-is-a-csv", ("set", "drives", None, "plant_tree", "traj.csv")),
              ("plant-tree-is-a-folder", ("set", "drives", None, "plant_tree", ".")),
              ("model-is-a-tree", ("set", "machine", None, "model", "fourbar.pkt")),
              ("model-missing-file", ("set", "machine", None, "model", "nothere.toml")),
              ("model-of-another-machine", ("set", "machine", None, "model", "fivebar")),
              ("demo-points-width", ("set", "demo", None, "points", [[0.0, 0.0], [0.1, 0.1]])),
              ("demo-points-outside", ("set", "demo", None, "points", [[0.0], [50.0]])),
              ("position-limits-width", ("set", "limits", None, "position", [[0.0, 1.0], [0.0, 1.0]]))]
    return cases


def default_required(f) -> bool:
    from pkrt.rt.core import schema

    return schema.default_of(f) is schema.REQUIRED and f.metadata["derive"] is None


def _write_config(base: Path, tmp: Path, doc: dict) -> Path:
    for name in ("fourbar.toml", "fourbar.pkt", "fourbar-plant.pkt", "fivebar.pkt", "traj.csv"):
        os.symlink(base / name, tmp / name)
    p = tmp / "fourbar-sim.toml"
    p.write_text(toml_dumps(doc))
    return p


@pytest.mark.parametrize("op", [c[1] for c in _config_cases()], ids=[c[0] for c in _config_cases()])
def test_bad_machine_configuration(op, base, tmp_path, capsys):
    p = _write_config(base, tmp_path, _mutated(CONFIG, op))
    run_cli(["run", "--machine", p, *RUN], capsys)


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_broken_machine_file(name, base, tmp_path, capsys):
    run_on_file(TEXTS[name].replace(b"[model", b"[machine"), tmp_path / "fourbar-sim.toml", capsys,
                "run", *RUN, "--machine")


def test_unknown_configuration_key_names_the_key_and_the_file(base, tmp_path, capsys):
    p = _write_config(base, tmp_path, _mutated(CONFIG, ("set", "limits", None, "velocty", 1.0)))
    assert main(["run", "--machine", str(p), *RUN]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and "'velocty'" in err and "unknown" in err


# -- trees ---------------------------------------------------------------------------------------------

def _tree_doc() -> tuple[dict, dict]:
    outer = msgpack.unpackb((MACHINES / "fourbar.pkt").read_bytes(), raw=False)
    return outer, msgpack.unpackb(outer["payload"], raw=False)


def _repack(outer: dict, body: dict | None = None, checksum: bool = True) -> bytes:
    outer = dict(outer)
    if body is not None:
        outer["payload"] = msgpack.packb(body, use_bin_type=True)
    if checksum and isinstance(outer.get("payload"), bytes):
        outer["checksum"] = hashlib.sha256(outer["payload"]).hexdigest()
    return msgpack.packb(outer, use_bin_type=True)


def _tree_variants() -> dict[str, bytes]:
    outer, body = _tree_doc()
    raw = (MACHINES / "fourbar.pkt").read_bytes()
    v: dict[str, bytes] = {f"cut-{n}": raw[:n] for n in (1, 8, 40, 100, len(raw) // 2, len(raw) - 1)}
    v["empty"] = b""
    v["not-a-map"] = msgpack.packb([1, 2, 3])
    v["version-99"] = _repack({**outer, "version": 99})
    v["version-1"] = _repack({**outer, "version": 1})
    v["version-big"] = _repack({**outer, "version": 2 ** 64 - 1})
    v["format-other"] = _repack({**outer, "format": "pkrt-log"})
    v["checksum-wrong"] = _repack({**outer, "checksum": "0" * 64}, checksum=False)
    v["payload-not-bytes"] = _repack({**outer, "payload": "text"}, checksum=False)
    v["payload-garbage"] = _repack({**outer, "payload": b"\xc1\xc1\xc1"})
    v["extra-outer-key"] = _repack({**outer, "comment": "x"})
    for key in ("arrays", "header", "kind"):
        v[f"body-no-{key}"] = _repack(outer, {k: x for k, x in body.items() if k != key})
    v["kind-other"] = _repack(outer, {**body, "kind": "voxels"})
    h = body["header"]
    for key in [k for k in h if k != "software"][:12]:  # software: versions, informative only
        v[f"header-no-{key}"] = _repack(outer, {**body, "header": {k: x for k, x in h.items() if k != key}})
        v[f"header-{key}-big"] = _repack(outer, {**body, "header": {**h, key: 2 ** 64 - 1}})
        v[f"header-{key}-list"] = _repack(outer, {**body, "header": {**h, key: [None, "x", 1e308]}})
    arrays = body["arrays"]
    for name in list(arrays)[:12]:
        a = arrays[name]
        v[f"array-{name}-dtype"] = _repack(outer, {**body, "arrays": {**arrays, name: {**a, "dtype": "<f4"}}})
        v[f"array-{name}-shape-big"] = _repack(outer, {**body, "arrays": {**arrays, name: {
            **a, "shape": [2 ** 62, 2 ** 62]}}})
        v[f"array-{name}-shape-negative"] = _repack(outer, {**body, "arrays": {**arrays, name: {**a, "shape": [-1]}}})
        v[f"array-{name}-data-short"] = _repack(outer, {**body, "arrays": {**arrays, name: {
            **a, "data": a["data"][:-1] if a["data"] else b"\x00"}}})
        if a["data"]:
            v[f"array-{name}-nan"] = _repack(outer, {**body, "arrays": {**arrays, name: {
                **a, "data": b"\xff" * len(a["data"])}}})
        v[f"array-{name}-missing"] = _repack(outer, {**body, "arrays": {k: x for k, x in arrays.items() if k != name}})
    return v


TREES = _tree_variants()


@pytest.mark.parametrize("name", sorted(TREES))
def test_broken_tree(name, tmp_path, capsys):
    run_on_file(TREES[name], tmp_path / "t.pkt", capsys, "tree", "info")


@FUZZ
@given(st.data())
def test_tree_with_flipped_bytes(tmp_path, capsys, data):
    raw = bytearray((MACHINES / "fourbar.pkt").read_bytes())
    start = raw.index(_tree_doc()[0]["payload"])  # the checksummed payload: every flip is caught
    for i in data.draw(st.sets(st.integers(start, len(raw) - 1), min_size=1, max_size=4)):
        raw[i] ^= data.draw(st.integers(1, 255))
    run_on_file(bytes(raw), tmp_path / "t.pkt", capsys, "tree", "info")


# -- run logs ------------------------------------------------------------------------------------------

def _log_variants(raw: bytes, tree: bytes) -> dict[str, bytes]:
    v = {f"cut-{n}": raw[:n] for n in (1, 5, 20, 60, 200)}
    v |= {"empty": b"", "garbage": bytes(range(256)) * 4, "a-tree": tree, "text": b"hello\n",
          "msgpack-int": msgpack.packb(5), "msgpack-map": msgpack.packb({"type": "header"}),
          "header-version-big": msgpack.packb({"type": "header", "format": "pkrt-log", "version": 2 ** 64 - 1}),
          "header-no-body": msgpack.packb({"type": "header", "format": "pkrt-log", "version": 2, "run_id": "0" * 32,
                                           "seq": 0, "crc": 0})}
    header_end = raw.index(b"type") + 200
    for k in range(8):
        b = bytearray(raw)
        b[min(len(raw) - 1, 3 + k * header_end // 8)] ^= 0x5A
        v[f"header-flip-{k}"] = bytes(b)
    return v


@pytest.fixture(scope="module")
def logs(base) -> dict[str, bytes]:
    return _log_variants((base / "run.pktlog").read_bytes(), (base / "fourbar.pkt").read_bytes())


LOG_NAMES = sorted(_log_variants(b"\x81\xa4type" + b"\x00" * 400, b"x"))


@pytest.mark.parametrize("verb", [["log", "info"], ["log", "export", "--csv", "{out}"], ["replay"]])
@pytest.mark.parametrize("name", LOG_NAMES)
def test_broken_log(name, verb, logs, tmp_path, capsys):
    run_on_file(logs[name], tmp_path / "r.pktlog", capsys, *[a.format(out=tmp_path / "o.csv") for a in verb])


# -- trajectory CSVs -----------------------------------------------------------------------------------

CSVS = {
    "empty": "", "header-only": "t,theta\n", "one-row": "t,theta\n0,0\n", "no-t": "time,theta\n0,0\n1,0\n",
    "wrong-axis": "t,phi\n0,0\n1,0\n", "extra-column": "t,theta,phi\n0,0,0\n1,0,0\n",
    "ragged": "t,theta\n0,0\n1\n2,0\n", "text-value": "t,theta\n0,0\n1,abc\n", "nan": "t,theta\n0,0\n1,nan\n",
    "inf": "t,theta\n0,0\n1,inf\n", "overflow": "t,theta\n0,0\n1,1e400\n", "big-int": f"t,theta\n0,0\n1,{BIG}\n",
    "big-time": f"t,theta\n0,0\n{BIG},0\n", "huge-span": "t,theta\n0,0\n1e300,0\n", "long-span": "t,theta\n0,0\n1e7,0\n",
    "time-back": "t,theta\n0,0\n1,0\n0.5,0\n", "time-repeat": "t,theta\n0,0\n1,0\n1,0\n",
    "out-of-range": "t,theta\n0,0\n1,5\n", "too-fast": "t,theta\n0,0\n0.001,1\n",
    "binary": "\x00\x01\x02", "bom": "\ufefft,theta\n0,0\n1,0\n", "semicolons": "t;theta\n0;0\n1;0\n",
    "task-space-for-1-dof": "t,x,y,z\n0,0,0,0\n1,0,0,0\n", "quoted": 't,theta\n"0","a"\n1,0\n',
    "negative-time": "t,theta\n-1e300,0\n0,0\n", "empty-cells": "t,theta\n,\n1,0\n",
    "only-comments": "# t,theta\n# 0,0\n",
}


@pytest.mark.parametrize("name", sorted(CSVS))
def test_bad_trajectory_csv(name, base, tmp_path, capsys):
    run_on_file(CSVS[name].encode(), tmp_path / "traj.csv", capsys,  # the whole CSV: no --duration
                "run", *RUN[2:], "--machine", base / "fourbar-sim.toml", "--traj")


@pytest.mark.parametrize("what", ["missing", "folder", "a-log", "a-tree", "a-model"])
def test_trajectory_that_is_not_a_csv(what, base, tmp_path, capsys):
    p = {"missing": tmp_path / "none.csv", "folder": tmp_path, "a-log": base / "run.pktlog",
         "a-tree": base / "fourbar.pkt", "a-model": base / "fourbar.toml"}[what]
    run_cli(["run", "--machine", base / "fourbar-sim.toml", "--traj", p, *RUN], capsys)


# -- options -------------------------------------------------------------------------------------------

OPTIONS = [
    [], ["frobnicate"], ["model"], ["model", "check"], ["model", "check", "fourbar", "--bogus"],
    ["model", "eval", "fourbar"], ["model", "eval", "fourbar", "--theta="], ["model", "eval", "fourbar", "--theta=a"],
    ["model", "eval", "fourbar", f"--theta={BIG}"], ["model", "eval", "fourbar", "--theta=nan"],
    ["model", "eval", "fourbar", "--theta=1,2"], ["model", "eval", "fourbar", "--theta=0", "--theta-dot=1,2"],
    ["model", "check", "nosuchmodel"], ["model", "check", ""], ["model", "check", "{base}/fourbar.pkt"],
    ["build", "fourbar"], ["build", "fourbar", "-o", ""], ["build", "fourbar", "-o", "{tmp}/t.pkt", "--boxes=0"],
    ["build", "fourbar", "-o", "{tmp}/t.pkt", f"--boxes={BIG}"], ["build", "fourbar", "-o", "{tmp}/t.pkt", "--tol=0"],
    ["build", "fourbar", "-o", "{tmp}/t.pkt", "--tol=nan"], ["build", "fourbar", "-o", "{tmp}/t.pkt", "--tol=1e400"],
    ["build", "fourbar", "-o", "{tmp}/t.pkt", "--sing-threshold=nan"],
    ["build", "fourbar", "-o", "{tmp}/t.pkt", "--sing-threshold=-1"],
    ["build", "fourbar", "-o", "{tmp}/t.pkt", "--region=1,0"], ["build", "fourbar", "-o", "{tmp}/t.pkt", "--region=0"],
    ["build", "fourbar", "-o", "{tmp}/t.pkt", "--region=0,1e400"], ["build", "fourbar", "-o", "{tmp}/t.pkt", "--jobs=0"],
    ["build", "fourbar", "-o", "{tmp}/t.pkt", "--kind=cubes"], ["build", "fourbar", "-o", "{tmp}/t.pkt", "--max-bytes=1"],
    ["tree", "info"], ["tree", "info", "{tmp}/none.pkt"], ["tree", "info", "{tmp}"], ["tree", "info", "{base}/fourbar.toml"],
    ["tree", "verify", "{base}/fourbar.pkt", "--samples=0"], ["tree", "verify", "{base}/fourbar.pkt", "--model=fivebar"],
    ["tree", "verify", "{base}/fourbar.pkt", "--max-error=-1"], ["tree", "verify", "{base}/fourbar.pkt", "--region=9,10"],
    ["tree", "plot", "{base}/fourbar.pkt", "-o", "{tmp}/p.png", "--points=1"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--inject="], ["run", "--machine", "{base}/fourbar-sim.toml", "--inject=x"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--inject=nan@nan"], ["run", "--machine", "{base}/fourbar-sim.toml", "--inject=push@1e400"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--inject=push@1=x"], ["run", "--machine", "{base}/fourbar-sim.toml", "--inject=boom@1"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--inject=@"], ["run", "--machine", "{base}/fourbar-sim.toml", f"--inject=stale@{BIG}"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--rate=0"], ["run", "--machine", "{base}/fourbar-sim.toml", "--rate=1e400"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--rate=1e9"], ["run", "--machine", "{base}/fourbar-sim.toml", "--rate=nan"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--duration=-1"], ["run", "--machine", "{base}/fourbar-sim.toml", "--duration=inf"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--duration=1e400"], ["run", "--machine", "{base}/fourbar-sim.toml", "--duration="],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--mass-scale=0"], ["run", "--machine", "{base}/fourbar-sim.toml", "--mass-scale=nan"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--controller=xx"], ["run", "--machine", "{base}/fourbar-sim.toml", "--model=yy"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--telemetry=nohostport"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--telemetry=host:99999999"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--telemetry="], ["run", "--machine", "{base}/fourbar-sim.toml", "--telemetry-rate=0"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--foxglove="], ["run", "--machine", "{base}/fourbar-sim.toml", "--foxglove=abc"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--traj="], ["run", "--machine", "{base}/fourbar-sim.toml", "--topic=/x"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--port=/dev/null"], ["run", "--machine", "{base}/fourbar-sim.toml", "--interface=virtual"],
    ["run", "--machine", ""], ["run", "--machine", "nosuchmachine"], ["run", "--machine", "{base}/fourbar.toml"],
    ["run", "--machine", "{base}/fourbar.pkt"], ["run", "--machine", "{tmp}"],
    ["hil"], ["hil", "--bus", "usb"], ["hil", "--bus", "can", "--machine", "{base}/fourbar-sim.toml"],
    ["hil", "--bus", "can", "--duration=0"], ["hil", "--bus", "serial", "--rate=-5"], ["hil", "--bus", "can", "--fault=meteor"],
    ["replay", "{base}/run.pktlog", "--window=-1"], ["replay", "{base}/run.pktlog", "--mass-scale=nan"],
    ["replay", "{base}/run.pktlog", "--mass-scale=0"], ["replay", "{base}/run.pktlog", "--mass-scale=-1"],
    ["replay", "{base}/run.pktlog", "--lockstep", "--offline"], ["replay", "{base}/run.pktlog", "--tree={base}/fivebar.pkt"],
    ["replay", "{base}/run.pktlog", "--machine={base}/fourbar.toml"],
    ["log", "info"], ["log", "info", "{tmp}/none.pktlog"], ["log", "export", "{base}/run.pktlog"],
    ["log", "export", "{base}/run.pktlog", "--csv="], ["log", "plot", "{base}/run.pktlog"], ["log", "plot", "{base}/run.pktlog", "-o", ""],
    ["bench", "--only=nothing"], ["bench", "--only="],
]


@pytest.mark.parametrize("argv", OPTIONS, ids=[" ".join(a) or "nothing" for a in OPTIONS])
def test_bad_options(argv, base, tmp_path, capsys):
    run_cli([a.format(base=base, tmp=tmp_path) for a in argv], capsys)


# -- output paths --------------------------------------------------------------------------------------

OUTPUTS = [
    ["run", "--machine", "{base}/fourbar-sim.toml", "--lockstep", "--duration=0.01", "--no-rt", "--log", "{tmp}/no/dir/r.pktlog"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--lockstep", "--duration=0.01", "--no-rt", "--log", "{tmp}"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--lockstep", "--duration=0.01", "--no-rt", "--log", "{base}/fourbar.pkt"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--lockstep", "--duration=0.01", "--no-rt", "--log", "{base}/fourbar-sim.toml"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--lockstep", "--duration=0.01", "--no-rt", "--log", "{tmp}/r.pktlog",
     "--plot", "{tmp}/r.pktlog"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--lockstep", "--duration=0.01", "--no-rt", "--log", "{tmp}/r.pktlog",
     "--plot", "{tmp}"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--lockstep", "--duration=0.01", "--no-rt", "--log", "{tmp}/r.pktlog",
     "--plot", "{tmp}/none/p.png"],
    ["run", "--machine", "{base}/fourbar-sim.toml", "--lockstep", "--duration=0.01", "--no-rt", "--traj", "{base}/traj.csv",
     "--log", "{base}/traj.csv"],
    ["build", "fourbar", "-o", "{tmp}/no/dir/t.pkt", "--boxes=1"], ["build", "fourbar", "-o", "{tmp}", "--boxes=1"],
    ["build", "{base}/fourbar.toml", "-o", "{base}/fourbar.toml", "--boxes=1"],
    ["tree", "plot", "{base}/fourbar.pkt", "-o", "{tmp}/none/p.png"], ["tree", "plot", "{base}/fourbar.pkt", "-o", "{tmp}"],
    ["tree", "plot", "{base}/fourbar.pkt", "-o", "{base}/fourbar.pkt"],
    ["log", "export", "{base}/run.pktlog", "--csv", "{tmp}/none/o.csv"], ["log", "export", "{base}/run.pktlog", "--csv", "{tmp}"],
    ["log", "export", "{base}/run.pktlog", "--csv", "{base}/run.pktlog"],
    ["log", "export", "{base}/run.pktlog", "--mcap", "{tmp}/none/o.mcap"], ["log", "export", "{base}/run.pktlog", "--ros2", "{base}/run.pktlog"],
    ["log", "export", "{base}/run.pktlog", "--traj", "{tmp}"], ["log", "export", "{base}/run.pktlog", "--csv", "/dev/full"],
    ["log", "plot", "{base}/run.pktlog", "-o", "{tmp}/none/p.png"], ["log", "plot", "{base}/run.pktlog", "-o", "{base}/run.pktlog"],
    ["replay", "{base}/run.pktlog", "--log", "{base}/run.pktlog"], ["replay", "{base}/run.pktlog", "--log", "{tmp}/none/r.pktlog"],
]


@pytest.mark.parametrize("argv", OUTPUTS, ids=[" ".join(a[:2]) + f"-{i}" for i, a in enumerate(OUTPUTS)])
def test_bad_output_path(argv, base, tmp_path, capsys):
    run_cli([a.format(base=base, tmp=tmp_path) for a in argv], capsys)


# -- the console script itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["model", "check", "{tmp}/m.toml"], ["run", "--machine", "{base}/fourbar-sim.toml", "--inject="],
    ["tree", "info", "{tmp}/m.toml"], ["log", "info", "{base}/fourbar.pkt"], ["frobnicate"]])
def test_console_script(argv, base, tmp_path):
    (tmp_path / "m.toml").write_text(toml_dumps(_mutated(MODEL, ("set", "bodies", 0, "mass", BIG))))
    argv = [a.format(base=base, tmp=tmp_path) for a in argv]
    r = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", *argv], capture_output=True, text=True, timeout=300)
    check_one_line(r.returncode, r.stderr, argv)


# -- values that escaped before (issue 34): nested, huge, overlong -----------------------------------

LONG = "x" * 59_000  # a 59 kB value: the message shows an excerpt
DIGITS = "9" * 500


def _can_config(base: Path, tmp: Path, old: str, new: str) -> Path:
    """delta-can.toml with one line replaced, beside links to its model and trees."""
    for name in ("delta.toml", "delta.pkt", "delta-plant.pkt"):
        os.symlink(MACHINES / name, tmp / name)
    text = (MACHINES / "delta-can.toml").read_text()
    assert old in text
    p = tmp / "delta-can.toml"
    p.write_text(text.replace(old, new))
    return p


@pytest.mark.parametrize("value", ["[[1], [2], [3]]", "[[1, 2], 2, 3]", "[{a = 1}, 2, 3]", f"[{DIGITS}, 2, 3]",
                                   f'["{LONG}", 2, 3]', "[1, 2, 1e300]", "[]"])
def test_ids_that_are_not_integers(value, base, tmp_path, capsys):
    """A field of ids given nested lists, tables, huge or overlong values: one line (a nested
    list was a TypeError traceback: unhashable type)."""
    p = _can_config(base, tmp_path, "node_ids = [1, 2, 3]", f"node_ids = {value}")
    run_cli(["run", "--machine", p, *RUN], capsys)


def test_overlong_values_are_shown_as_excerpts(base, tmp_path, capsys):
    for doc in (_mutated(CONFIG, ("set", "drives", None, "backend", LONG)),
                _mutated(CONFIG, ("set", "machine", None, "name", [LONG])),
                _mutated(CONFIG, ("set", "limits", None, LONG, 1.0)),
                _mutated(CONFIG, ("top", LONG, None, None, {"a": 1})),
                _mutated(CONFIG, ("set", "limits", None, "velocity", int(DIGITS)))):
        sub = tmp_path / str(len(list(tmp_path.iterdir())))
        sub.mkdir()
        p = _write_config(base, sub, doc)
        run_cli(["run", "--machine", p, *RUN], capsys)
    for doc in (_mutated(MODEL, ("set", "bodies", 0, "name", LONG)), _mutated(MODEL, ("set", "bodies", 0, LONG, 1)),
                _mutated(MODEL, ("set", "bodies", 0, "mass", int(DIGITS)))):
        p = tmp_path / "m.toml"
        p.write_text(toml_dumps(doc))
        run_cli(["model", "check", p], capsys)


@pytest.mark.parametrize("text", [
    "[model]\nname = 'x'\ngravity = [0, 0, " + "9" * 5000 + "]\n",  # beyond Python's int conversion (ValueError)
    "[model]\nname = 'x'\ngravity = " + "[" * 2000 + "]" * 2000 + "\n",  # nested deeper than the parser recurses
])
def test_toml_the_parser_cannot_take(text, tmp_path, capsys):
    run_on_file(text.encode(), tmp_path / "m.toml", capsys, "model", "check")
    run_on_file(text.replace("[model]", "[machine]").encode(), tmp_path / "c.toml", capsys, "run", *RUN, "--machine")


@pytest.mark.parametrize("rows", [
    "t,theta\n0,0\n1," + "1" * 200_000 + "\n",  # a field beyond the csv module's limit (_csv.Error)
    "t,theta," + LONG + "\n0,0,0\n1,0,0\n",  # a 59 kB header
    "t,theta\n0,0\n1," + DIGITS + "x\n",  # a 500-digit non-number
    "t,theta\n0,0\n1,0\x00\n",
])
def test_csv_values_the_reader_refuses(rows, base, tmp_path, capsys):
    run_on_file(rows.encode(), tmp_path / "traj.csv", capsys, "run", *RUN[2:], "--machine", base / "fourbar-sim.toml",
                "--traj")


@pytest.mark.parametrize("option", ["--theta-dot=1e200", "--theta-dot=1e160", "--theta-ddot=1e308"])
def test_huge_but_finite_model_eval_values_name_their_option(option, capsys):
    """Velocities whose squares overflow: one line naming the option (numpy's RuntimeWarning
    on stderr and exit 0 before)."""
    capsys.readouterr()
    code = main(["model", "eval", "fourbar", "--theta=0", option, "--theta-dot=1e200"] if "ddot" in option
                else ["model", "eval", "fourbar", "--theta=0", option])
    err = capsys.readouterr().err
    check_one_line(code, err, option)
    assert "--theta-dot" in err and "too large" in err


@pytest.mark.parametrize("rate", [1e300, 1e-300, -5.0, math.nan, LONG, 10 ** 30, [1000.0]])
def test_log_with_an_impossible_rate(rate, tmp_path, capsys):
    """A log whose header's rate is huge, tiny, negative or not a number: one line naming the
    field (`pkrt log export` printed numpy's RuntimeWarning and exited 0 before)."""
    from pkrt.rt.runtime.record.logfile import LogWriter

    p = tmp_path / "r.pktlog"
    with LogWriter(str(p), {"rate_hz": rate, "axes": ["theta"]}, [("t", 1, "s"), ("pos", 1, "rad"),
                                                                  ("ref_pos", 1, "rad")]) as w:
        for k in range(10):
            w.row[:] = [k * 1e-3, 0.1 * k, 0.1 * k]
            w.commit()
    for verb in (["log", "export", p, "--csv", tmp_path / "o.csv"], ["log", "info", p]):
        capsys.readouterr()
        code = main([str(a) for a in verb])
        err = capsys.readouterr().err
        check_one_line(code, err, verb)
        assert "rate_hz" in err


@pytest.mark.parametrize("argv", [
    ["plan", "--adept", "--machine", "delta", "-o", "{tmp}/a.csv", "--grid=100000000000000000000"],
    ["plan", "--adept", "--machine", "delta", "-o", "{tmp}/a.csv", "--cycles=1000000000000"],
    ["plan", "--adept", "--machine", "delta", "-o", "{tmp}/a.csv", f"--cycles={DIGITS}"],
    ["plan", "--adept", "--machine", "delta", "-o", "{tmp}/a.csv", f"--grid={'9' * 5000}"],
    ["model", "eval", "fourbar", f"--theta={LONG}"],
    ["identify", "plan", "delta", "-o", "{tmp}/e.csv", "--harmonics=100000000"],
])
def test_huge_option_values(argv, tmp_path, capsys):
    run_cli([a.format(tmp=tmp_path) for a in argv], capsys)
