"""pkrt.rt."""
