"""HIL timing modes (``pkrt hil --timing``) and the stepped mode's windows.

``stepped`` (the default, any host, virtual machines included): the emulators' plants advance
exactly one period per cycle (per SYNC on CAN, per Sync Write of Goal Current on serial), the
loop re-anchors its schedule after a late cycle instead of skipping periods (pacing ``delay``,
rt/runtime/machine/run.py), and the driver waits for its cycle's complete answer for ``STEPPED_WINDOW`` s of
its own time (time the host held its process is not counted: drivers/window.py). The window is
long because on a virtual machine the host also holds ONE vCPU at a time, the drives' (the
emulator's) while the driver runs on: measured here up to 15 ms in 10 s, and 62 ms and 245 ms
on one vCPU in test sessions (docs/hil.md). A host pause therefore delays the run but neither
breaks it nor changes its result.

In stepped mode wall time has no meaning for the run, so the faults are defined in cycles:
injected at a cycle (SYNC or write count, ``[emulator] inject_after`` x rate), detected within
3 cycles RUN of it (hil/verdict.py), torque off within 1 cycle of the detection. The ``delay``
fault holds every answer back ``STEPPED_DELAY`` s from its request (more than the driver's
``max_missed_cycles + 1`` windows, so it is detected before any late answer arrives), and a
drive's own SYNC watchdog, heartbeat consumer (CAN) and Bus Watchdog (serial) fire after
``STEPPED_SYNC_SILENCE`` s of silence at least: far longer than the longest hold of one vCPU
seen here (245 ms), so a host pause never trips them, and shorter than the driver's detection
of a cut line (``max_missed_cycles + 1`` windows), so the drives of a severed bus are off by
the cycle the driver detects it. (Should they come later, the stepped plant does not move
without SYNC meanwhile: their torque-off counts as the cycle after the last one run, and a
stepped run that ended on a fault waits ``STEPPED_SETTLE`` s at most for it.) ``wallclock`` (real-time hosts): periods skipped after an overrun, the plant
advanced by wall time, the configuration's strict windows.
"""

from __future__ import annotations

TIMINGS = ("stepped", "wallclock")  # the first is the default
PACING = {"stepped": "delay", "wallclock": "skip"}  # the loop's pacing in each (rt/runtime/cycle/pacing.py)
STEPPED_WINDOW = 0.5  # s of the driver's own time to wait for a cycle's answers
STEPPED_DELAY = 5 * STEPPED_WINDOW  # s, how long the `delay` fault holds an answer back
STEPPED_SYNC_SILENCE = 1.0  # s without SYNC (or heartbeat) before a drive's own watchdog fires
STEPPED_SETTLE = STEPPED_SYNC_SILENCE + 0.5  # s a stepped run waits after a fault for the drives' torque off
