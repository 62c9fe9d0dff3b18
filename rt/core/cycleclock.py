"""A clock readable inside numba kernels: the CPU's time-stamp counter (``llvm.readcyclecounter``,
RDTSC on x86-64: about 10 ns a read, no system call), and its period in ns measured once per
process against ``time.perf_counter_ns``. Used to split one kernel call into timed parts
(``pkrt.rt.runtime.cycle.cycleparts``); the counter is constant-rate on hosts that flag
``constant_tsc`` (checked here on Linux: ``TSC_STEADY``).
"""

from __future__ import annotations

import functools
import time

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def rdtsc(typingctx):
    """The time-stamp counter (ticks, int64), read in a numba kernel."""
    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(ir.IntType(64), []))
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True)
def ticks() -> int:
    """The counter, from Python (calibration)."""
    return rdtsc()


def _steady() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
        return "constant_tsc" in flags.split()
    except OSError:
        return False


TSC_STEADY = _steady()


@functools.lru_cache(maxsize=1)
def ns_per_tick() -> float:
    """The counter's period (ns), measured over 20 ms; 0.0 when it does not advance (a CPU
    without one: the parts it would time then count 0)."""
    ticks()  # compile or load first
    n0, c0 = time.perf_counter_ns(), ticks()
    time.sleep(0.02)
    n1, c1 = time.perf_counter_ns(), ticks()
    return (n1 - n0) / (c1 - c0) if c1 > c0 else 0.0


__all__ = ["rdtsc", "ticks", "ns_per_tick", "TSC_STEADY"]
