"""Logs read back: statistics, replay, MCAP, ROS 2 bags, Foxglove, logs as identification data."""
