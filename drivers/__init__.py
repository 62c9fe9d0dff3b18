"""Drive backends behind one interface (python-can style: one factory, many backends).

``open_drives(config)`` returns the backend that the machine configuration's ``[drives]``
table names: ``sim`` (simulated plant), ``cia402`` (CANopen CiA 402 over python-can) or
``dynamixel`` (Dynamixel Protocol 2.0 over pyserial). A drive family is its ``Drives`` class
(module ``<family>.py``), which names its configuration tables (``DRIVES_TABLE``: ``[drives]``;
``EMULATOR_TABLE``: ``[emulator]`` of its HIL bus, or None; in ``<family>_tables.py`` where the
family has several modules), and one line in ``BACKENDS``; it touches no loop code and no
schema outside its modules.
"""

from __future__ import annotations

import importlib

from .base import DriveConfigError, Drives

BACKENDS = {
    "sim": "pkrt.drivers.sim:SimDrives",
    "cia402": "pkrt.drivers.cia402:CiA402Drives",
    "dynamixel": "pkrt.drivers.dynamixel:DynamixelDrives",
}


def backend_class(name: str, path: str = "") -> type[Drives]:
    """The ``Drives`` class of a backend (its module imported here)."""
    if name not in BACKENDS:
        raise DriveConfigError(f"{path}: [drives], field 'backend': unknown backend {name!r} "
                               f"(known: {', '.join(BACKENDS)})")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def drive_tables(name: str, path: str = "") -> tuple[type, type | None]:
    """The family's ``[drives]`` table class and its ``[emulator]`` table class (or None)."""
    cls = backend_class(name, path)
    return cls.DRIVES_TABLE, cls.EMULATOR_TABLE


def open_drives(config, overrides: dict | None = None, plant_model=None) -> Drives:
    """Drives for a ``pkrt.rt.runtime.machine.config.MachineConfig``; ``overrides`` replace entries of its
    ``[drives]`` table (e.g. ``{"interface": "virtual", "channel": "hil0"}`` or a port);
    ``plant_model``: the simulated plant's exact model for ``plant = "exact"`` (a callable
    (theta, H, D, p) -> status, built from the model outside the drivers)."""
    kw = {} if plant_model is None else {"plant_model": plant_model}  # only the sim backend has a plant
    return backend_class(config.drives.backend, config.path).from_config(config, dict(overrides or {}), **kw)
