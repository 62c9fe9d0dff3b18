"""Every field of every machine-configuration table, enumerated from the schema itself
(pkrt.rt.core.schema), gets a wrong type, a NaN, a negative and a missing value: through
`pkrt run --lockstep --machine FILE` each bad one is one line naming the file, the table and
the field, exit 2, no traceback; the schema says per field where a negative or a missing value
is valid, and then the file loads (or fails on a relation naming another field)."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from pkrt.rt.core import schema
from pkrt.rt.runtime.machine.config import tables_of
from pkrt.rt.cli import main
from pkrt.rt.runtime.machine.config import load_machine

MACHINES = Path(__file__).resolve().parent.parent / "models" / "machines"
FILES = {"sim": "orthoglide-sim.toml", "cia402": "orthoglide-can.toml", "dynamixel": "orthoglide-serial.toml"}
PATH_FIELDS = {("machine", "model"), ("machine", "tree"), ("drives", "plant_tree"), ("emulator", "plant_tree")}


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def dump(doc: dict) -> str:
    return "".join(f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items()) + "\n"
                   for name, table in doc.items())


def shipped(backend: str) -> dict:
    """A shipped machine file with its paths made absolute (written elsewhere, it still works)."""
    doc = tomllib.loads((MACHINES / FILES[backend]).read_text())
    doc["machine"]["model"] = str(MACHINES / f"{doc['machine']['model']}.toml")
    for table, key in PATH_FIELDS - {("machine", "model")}:
        if key in doc.get(table, {}):
            doc[table][key] = str(MACHINES / doc[table][key])
    return doc


def cases():
    """(backend, table, field name, field metadata, has default): the common tables on the sim
    machine, [drives] and [emulator] on the machine of each backend."""
    seen = set()
    for backend in FILES:
        for table, cls in tables_of(backend):
            for f in schema.fields(cls):
                key = (cls, f.name)
                if key in seen:
                    continue
                seen.add(key)
                yield pytest.param(backend, table, f.name, dict(f.metadata),
                                   schema.default_of(f) is not schema.REQUIRED, id=f"{backend}-{table}-{f.name}")


def wrong_type(meta: dict):
    return {schema.STRING: 12, schema.CHANNEL: [1.5]}.get(meta["kind"], "abc")


def negative_is_valid(meta: dict) -> bool:
    """From the schema: a numeric field whose bounds admit -1 (a signed offset, cpu = -1 ...)."""
    return (meta["kind"] in (schema.NUMBER, schema.INTEGER, schema.AXES) and not meta["choices"]
            and (meta["lo"] is None or meta["lo"] <= -1) and (meta["hi"] is None or meta["hi"] >= -1))


def run_cli(tmp_path, capsys, doc: dict) -> tuple[int, str]:
    f = tmp_path / "m.toml"
    f.write_text(dump(doc))
    code = main(["run", "--machine", str(f), "--lockstep", "--no-log", "--duration", "0.1"])
    return code, capsys.readouterr().err


def test_every_table_and_field_is_enumerated():
    """The cases come from the schema: every table of every backend, no field left out."""
    names = {p.id for p in cases()}
    for backend in FILES:
        for table, cls in tables_of(backend):
            for f in schema.fields(cls):
                assert any(i.endswith(f"-{table}-{f.name}") for i in names), (table, f.name)
    assert len(names) > 90


@pytest.mark.parametrize("backend,table,name,meta,has_default", list(cases()))
@pytest.mark.parametrize("bad", ["wrong type", "nan", "negative", "missing"])
def test_bad_value_of_every_field(tmp_path, capsys, backend, table, name, meta, has_default, bad):
    doc = shipped(backend)
    doc.setdefault(table, {})
    if bad == "missing":
        doc[table].pop(name, None)
        valid = has_default
    else:
        doc[table][name] = {"wrong type": wrong_type(meta), "nan": math.nan, "negative": -1}[bad]
        valid = bad == "negative" and negative_is_valid(meta)
    if table == "drives" and name == "backend":
        valid = False  # the backend chooses the table's schema: never defaulted
    if valid:  # the schema accepts it: the file loads, or a relation names another field
        f = tmp_path / "m.toml"
        f.write_text(dump(doc))
        try:
            load_machine(str(f))
        except schema.ConfigError as e:
            assert e.field != name or e.table != table, str(e)
        return
    code, err = run_cli(tmp_path, capsys, doc)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"pkrt: error: {tmp_path / 'm.toml'}: [{table}], field '{name}': "), err


def test_viscous_text_is_one_line(tmp_path, capsys):
    """The bug of issue 13: `[controller] viscous = "abc"` printed a 20-line traceback (exit 1)."""
    doc = shipped("sim")
    doc["controller"]["viscous"] = "abc"
    code, err = run_cli(tmp_path, capsys, doc)
    assert code == 2
    assert err == (f"pkrt: error: {tmp_path / 'm.toml'}: [controller], field 'viscous': expected a number >= 0 "
                   f"(or a list of 3), got 'abc'\n")


def test_unknown_field_and_table_are_named(tmp_path, capsys):
    doc = shipped("sim")
    doc["limits"]["velocty"] = 1.0
    code, err = run_cli(tmp_path, capsys, doc)
    assert code == 2 and "[limits], field 'velocty': unknown field" in err and len(err.strip().splitlines()) == 1
    doc = shipped("sim")
    doc["emulator"] = {"inject_after": 0.5}
    code, err = run_cli(tmp_path, capsys, doc)
    assert code == 2 and "[emulator]: unknown table for a 'sim' machine" in err


def test_cli_overrides_are_validated_by_the_schema(tmp_path):
    """`--port`, `--interface` ... go through the same schema as the file."""
    config = load_machine("orthoglide-can")
    with pytest.raises(schema.ConfigError, match=r"\[drives\], field 'bitrate': expected an integer in"):
        config.with_drives({"bitrate": "fast"})
    assert config.with_drives({"channel": "hil0"}).drives.channel == "hil0"


def test_no_reads_around_the_schema():
    """Readers use the typed tables: ``raw`` (the file as read) only goes into the log header."""
    root = Path(__file__).resolve().parent.parent
    uses = []
    for folder in ("rt", "drivers", "hil", "models"):
        for f in sorted((root / folder).rglob("*.py")):
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if ".raw" in line and ("config.raw" in line or "self.raw" in line):
                    uses.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    allowed = [u for u in uses if u.startswith("rt/runtime/machine/config.py:") or '"machine": config.raw' in u]
    assert uses == allowed, "\n".join(set(uses) - set(allowed))
    assert any('"machine": config.raw' in u for u in uses)  # the log header keeps the file as read
