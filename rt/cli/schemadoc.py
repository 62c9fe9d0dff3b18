"""The configuration reference page (``docs/configuration.md``), generated from the schema.

``python -m pkrt.rt.cli.schemadoc > docs/configuration.md`` writes it; ``--check FILE`` exits 1
when FILE differs from what the schema gives (``tests/test_docs.py`` runs the same comparison).
Every table a machine file can hold, in file order, once per drive backend: its heading and
description from the table class's docstring, then one row per field (unit, default, the
expected value in the words of the error messages, meaning).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

from pkrt.drivers import BACKENDS
from pkrt.rt.core import schema
from pkrt.rt.runtime.machine.config import tables_of

PREAMBLE = """\
# Configuration reference

<!-- Generated from the schema by `python -m pkrt.rt.cli.schemadoc > docs/configuration.md`:
do not edit by hand (tests/test_docs.py fails when this page and the schema differ). -->

A machine configuration is a TOML file (`models/machines/orthoglide-sim.toml` is the demo's):
model, tree, rate, gains, limits, drives, real-time settings. It has the tables below;
`[drives]` and `[emulator]` depend on the drive backend (`backend = "sim"`, `"cia402"` or
`"dynamixel"`; `[emulator]` only for the HIL buses). One schema per table (dataclasses with one
validator; the field docs are this reference) is read by every reader (runtime, drivers,
emulators, HIL); `--port`, `--interface`, ... pass through the same schema. An unknown table or
field, a missing required field or a bad value is one line naming the file, the table and the
field, exit 2:

```text
pkrt: error: m.toml: [controller], field 'viscous': expected a number >= 0 (or a list of 3), got 'abc'
```

Every number (of a configuration and of a machine description) is at most 1e12 in magnitude:
far above any quantity of a machine in SI units, and far enough below the float range that the
computations on it cannot overflow. A value is shown in a message as an excerpt of at most 80
characters (a 59 kB string or a 500-digit integer is cut, its size said). The file is read as
TOML in one place (`pkrt.rt.core.inputs.read_toml`): a file that is not UTF-8, not TOML, holds
an integer of more than 4300 digits or nests too deep is one line too.

Per-axis fields take one number for every axis or a list of s (the number of actuators).
Default "derived": computed from other fields when missing; "optional": may be left out.
"""


def _inline(text: str) -> str:
    """reStructuredText inline literals (````x````) as Markdown code (```x```)."""
    return text.replace("``", "`")


def heading_and_text(cls: type) -> tuple[str, str]:
    """A table class's docstring as (heading, description): its first paragraph, split at the
    first ``": "`` after the table's name (``[drives]`` with ``backend = "sim"``: ...)."""
    first = re.split(r"\n\s*\n", cls.__doc__.strip())[0]
    text = " ".join(line.strip() for line in first.splitlines())
    head, _, rest = text.partition(": ")
    return _inline(head), _inline(rest[:1].upper() + rest[1:])


def default_text(f: dataclasses.Field) -> str:
    """The default column: required, optional, derived or the value as TOML would write it."""
    if f.metadata["derive"] is not None:
        return "derived"
    d = schema.default_of(f)
    if d is schema.REQUIRED:
        return "required"
    if d is None:
        return "optional"
    if isinstance(d, bool):
        return str(d).lower()
    return repr(d).replace("'", '"')


def table_markdown(cls: type) -> str:
    """One table's section: heading, description and the field table."""
    head, text = heading_and_text(cls)
    lines = [f"## {head}", "", text, "", "| field | unit | default | expected | meaning |", "|---|---|---|---|---|"]
    for f in schema.fields(cls):
        m = f.metadata
        lines.append(f"| `{f.name}` | {m['unit']} | {default_text(f)} | {schema.describe_constraint(m)} | "
                     f"{m['doc']} |")
    return "\n".join(lines) + "\n"


def page() -> str:
    """The whole page: the preamble, then every table class once, in file order per backend."""
    seen: list[type] = []
    for backend in BACKENDS:
        seen += [cls for _, cls in tables_of(backend) if cls not in seen]
    return PREAMBLE + "".join("\n" + table_markdown(cls) for cls in seen)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pkrt.rt.cli.schemadoc", description=__doc__.splitlines()[0])
    p.add_argument("--check", metavar="FILE", help="exit 1 if FILE is not the generated page")
    args = p.parse_args(argv)
    text = page()
    if args.check is None:
        sys.stdout.write(text)
        return 0
    try:
        same = Path(args.check).read_text(encoding="utf-8") == text
    except OSError as e:
        print(f"schemadoc: error: {args.check}: {e.strerror}", file=sys.stderr)
        return 2
    if not same:
        print(f"schemadoc: {args.check} differs from the schema; regenerate it with "
              f"python -m pkrt.rt.cli.schemadoc > {args.check}", file=sys.stderr)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
