"""The bits of the per-cycle ``flags`` channel: set by the controller and the loop, read by
the log statistics and exports."""

FLAG_SATURATED, FLAG_TREE, FLAG_OVERRUN, FLAG_STALE, FLAG_NONFINITE = 1, 2, 4, 8, 16
FLAG_BITS = {"saturated": FLAG_SATURATED, "clamped_or_out_of_domain": FLAG_TREE, "overrun": FLAG_OVERRUN,
             "stale_feedback": FLAG_STALE, "non_finite_torque": FLAG_NONFINITE}  # by name, as logs and exports spell them
