"""Motion planning through the model: geometric paths, G-code programs, time-optimal
parameterisation under the actuators' limits and the reduced dynamics."""
