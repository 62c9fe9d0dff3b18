"""What wires models, runtime and drivers into what a user runs: a served machine, its socket
server and client."""
