"""The programs an operator may run from the panel: the CSV and G-code files of one directory
(``pkrt panel --programs DIR``, not its subdirectories) and the machine's demo, chosen by name
(a page never names a path), and their text for the page (the G-code line being run is
highlighted there)."""

from __future__ import annotations

from pathlib import Path

from pkrt.rt.core.errors import UserError

SUFFIXES = (".csv", ".ngc", ".nc", ".gcode", ".tap")
MAX_LINES = 20000  # a longer program is shown up to here
MAX_BYTES = 4 << 20


def listing(folder: Path | None) -> list[str]:
    """``demo`` and the program files' names in ``folder``, sorted."""
    names = []
    if folder is not None:
        try:
            names = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file())
        except OSError:
            names = []
    return ["demo", *names]


def resolve(folder: Path | None, name) -> str:
    """The path the machine runs for a listed ``name`` ("demo" as is); anything else is refused."""
    if name == "demo":
        return "demo"
    if not isinstance(name, str) or folder is None or name not in listing(folder):
        raise UserError(f"no program {name!r} in the panel's programs directory")
    return str(folder / name)


def text_of(folder: Path | None, file: str | None) -> dict | None:
    """The lines of a program file inside ``folder`` (``{"file", "name", "lines", "truncated"}``);
    None for the demo, a file elsewhere or one that cannot be read."""
    if folder is None or not file or file == "demo":
        return None
    p = Path(file)
    try:
        if p.resolve().parent != folder.resolve() or p.suffix.lower() not in SUFFIXES:
            return None
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    lines = data[:MAX_BYTES].decode("utf-8", errors="replace").splitlines()
    return {"file": file, "name": p.name, "lines": lines[:MAX_LINES],
            "truncated": len(lines) > MAX_LINES or len(data) > MAX_BYTES}
