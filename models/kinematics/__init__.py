"""Machine descriptions (TOML), joints and their constraints, the mechanism, assembly at any
actuator configuration, task-space (tool) kinematics and closed-form leg IK. Imports nothing
else of ``pkrt.models``."""
