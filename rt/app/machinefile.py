"""A copy of a machine configuration on another model file (``pkrt identify``, ``pkrt
calibrate``): the paths it names made absolute, ``[machine] model`` the new model, ``tree`` the
model's path with ``.pkt`` (to build with ``pkrt build``), the name with a suffix."""

from __future__ import annotations

import tomllib
from pathlib import Path


def write_machine_copy(config, model_out: str, path: str, suffix: str, comment: str,
                       controller: dict | None = None) -> None:
    """Write the copy of ``config``'s file to ``path``; ``controller``: fields of
    ``[controller]`` to set."""
    from pkrt.models.identification.estimate import dump_toml

    src = Path(config.path)
    doc = absolute_paths(tomllib.loads(src.read_text(encoding="utf-8")), src.parent)
    doc["machine"]["model"] = str(Path(model_out).resolve())
    doc["machine"]["tree"] = str(Path(model_out).resolve().with_suffix(".pkt"))
    doc["machine"]["name"] = f"{doc['machine'].get('name', 'machine')}-{suffix}"
    if controller:
        doc.setdefault("controller", {}).update(controller)
    Path(path).write_text(dump_toml(doc, f"{src.name} on the {suffix} model {Path(model_out).name} ({comment}).\n"
                                         f"Build its tree first: pkrt build {model_out} -o {doc['machine']['tree']}"),
                          encoding="utf-8")


def absolute_paths(doc: dict, folder: Path) -> dict:
    """A machine configuration's document with its relative file paths (those naming a file in
    ``folder``, the configuration's) made absolute, for a copy written elsewhere; in place."""
    for table in doc.values():
        if isinstance(table, dict):
            for k, v in table.items():
                if isinstance(v, str) and not Path(v).is_absolute() and (folder / v).is_file():
                    table[k] = str((folder / v).resolve())
    return doc
