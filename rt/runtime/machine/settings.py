"""A served machine's operating limits (``ServeSettings``, fractions of the configuration's
[limits]) and the soft limits they give. Units: actuator units (m or rad), seconds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pkrt.rt.runtime.machine.config import MachineConfig


@dataclass
class ServeSettings:
    """Operating limits of a served machine, as fractions of the configuration's [limits]."""

    jog_speed: float = 0.25       # joint jog: fraction of the velocity limit
    jog_accel: float = 0.25       # jogs, stops of jogs and streams: fraction of the acceleration limit
    unhomed_speed: float = 0.05   # joint jog before homing: fraction of the velocity limit
    ramp_s: float = 0.25          # feed hold / resume / override: shortest 0 -> 100 % time of the scaling
    deadman_s: float = 0.5        # a continuous jog without a keep-alive for this long is released
    stream_timeout_s: float = 0.2  # a live-target stream without a target for this long stops
    soft_margin: float = 0.01     # soft limits: the actuator ranges shrunk by this fraction at each end
    limit_margin: float = 0.02    # references within the velocity and acceleration limits less this fraction


def soft_limits(config: MachineConfig, settings: ServeSettings) -> tuple[np.ndarray, np.ndarray]:
    """The soft limits (lo, hi): every reference a served machine follows stays inside them,
    a margin inside the actuator ranges that the safety supervisor and the plant's model guard
    (the machine tracks its reference with an error: at the range it would cross it)."""
    lo, hi = config.limits.position[:, 0], config.limits.position[:, 1]
    m = settings.soft_margin * (hi - lo)
    return lo + m, hi - m


def limits_at(m, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The soft limits of machine ``m`` widened to ``pos``, where a motion starts: a machine
    enabled or stopped beyond them (by its tracking error) holds there, and may come back,
    never go further."""
    return np.minimum(m.lo, pos), np.maximum(m.hi, pos)
