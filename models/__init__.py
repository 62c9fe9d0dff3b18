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
"""
