"""Geometric calibration: the geometric parameters of a description, the identification
Jacobian of the tool pose, the identifiable (base) set, measurement poses chosen for
observability, the fit to an instrument's readings and the calibrated description. The top
layer of ``pkrt.models``: it uses the kinematics and the TOML writer of ``identification``."""
