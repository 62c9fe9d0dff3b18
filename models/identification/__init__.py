"""Identification of masses and friction from run logs: the regressor of the reduced inverse
dynamics, base parameters, exciting trajectories, estimation."""
