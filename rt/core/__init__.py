"""pkrt.rt.core."""
