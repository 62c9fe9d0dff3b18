"""The operator panel (``pkrt panel``): a web page for a served machine, in a process of its
own that is a client of the machine's control socket (the layer between the benchmarks and the
application layer)."""
