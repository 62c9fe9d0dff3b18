"""Machine configuration files (TOML): model, tree, rate, controller gains, limits, drives.

Paths inside a configuration are relative to the configuration file. A machine argument is a
path or a built-in name (``orthoglide`` means ``models/machines/orthoglide-sim.toml``).
Every table is validated by its schema (``pkrt.rt.core.schema``, which documents every field);
readers use the typed tables, ``raw`` is kept only for the log header.
Units: SI at the actuators (m or rad, N or N m), Hz, s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any
from pathlib import Path

import numpy as np

from pkrt.drivers import BACKENDS, drive_tables
from pkrt.rt.core import schema
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.filekind import MACHINE, expect
from pkrt.rt.core.inputs import excerpt, read_toml
from pkrt.rt.core.schema import ConfigError, ControllerConfig, Limits, RealtimeConfig  # noqa: F401 (re-exported)

MACHINES_DIR = Path(__file__).resolve().parents[3] / "models" / "machines"


@dataclass(frozen=True)
class MachineConfig:
    path: str
    name: str
    model: str  # model file path or built-in name
    tree: str  # controller tree file path
    rate_hz: float
    controller: ControllerConfig
    limits: Limits
    drives: Any  # the [drives] table of its backend (its driver's DRIVES_TABLE, pkrt.drivers)
    realtime: RealtimeConfig
    raw: dict = field(repr=False, default_factory=dict)  # the file as read: for the log header only
    emulator: Any = None  # the [emulator] table of a HIL bus (its driver's EMULATOR_TABLE), else None
    demo: schema.DemoTable = field(default_factory=schema.DemoTable)
    gcode: schema.GcodeTable | None = None  # [gcode]: tool table, work offsets (always set by load_machine)
    tracker: schema.TrackerTable = field(default_factory=schema.TrackerTable)
    protect: schema.ProtectTable = field(default_factory=schema.ProtectTable)

    @property
    def backend(self) -> str:
        return self.drives.backend

    def context(self, table: str) -> schema.Context:
        return schema.Context(path=self.path, table=table, s=self.limits.position.shape[0], rate_hz=self.rate_hz,
                              ranges=self.limits.position,
                              tables={"limits": self.limits, "drives": self.drives})

    def with_drives(self, overrides: dict | None = None) -> "MachineConfig":
        """This configuration with ``overrides`` (e.g. ``{"port": ...}``, the CLI's
        ``--interface``) replacing fields of ``[drives]``, validated again at this rate."""
        known = {f.name for f in schema.fields(type(self.drives))}
        for k in overrides or {}:
            if k not in known:  # a setting of another backend (e.g. --port for CAN drives)
                raise UserError(f"{self.path}: '{k}' is not a setting of a '{self.backend}' machine's drives "
                                f"(its [drives] fields: {', '.join(sorted(known))})")
        table = {**self.raw.get("drives", {}), **(overrides or {})}
        drives = schema.validate(type(self.drives), table, self.context("drives"))
        return replace(self, drives=drives)

    def plant_table(self) -> schema.PlantTable:
        """The simulated plant's table: ``[drives]`` of ``sim``, else the HIL ``[emulator]``."""
        if isinstance(self.drives, schema.PlantTable):
            return self.drives
        if isinstance(self.emulator, schema.PlantTable):
            return self.emulator
        raise ConfigError.at(self.path, "emulator", "plant_tree", "missing (no simulated plant in this configuration)")

    @property
    def directory(self) -> Path:
        return Path(self.path).parent

    @property
    def plant_model_path(self) -> str:
        """The simulated plant's model file: ``plant_model`` of the plant's table, else the
        machine's model."""
        pm = getattr(self.plant_table(), "plant_model", None)
        return model_file(pm, self.directory) if pm else self.model_path

    @property
    def model_path(self) -> str:
        """The model file (a built-in name, one word without a suffix, maps to
        models/machines/NAME.toml)."""
        return model_file(self.model, ".")

    def resolve(self, p: str) -> str:
        """A path from the configuration, relative to the configuration file."""
        q = Path(p)
        return str(q if q.is_absolute() else self.directory / q)


