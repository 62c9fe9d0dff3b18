"""What the cycle records: the run log's writer, telemetry."""
