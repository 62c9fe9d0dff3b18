"""pkrt.drivers."""
