"""pkrt.rt.app."""
