"""pkrt.models: offline work on the model, one sub-package per domain, bottom up:

- ``kinematics``: descriptions, joints, constraints, the mechanism, assembly at any actuator
  configuration, task-space (tool) kinematics, closed-form leg IK;
- ``reduction``: the exact reduced model H, D, p_ext;
- ``trees``: building, verifying, plotting trees (boxes, splines), Dask evaluation;
- ``planning``: geometric paths, G-code, time-optimal parameterisation;
- ``identification``: the regressor, base parameters, exciting trajectories, estimation;
- ``calibration`` (on top): geometric parameters, the identification Jacobian of the tool, the
  base set, measurement poses, the fit to an instrument's readings, the calibrated description.

``machines/`` holds the shipped descriptions, configurations and trees (data). The order of
the sub-packages is a layers contract in ``.importlinter``.

The modules of the flat layout before 2026-11-28 (``pkrt.models.mechanism``,
``pkrt.models.treebuild``, ...) still import, with a ``DeprecationWarning``, as modules that
re-export the public names of their new homes (``MOVED``); they will be removed in a later
release. ``pkrt.models.reduction`` kept its path (it is now the sub-package).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

# former module (pkrt.models.X) -> the modules that now hold its names
MOVED: dict[str, tuple[str, ...]] = {
    "baseparams": ("identification.baseparams",),
    "build_trees": ("trees.shipped",),
    "constraints": ("kinematics.constraints",),
    "daskeval": ("trees.daskeval",),
    "description": ("kinematics.description",),
    "excitation": ("identification.excitation",),
    "gcode": ("planning.gcode",),
    "geompath": ("planning.geompath",),
    "identify": ("identification.estimate",),
    "joints": ("kinematics.joints",),
    "legik": ("kinematics.legik",),
    "mechanism": ("kinematics.mechanism",),
    "regressor": ("identification.regressor",),
    "reports": ("kinematics.report", "trees.summary"),
    "splinebuild": ("trees.splines",),
    "taskspace": ("kinematics.taskspace",),
    "topp": ("planning.topp", "planning.items"),
    "topp_plot": ("planning.topp_plot",),
    "treeaccuracy": ("trees.accuracy",),
    "treebuild": ("trees.build", "trees.settings", "trees.samples", "trees.boxes"),
    "treeplot": ("trees.plot",),
    "treeverify": ("trees.verify", "trees.outputs", "trees.sampling", "trees.exact"),
}


class _MovedModule(importlib.abc.Loader, importlib.abc.MetaPathFinder):
    """Imports a former module as a new module object holding its new homes' public names."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.rpartition(".")[2]
        if fullname.rpartition(".")[0] != __name__ or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None  # a plain module

    def exec_module(self, module) -> None:
        old = module.__name__.rpartition(".")[2]
        homes = [f"{__name__}.{m}" for m in MOVED[old]]
        warnings.warn(f"{module.__name__} moved to {', '.join(homes)}", DeprecationWarning, stacklevel=2)
        for home in homes:
            new = importlib.import_module(home)
            names = getattr(new, "__all__", None) or [n for n in vars(new) if not n.startswith("__")]
            for n in names:
                module.__dict__.setdefault(n, getattr(new, n))


if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.append(_MovedModule())
