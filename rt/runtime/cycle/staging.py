"""The cycle's log row staged in one numba call (a dozen numpy slice assignments cost
microseconds a cycle). The row layout is ``pkrt.rt.runtime.machine.runsetup.CHANNELS``: t, ref_pos, ref_vel,
ref_acc, pos, vel, tau, tau_model (s each), wake_us, compute_us, flags.
"""

from __future__ import annotations

from numba import njit

ROW_ORDER = ("t", "ref_pos", "ref_vel", "ref_acc", "pos", "vel", "tau", "tau_model", "wake_us",
             "compute_us", "flags")


@njit(cache=True)
def stage_row(row, t, ref_pos, ref_vel, ref_acc, pos, vel, tau, torque_on, tau_model, wake_us,
              compute_us, flags, err):
    """Fill ``row`` (4 + 7 s values: t, 7 vectors of s, 3 scalars; ``ROW_ORDER``) and ``err`` = ref_pos - pos (actuator
    units); tau is logged as 0 when the torque is off."""
    s = pos.shape[0]
    if row.shape[0] < 4 + 7 * s or err.shape[0] < s:  # numba does not check bounds
        raise ValueError("stage_row: the row needs 4 + 7 s values and err s")
    row[0] = t
    for i in range(s):
        row[1 + i] = ref_pos[i]
        row[1 + s + i] = ref_vel[i]
        row[1 + 2 * s + i] = ref_acc[i]
        row[1 + 3 * s + i] = pos[i]
        row[1 + 4 * s + i] = vel[i]
        row[1 + 5 * s + i] = tau[i] if torque_on else 0.0
        row[1 + 6 * s + i] = tau_model[i]
        err[i] = ref_pos[i] - pos[i]
    row[1 + 7 * s] = wake_us
    row[2 + 7 * s] = compute_us
    row[3 + 7 * s] = flags


__all__ = ["ROW_ORDER", "stage_row"]
