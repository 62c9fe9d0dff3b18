"""Drive backends behind one interface (python-can style: one factory, many backends).

``open_drives(config)`` returns the backend that the machine configuration's ``[drives]``
table names: ``sim`` (simulated plant), ``cia402`` (CANopen CiA 402 over python-can) or
``dynamixel`` (Dynamixel Protocol 2.0 over pyserial). Adding a drive family adds one line
here and touches no loop code.
"""

from __future__ import annotations

import importlib

from .base import DriveConfigError, Drives

BACKENDS = {
    "sim": "pkrt.drivers.sim:SimDrives",
    "cia402": "pkrt.drivers.cia402:CiA402Drives",
    "dynamixel": "pkrt.drivers.dynamixel:DynamixelDrives",
}


def open_drives(config, overrides: dict | None = None, plant_model=None) -> Drives:
    """Drives for a ``pkrt.rt.runtime.config.MachineConfig``; ``overrides`` replace entries of its
    ``[drives]`` table (e.g. ``{"interface": "virtual", "channel": "hil0"}`` or a port);
    ``plant_model``: the simulated plant's exact model for ``plant = "exact"`` (a callable
    (theta, H, D, p) -> status, built from the model outside the drivers)."""
    name = config.drives.backend  # validated by the configuration's schema
    if name not in BACKENDS:
        raise DriveConfigError(f"{config.path}: [drives], field 'backend': unknown backend {name!r} "
                               f"(known: {', '.join(BACKENDS)})")
    module, cls = BACKENDS[name].split(":")
    kw = {} if plant_model is None else {"plant_model": plant_model}  # only the sim backend has a plant
    return getattr(importlib.import_module(module), cls).from_config(config, dict(overrides or {}), **kw)
