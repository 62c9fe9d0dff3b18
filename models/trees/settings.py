"""What determines a tree (``BuildSettings``, recorded in its header) and the header a build writes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.versions import software_versions

from ..kinematics.mechanism import Mechanism
from ..reduction.exact import output_layout
from .exact import MAX_SAMPLES

FORMAT_BUILDER = "pkrt.models.treebuild 3"


DEFAULT_VERIFY_SAMPLES = 1000


class BuildError(UserError):
    """Impossible build settings."""


KINDS = ("spline", "boxes")


SPLINE_DEFAULT_MAX_S = 3  # pkrt build's default kind: spline up to 3 actuators, boxes beyond


DEFAULT_MAX_BYTES = 16 * 2 ** 20  # coefficient table bound (the Orthoglide target: <= 16 MB)


@dataclass
class BuildSettings:
    """What determines a tree (recorded in its header; ``jobs`` is not: it changes nothing)."""
    boxes: int | None = None  # uniform: intervals per axis (boxes or spline cells)
    tol: float | None = None  # adaptive: held-out relative error target
    kind: str = "boxes"  # "boxes" (quadratic leaves) or "spline" (tensor cubic spline)
    max_bytes: int = DEFAULT_MAX_BYTES  # adaptive spline: coefficient table bound (bytes)
    max_leaves: int = 4096
    sing_threshold: float | None = None  # default: the model's singular_threshold
    verify_samples: int = DEFAULT_VERIFY_SAMPLES
    seed: int = 0
    region: tuple[float, ...] | None = None  # lo, hi (all actuators) or lo1, hi1, lo2, ... inside the ranges
    extra: dict = field(default_factory=dict)

    def root_box(self, mech: Mechanism) -> tuple[np.ndarray, np.ndarray]:
        """The tree's box: the actuator ranges, or ``region`` inside them (one-line error)."""
        lo, hi = mech.ranges[:, 0].copy(), mech.ranges[:, 1].copy()
        if self.region is None:
            return lo, hi
        r = np.asarray(self.region, float).reshape(-1)
        if r.size == 2:
            r = np.tile(r, len(lo))
        if r.size != 2 * len(lo):
            raise BuildError(f"--region needs 2 or {2 * len(lo)} numbers (lo,hi per actuator), got {r.size}")
        r = r.reshape(-1, 2)
        if not np.all(r[:, 0] < r[:, 1]) or np.any(r[:, 0] < lo) or np.any(r[:, 1] > hi):
            raise BuildError(f"--region must have lo < hi inside the actuator ranges {np.c_[lo, hi].tolist()}, "
                             f"got {r.tolist()}")
        return r[:, 0].copy(), r[:, 1].copy()

    def check(self, s: int) -> None:
        if self.kind not in KINDS:
            raise BuildError(f"--kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if (self.boxes is None) == (self.tol is None):
            raise BuildError("give exactly one of --boxes N (uniform) or --tol REL (adaptive)")
        if self.kind == "spline" and self.boxes is not None and self.boxes < 3:
            raise BuildError(f"--boxes must be at least 3 for a spline tree (not-a-knot cubic "
                             f"interpolation needs 4 points per axis), got {self.boxes}")
        if not 1 <= self.max_bytes <= 2 ** 40:
            raise BuildError(f"--max-bytes must be in 1..2^40, got {self.max_bytes}")
        if self.boxes is not None and not 1 <= self.boxes:
            raise BuildError(f"--boxes must be at least 1, got {self.boxes}")
        if self.boxes is not None and self.boxes ** s > 10 ** 6:
            raise BuildError(f"--boxes {self.boxes} gives {self.boxes ** s} leaves for {s} "
                             f"actuators; at most 10^6 are supported")
        if self.tol is not None and not (np.isfinite(self.tol) and self.tol > 0):
            raise BuildError(f"--tol must be a positive relative error, got {self.tol}")
        if not 1 <= self.max_leaves <= 10 ** 6:
            raise BuildError(f"--max-leaves must be in 1..10^6, got {self.max_leaves}")
        if self.sing_threshold is not None and not (0 <= self.sing_threshold < np.inf):
            raise BuildError(f"--sing-threshold must be a finite number >= 0, got {self.sing_threshold}")
        if not 0 <= self.verify_samples <= MAX_SAMPLES:
            raise BuildError(f"--verify-samples must be in 0..{MAX_SAMPLES}, got {self.verify_samples}")


def tree_header(mech: Mechanism, settings: BuildSettings, scale: np.ndarray, build: dict) -> dict:
    return {
        "model": {"name": mech.name, "content_hash": mech.content_hash},
        "actuators": {"names": mech.actuator_names, "units": mech.actuator_units,
                      "ranges": np.c_[settings.root_box(mech)].tolist()},
        "outputs": output_layout(mech.n_act),
        "output_scale": np.asarray(scale).tolist(),
        "build": {"builder": FORMAT_BUILDER,
                  "mode": "uniform" if settings.boxes is not None else "adaptive",
                  "boxes": settings.boxes, "tol": settings.tol,
                  "region": None if settings.region is None else np.c_[settings.root_box(mech)].tolist(),
                  **build, **settings.extra},
        "verification": {},
        "software": software_versions(),  # the versions it was built with
    }
