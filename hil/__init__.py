"""pkrt.hil."""
