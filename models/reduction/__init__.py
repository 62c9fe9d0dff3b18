"""The exact reduced model H(theta), D(theta), p_ext(theta) in actuator coordinates
(``exact``).

This package has the path of the former module ``pkrt.models.reduction``: its names stay
importable from here (``Assembler`` now lives in ``pkrt.models.kinematics.assembly``).
"""

from ..kinematics.assembly import Assembler
from ..kinematics.mechanism import AssemblyError
from .exact import (ExactModel, Reduced, flatten_outputs, output_layout, quadratic_velocities, reduce_at,
                    unflatten_outputs, velocity_pairs)

__all__ = ["Assembler", "AssemblyError", "ExactModel", "Reduced", "reduce_at", "output_layout",
           "flatten_outputs", "unflatten_outputs", "quadratic_velocities", "velocity_pairs"]
