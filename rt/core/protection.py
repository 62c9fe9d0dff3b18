"""The fields of a machine description that protect the machine without changing its dynamics:
passive-joint limits (``cone``, ``cone_axis``, ``range`` of ``[[joints]]``) and capsules around
bodies (``radius``, ``segment`` of ``[[bodies]]``). The model's loader validates them; the
model's content hash (``dynamics_hash``, which trees and logs record and the runtime checks)
leaves their lines out, so a tree stays valid when they are added or changed;
``declares_protection`` tells from the TOML alone whether a description has any, so that a
run of actuator values on a machine without them loads no model."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

from pkrt.rt.core.errors import UserError

FIELDS = {"bodies": ("radius", "segment"), "joints": ("cone", "cone_axis", "range")}
_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*=")


def declares(doc: dict) -> bool:
    """A parsed description has at least one protection field."""
    return any(isinstance(t, dict) and any(k in t for k in keys)
               for table, keys in FIELDS.items() for t in (doc.get(table) if isinstance(doc.get(table), list) else []))


def declares_protection(path) -> bool:
    """The description file at ``path`` has a protection field (False for a file that cannot
    be read or parsed: its loader reports that when the model is loaded)."""
    try:
        return declares(tomllib.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def dynamics_hash(raw: bytes, path: str, doc: dict | None = None) -> str:
    """The model's content hash: sha256 of the description's bytes without its protection
    lines, or of all its bytes when it has none (or is not a TOML file: its loader says why).
    Each protection field must be ``name = value`` on one line of its own: the text left must
    parse to the description without them (checked, else ``UserError``). ``doc``: the parsed
    file, when the caller has it."""
    if doc is None:
        try:
            doc = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            return hashlib.sha256(raw).hexdigest()
    if not declares(doc):
        return hashlib.sha256(raw).hexdigest()
    kept, table = [], None
    for line in raw.decode("utf-8").splitlines(keepends=True):
        head, key = _HEADER.match(line), _KEY.match(line)
        if head:
            table = head.group(1)
        elif key and key.group(1) in FIELDS.get(table, ()):
            continue
        kept.append(line)
    text = "".join(kept)
    want = {k: ([{f: v for f, v in t.items() if f not in FIELDS[k]} if isinstance(t, dict) else t for t in v]
                if k in FIELDS and isinstance(v, list) else v) for k, v in doc.items()}
    try:
        same = tomllib.loads(text) == want
    except tomllib.TOMLDecodeError:
        same = False
    if not same:
        fields = ", ".join(sorted(f for keys in FIELDS.values() for f in keys))
        raise UserError(f"{path}: [[joints]], [[bodies]]: write each protection field ({fields}) as 'name = value' "
                        f"on one line of its own in its table (the model's content hash leaves those lines out)")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
