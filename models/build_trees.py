"""Rebuild the trees shipped in ``models/machines/`` (bit for bit: builds are deterministic).

Run: ``.venv/bin/python -m pkrt.models.build_trees [NAME ...] [--jobs N]``. The equivalent
commands are printed with ``--list``, e.g. ``pkrt build fourbar -o models/machines/fourbar.pkt
--boxes 16``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pkrt.rt.treefile import save_tree

from .mechanism import load_mechanism
from .treebuild import BuildSettings, build_tree

MACHINES = Path(__file__).resolve().parent / "machines"

# file name -> (model, build settings); the settings are those the CLI would use
SHIPPED: dict[str, tuple[str, dict]] = {
    "fourbar.pkt": ("fourbar", {"boxes": 16}),  # the paper's 16 boxes on [-1.75, 1.75]
    "fivebar.pkt": ("fivebar", {"boxes": 8}),
    "orthoglide.pkt": ("orthoglide", {"boxes": 8}),  # the controller's default (paper: 8^3)
    # the simulated plant's physics: adaptive, held-out error 1e-3 (about 3500 leaves, 8 MB)
    "orthoglide-plant.pkt": ("orthoglide", {"tol": 1e-3, "max_leaves": 4096}),
}


def settings_for(name: str) -> tuple[str, BuildSettings]:
    model, kw = SHIPPED[name]
    return model, BuildSettings(**kw)


def command_for(name: str) -> str:
    model, kw = SHIPPED[name]
    opts = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in kw.items())
    return f"pkrt build {model} -o models/machines/{name} {opts}"


def rebuild(name: str, jobs: int | None = None, out_dir: Path = MACHINES) -> Path:
    model, settings = settings_for(name)
    tree, _ = build_tree(load_mechanism(model), settings, jobs=jobs)
    path = out_dir / name
    save_tree(tree, path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("names", nargs="*", help=f"trees to rebuild (default: all of {list(SHIPPED)})")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--list", action="store_true", help="print the equivalent pkrt commands")
    a = p.parse_args(argv)
    names = a.names or list(SHIPPED)
    for n in names:
        if n not in SHIPPED:
            p.error(f"unknown tree {n!r}; shipped: {', '.join(SHIPPED)}")
    for n in names:
        if a.list:
            print(command_for(n))
            continue
        t = time.perf_counter()
        path = rebuild(n, a.jobs)
        print(f"{path}: {path.stat().st_size} bytes in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
