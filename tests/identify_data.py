"""Identification test data: a truth model that differs non-uniformly from a shipped one, a
Fourier motion through its exact inverse dynamics plus friction, force noise and position
quantisation, written by the real log writer as a run log of the machine
(``pkrt.rt.bench.identifylog``, shared with the contact detection benchmark)."""

from __future__ import annotations

from pkrt.rt.bench.bench_identify import truth_mechanism  # noqa: F401 (the tests' truth too)
from pkrt.rt.bench.identifylog import fourier_motion, write_log  # noqa: F401
