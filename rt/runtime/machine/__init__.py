"""A run's session and the served machine: configuration, the run, states, motion sources, live targets, homing, programs, the journal, protection's reactions."""
