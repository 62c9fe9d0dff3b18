"""pkrt.models."""
