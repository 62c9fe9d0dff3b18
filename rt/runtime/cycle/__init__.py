"""The real-time cycle: the loop and its clocks, the controller, the contact observer, safety, the staged log row, the cycle's parts, lockstep, memory, stop signals."""