def model_file(model: str, directory) -> str:
    """The model file a configuration's ``[machine] model`` names: a path (with a folder or a
    suffix) relative to the configuration's ``directory`` unless absolute, or a built-in name
    (one word without a suffix) -> models/machines/NAME.toml."""
    p = Path(model)
    if "/" not in model and not p.suffix:
        return str(MACHINES_DIR / f"{model}.toml")
    return str(p if p.is_absolute() else Path(directory) / p)


def resolve_machine_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.exists():
        return p
    for cand in (MACHINES_DIR / f"{name_or_path}-sim.toml", MACHINES_DIR / f"{name_or_path}.toml"):
        if cand.exists() and "[machine]" in cand.read_text(errors="replace"):
            return cand
    raise UserError(f"{name_or_path}: no such machine configuration file or built-in machine")


def load_machine(name_or_path: str, n_axes: int | None = None, ranges: np.ndarray | None = None) -> MachineConfig:
    """Read a machine configuration. ``n_axes`` and ``ranges`` (from the model) size the
    per-axis values and default the position limits; without them they come from the
    machine's tree (its header records the actuators' ranges), so the runtime never loads
    the model."""
    path = resolve_machine_path(name_or_path)
    expect(path, MACHINE)  # another kind of file: say what it is
    doc = read_toml(path)
    if not isinstance(doc.get("machine"), dict):
        raise UserError(f"{path}: [machine] table missing")
    drives_doc = doc.get("drives")
    if not isinstance(drives_doc, dict):
        raise ConfigError.at(str(path), "drives", None, "table missing")
    backend = drives_doc.get("backend")
    if not isinstance(backend, str) or backend not in BACKENDS:
        what = "missing" if backend is None else f"unknown backend {excerpt(backend)}"
        raise ConfigError.at(str(path), "drives", "backend", f"{what} (known: {', '.join(BACKENDS)})")
    tables = dict(tables_of(backend))
    for name in doc:
        if name not in tables:
            raise ConfigError.at(str(path), name, None, f"unknown table for a '{backend}' machine (known: "
                                                     f"{', '.join(tables)})")

    def ctx(table: str, **kw) -> schema.Context:
        return schema.Context(path=str(path), table=table, s=s, **kw)

    s = 0
    m = schema.validate(schema.MachineTable, doc["machine"], ctx("machine"))
    model = model_file(m.model, path.parent)  # a file (any extension), relative to this one, or a built-in name
    if n_axes is None or ranges is None:  # the runtime's view of the model: its tree's header
        from pkrt.rt.core.treefile import load_tree
        tree_path = path.parent / m.tree
        try:
            header = load_tree(tree_path).header
        except OSError as e:
            raise ConfigError.at(str(path), "machine", "tree", f"cannot read {tree_path}: {e.strerror}") from None
        ranges = np.array(header["actuators"]["ranges"], float)
        n_axes = len(ranges)
    s = n_axes
    rate = m.rate_hz
    got = {"machine": m}
    for name in ("controller", "limits", "realtime", "demo", "gcode", "tracker", "protect", "drives", "emulator"):
        if name in tables:
            got[name] = schema.validate(tables[name], doc.get(name), ctx(name, rate_hz=rate, ranges=ranges,
                                                                         tables=dict(got)))
    return MachineConfig(str(path), m.name, model, str(path.parent / m.tree), rate, got["controller"], got["limits"],
                         got["drives"], got["realtime"], doc, got.get("emulator"), got["demo"], got["gcode"],
                         got["tracker"], got["protect"])


def tables_of(backend: str) -> list[tuple[str, type]]:
    """The tables of a machine with this drive backend, in file order: (name, class)."""
    drives, emulator = drive_tables(backend)
    out = list(schema.COMMON_TABLES) + [("drives", drives)]
    if emulator is not None:
        out.append(("emulator", emulator))
    return out
