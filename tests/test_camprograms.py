"""The generated CAM programs (``pkrt.rt.bench.camprograms``) of the streaming benchmarks:
deterministic, interpreted cleanly, their segments of the length asked for."""

from __future__ import annotations

import numpy as np

from pkrt.models.planning.gcode import canon_stream, read_lines
from pkrt.rt.bench.camprograms import finishing, relief


def test_relief_and_finishing_programs_are_deterministic_and_interpret(tmp_path):
    a, b = relief(tmp_path / "a.ngc", lines=3000), relief(tmp_path / "b.ngc", lines=3000)
    assert a.read_bytes() == b.read_bytes()
    assert abs(len(a.read_text().splitlines()) - 3000) < 300
    for path, seg in ((a, 0.36), (finishing(tmp_path / "f.ngc", segments=3000), 0.16)):
        feeds = [c for c in canon_stream(read_lines(str(path)), path=str(path)) if c.kind == "feed"]
        steps = np.array([np.linalg.norm((c.end - c.start)[:2]) for c in feeds[2:]])
        assert len(feeds) > 2500
        assert abs(np.median(steps) - seg) < 0.01
    inch = relief(tmp_path / "i.ngc", lines=500, inch=True).read_text()
    assert "G20" in inch
