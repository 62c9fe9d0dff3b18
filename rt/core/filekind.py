"""What a file is, from its content (never its name): pkrt tree, pkrt log, machine
description, machine configuration, CSV, other text, other binary.

``sniff(path)`` reads the first ``HEAD`` bytes. msgpack: the first record is a map whose
``format`` field names the kind (``pkrt-tree`` for trees, ``pkrt-log`` for run logs; both
files start with such a map). TOML: told apart by their tables: a machine configuration has
``[machine]``, a machine description ``[model]``, ``[[bodies]]``, ``[[joints]]`` or
``[[actuators]]``. ``expect(path, kind)`` raises ``WrongFileKind`` (one line, exit 2) when a
file is recognisably something else; a file that only looks damaged is left to the loader of
the expected kind, whose message says what is wrong with it.
"""

from __future__ import annotations

import re

import msgpack

from pkrt.rt.core.errors import UserError

HEAD = 64 * 1024  # bytes read to tell a file's kind

TREE, LOG = "tree", "log"
MODEL, MACHINE = "model", "machine"
TOML, CSV, TEXT = "toml", "csv", "text"
MSGPACK, BINARY, EMPTY, MISSING, FOLDER = "msgpack", "binary", "empty", "missing", "folder"

DESCRIPTION = {
    TREE: "a pkrt tree file",
    LOG: "a pkrt run log",
    MODEL: "a machine description (TOML with [model])",
    MACHINE: "a machine configuration (TOML with [machine])",
    TOML: "a TOML file that is neither a machine description nor a machine configuration",
    CSV: "a CSV file",
    TEXT: "a text file",
    MSGPACK: "a msgpack file of no pkrt format",
    BINARY: "a binary file of no pkrt format",
    EMPTY: "an empty file",
    MISSING: "no such file",
    FOLDER: "a folder",
    "png": "a PNG image", "zip": "a zip archive", "gzip": "a gzip file", "pdf": "a PDF document",
    "elf": "an executable",
}

_MSGPACK_FORMATS = {"pkrt-tree": TREE, "pkrt-log": LOG}
_MAGIC = {b"\x89PNG\r\n\x1a\n": "png", b"PK\x03\x04": "zip", b"\x1f\x8b": "gzip",
          b"%PDF": "pdf", b"\x7fELF": "elf"}
_TABLE = re.compile(rb"^[ \t]*\[\[?[ \t]*([A-Za-z0-9_.\"-]+)[ \t]*\]\]?", re.MULTILINE)
_MODEL_TABLES = {b"model", b"bodies", b"joints", b"actuators"}


class WrongFileKind(UserError):
    """A file of another kind than the one expected (exit 2)."""


def _msgpack_format(head: bytes) -> str | None:
    """The ``format`` field of the map msgpack ``head`` starts with, or None."""
    unp = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(head) + 1)
    unp.feed(head)
    try:
        n = unp.read_map_header()
        for _ in range(min(n, 64)):
            key = unp.unpack()
            if key == "format":
                value = unp.unpack()
                return value if isinstance(value, str) else None
            unp.skip()
    except Exception:  # noqa: BLE001 - cut off in the head or not msgpack: no format found
        return None
    return None


def _is_msgpack_map(b: int) -> bool:
    return 0x80 <= b <= 0x8F or b in (0xDE, 0xDF)


def kind_of_bytes(head: bytes) -> str:
    """The kind of a file from its first bytes (see the module docstring)."""
    if not head:
        return EMPTY
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    if _is_msgpack_map(head[0]):
        fmt = _msgpack_format(head)
        if fmt in _MSGPACK_FORMATS:
            return _MSGPACK_FORMATS[fmt]
    text = _text_of(head)
    if text is None:
        return MSGPACK if _is_msgpack_map(head[0]) else BINARY
    return _kind_of_text(text)


def _text_of(head: bytes) -> str | None:
    """``head`` as UTF-8 text, a last character cut off by ``HEAD`` left out; None for
    binary content (a NUL byte, or bytes that are not UTF-8)."""
    if b"\x00" in head:
        return None
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as e:
        if len(head) < HEAD or e.start < len(head) - 4:  # not a character cut off by HEAD
            return None
        return head[:e.start].decode("utf-8")


def _kind_of_text(text: str) -> str:
    """Machine configuration, machine description, CSV, other TOML or other text."""
    tables = set(_TABLE.findall(text.encode()))
    if b"machine" in tables:
        return MACHINE
    if tables & _MODEL_TABLES:
        return MODEL
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if lines and "," in lines[0] and "=" not in lines[0] and not tables:
        return CSV
    if tables or any(re.match(r"^[ \t]*[A-Za-z0-9_\"-]+[ \t]*=", ln) for ln in lines):
        return TOML
    return TEXT


def sniff(path) -> str:
    """The kind of the file at ``path`` (``MISSING`` or ``FOLDER`` when it is not a file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
    except FileNotFoundError:
        return MISSING
    except IsADirectoryError:
        return FOLDER
    return kind_of_bytes(head)


def describe(kind: str) -> str:
    return DESCRIPTION.get(kind, kind)


# kinds that may be a damaged file of the expected kind: its own loader says what is wrong
_MAYBE = {TREE: {MSGPACK, BINARY}, LOG: {MSGPACK, BINARY}, MODEL: {TOML, TEXT},
          MACHINE: {TOML, TEXT}, CSV: {TEXT}}


def expect(path, kind: str, error: type[UserError] | None = None) -> None:
    """Raise ``error`` (default WrongFileKind) if the file at ``path`` is recognisably not of
    ``kind``. Missing files, folders and unreadable files are left to the caller's loader."""
    try:
        have = sniff(path)
    except OSError:
        return
    if have == kind or have in (MISSING, FOLDER) or have in _MAYBE.get(kind, ()):
        return
    raise (error or WrongFileKind)(f"{path}: this is {describe(have)}, expected {describe(kind)}")


__all__ = ["sniff", "kind_of_bytes", "expect", "describe", "WrongFileKind", "TREE", "LOG",
           "MODEL", "MACHINE", "TOML", "CSV", "TEXT", "MSGPACK", "BINARY", "EMPTY", "MISSING",
           "FOLDER"]
