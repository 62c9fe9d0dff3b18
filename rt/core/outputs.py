"""Output files of the CLI verbs: checked before anything runs (a file in an existing, writable
folder, never an input of the same command, never another output of it) and written through a
temporary file beside them, renamed once complete, so a failed write leaves no half file and
never destroys what was there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pkrt.rt.core.errors import OutputError, UserError


def same_file(a, b) -> bool:
    """True when two paths name one file: the same inode if both exist, else the same
    resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_output(path, what: str, inputs: dict[str, object] | None = None) -> None:
    """Refuse (UserError, one line) an output path that cannot be written or that names one of
    ``inputs`` (label -> path, None ignored)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{what} {path}: is a directory; give a file name")
    parent = p.parent
    if not parent.exists():
        raise UserError(f"{what} {path}: the folder {parent} does not exist")
    if not parent.is_dir():
        raise UserError(f"{what} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):  # also a read-only file system, even for root
        raise UserError(f"{what} {path}: the folder {parent} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{what} {path}: the file is not writable")
    for label, inp in (inputs or {}).items():
        if inp is not None and same_file(p, inp):
            raise UserError(f"{what} {path} is the {label} of this command; writing it would destroy "
                            f"that input: give another file")


def check_outputs(outputs: dict[str, object], inputs: dict[str, object] | None = None) -> None:
    """``check_output`` for each output (label -> path, None ignored), and no two the same."""
    given = [(k, v) for k, v in outputs.items() if v is not None]
    for i, (what, path) in enumerate(given):
        check_output(path, what, inputs)
        for other, q in given[:i]:
            if same_file(path, q):
                raise UserError(f"{what} {path} is also the {other}; give two different files")


@contextmanager
def atomic_write(path, what: str, mode: str = "w", newline: str | None = None) -> Iterator:
    """Open ``path`` for writing through a temporary file beside it, renamed over ``path``
    when the block ends without error (an existing FIFO or device is written in place). A
    failure (disk full, ...) removes the temporary file and becomes one OutputError."""
    p = str(path)
    special = os.path.exists(p) and not os.path.isfile(p) and not os.path.isdir(p)
    tmp = p if special else f"{p}.{os.getpid()}.tmp"
    try:
        f = open(tmp, mode, newline=newline)
    except OSError as e:
        raise OutputError(f"{what} {p}: cannot write: {e.strerror or e}") from None
    try:
        with f:
            yield f
        if not special:
            os.replace(tmp, p)
    except OSError as e:
        _remove(tmp, special)
        raise OutputError(f"{what} {p}: not written: {e.strerror or e}") from None
    except BaseException:
        _remove(tmp, special)
        raise


def _remove(tmp: str, special: bool) -> None:
    if not special:
        try:
            os.unlink(tmp)
        except OSError:
            pass
