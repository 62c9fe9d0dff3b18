"""The exact reduced model H(theta), D(theta), p_ext(theta) in actuator coordinates
(``exact``)."""

from .exact import (ExactModel, Reduced, flatten_outputs, output_layout, quadratic_velocities, reduce_at,
                    unflatten_outputs, velocity_pairs)

__all__ = ["ExactModel", "Reduced", "reduce_at", "output_layout",
           "flatten_outputs", "unflatten_outputs", "quadratic_velocities", "velocity_pairs"]
