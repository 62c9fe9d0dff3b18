"""pkrt.rt.runtime."""
