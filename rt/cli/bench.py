"""CLI verb ``pkrt bench``: parse and print; the sections are ``pkrt.rt.bench``."""

from __future__ import annotations

import argparse
import importlib

from pkrt.rt.bench import SECTIONS
from pkrt.rt.core.errors import UserError
from pkrt.rt.cli.printing import emit


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", help=f"comma-separated sections ({', '.join(SECTIONS)})")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    names = list(SECTIONS) if not args.only else [x.strip() for x in args.only.split(",") if x.strip()]
    for n in names:
        if n not in SECTIONS:
            raise UserError(f"--only: unknown section '{n}' ({', '.join(SECTIONS)})")
    out = {}
    for n in names:
        mod, fn = SECTIONS[n]
        out[n] = getattr(importlib.import_module(mod), fn)()
        if not args.json:
            print(f"[{n}]", flush=True)
            emit(out[n], False)
    if args.json:
        emit(out, True)
    return 0


VERBS = {"bench": (add_arguments, run)}
