"""The loop process' memory: locked only as far as it is used, malloc arenas bounded, freed heap
returned, buffers faulted in before the loop, and the figures a run reports (MB, counts).

Why ``mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`` and not ``MCL_CURRENT | MCL_FUTURE``:
the plain form faults in and pins every mapped page, used or not: the 150 MB image of LLVM
(numba's compiler, mapped whole, its code run only when compiling), OpenBLAS' 64 MB thread
buffers and 8 MB thread stacks, malloc's arena reservations. That was 640 MB pinned for a loop
that touches well under 200 MB. With ``MCL_ONFAULT`` (Linux 4.4) every page already resident is
pinned at once and every page touched later is pinned when first touched; reservations that are
never touched take no memory. What the loop touches is resident before it starts (warm-up
cycles, ``prefault`` of its buffers), so the loop takes no page fault either way (counted:
``thread_faults``). After the warm-up ``release_unused`` unlocks what the loop does not use
(the compiler's library, every run of pages the process has not mapped), so that ``VmLck``,
which counts every mapping marked for locking, reservations included, comes down to what is
mapped and pinned. ``Locked`` of ``/proc/self/smaps_rollup`` is the pinned memory's
proportional share (pages shared with other processes, such as libraries, counted in part).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource

import numpy as np

MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT = 1, 2, 4
M_ARENA_MAX, M_TRIM_THRESHOLD = -8, -1  # glibc mallopt parameters
KEEP_FREED = 1 << 30  # bytes of free heap top kept mapped rather than returned (never, in effect)
ARENAS = 2  # the loop's thread and the others (log writer, reference producer, telemetry) share these


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def bound_arenas(n: int = ARENAS) -> str:
    """At most ``n`` malloc arenas for threads started from now on (glibc ``mallopt``; each
    arena reserves 64 MB of address space). ``MALLOC_ARENA_MAX`` in the environment would do
    the same, but glibc reads it once at start-up: set from Python it does nothing."""
    try:
        ok = _libc().mallopt(M_ARENA_MAX, n)
    except (OSError, AttributeError) as e:
        return f"not applied: {e}"
    return f"applied (at most {n})" if ok == 1 else "not applied: mallopt refused"


def keep_freed_heap() -> str:
    """Free memory at the heap's top stays mapped for reuse instead of being returned to the
    system (glibc ``M_TRIM_THRESHOLD``; this also ends glibc's dynamic thresholds). Returned, the
    next allocation there maps fresh pages and the thread touching them takes page faults: a
    lockstep loop filling its reference blocks (scipy's temporaries) took one in a 60 s run.
    ``trim_heap`` still returns what is free when asked (before locking)."""
    try:
        ok = _libc().mallopt(M_TRIM_THRESHOLD, KEEP_FREED)
    except (OSError, AttributeError) as e:
        return f"not applied: {e}"
    return "applied (freed heap kept for reuse)" if ok == 1 else "not applied: mallopt refused"


HEAP_RESERVE = 4 << 20  # bytes of the calling thread's heap touched and kept free before the loop
HEAP_CHUNK = 64 << 10  # below glibc's mmap threshold (128 kB): the chunks come from the heap


def reserve_heap(nbytes: int = HEAP_RESERVE) -> None:
    """Touch ``nbytes`` of this thread's malloc heap, then free them (kept mapped by
    ``keep_freed_heap``): what the loop's temporaries take later is resident already. Without
    it a lockstep loop's reference fills reached fresh heap pages (a page fault each) in a long
    run."""
    libc = _libc()
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = []
    try:
        for _ in range(nbytes // HEAP_CHUNK):
            p = libc.malloc(HEAP_CHUNK)
            if not p:
                break
            ctypes.memset(p, 0, HEAP_CHUNK)
            chunks.append(p)
    finally:
        for p in chunks:
            libc.free(p)


OBJECT_RESERVE = 16 << 20  # bytes of small Python objects made and freed before the loop
POOL = 16 << 10  # the small-object allocator's pool (CPython 3.11: 16 KiB, blocks of up to 512 B)


def reserve_objects(nbytes: int = OBJECT_RESERVE) -> None:
    """Python's small-object allocator takes 1 MiB arenas from mmap (not from the malloc heap),
    carves 16 KiB pools from them and fills a pool's blocks in order: a loop whose Python part
    (a lockstep run's reference fills) reaches a page of a pool never touched takes a page
    fault (1-2 in a 60 s run, depending on what was allocated before it). Blocks of every size
    fill each size's current pool and the next; ``nbytes`` of small objects carve every pool the
    arenas have left (new arenas are freed again with their objects). Freed, the pools stay
    touched and serve the loop."""
    sizes = [bytes(n) for n in range(0, 480, 8) for _ in range(2 * POOL // (33 + n) + 1)]
    objs = [float(i) for i in range(nbytes // 32)]
    del sizes, objs


def trim_heap() -> None:
    """Give the heap's free pages back to the system (planning's temporaries) before locking."""
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):
        pass


def lock_memory() -> str:
    """``mlockall`` as the module docstring says (``MCL_ONFAULT`` where the kernel has it, else
    the plain form); the report's line."""
    try:
        libc = _libc()
    except OSError as e:
        return f"not applied: {e}"
    trim_heap()
    if libc.mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) == 0:
        return "applied (current and future pages, each as it is first touched)"
    if ctypes.get_errno() == 22 and libc.mlockall(MCL_CURRENT | MCL_FUTURE) == 0:  # EINVAL: no MCL_ONFAULT
        return "applied (current and future pages, all mapped pages faulted in)"
    return f"not applied: {os.strerror(ctypes.get_errno())}"


UNUSED_CODE = ("libllvmlite", "libLLVM")  # numba's compiler: run when compiling or loading kernels, never in the loop
MIN_RUN = 16  # pages: shorter runs of pages not mapped here stay locked (each unlocked run splits a mapping)


def _locked_mappings(smaps: str) -> list[tuple[int, int, bool]]:
    """(start, end, is the compiler's library) of every locked mapping (``/proc/PID/smaps``)."""
    out, cur = [], None
    with open(smaps) as f:
        for line in f:
            first = line.split(" ", 1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split()
                lo, hi = (int(x, 16) for x in first.split("-"))
                cur = (lo, hi, any(u in (parts[5] if len(parts) > 5 else "") for u in UNUSED_CODE))
            elif line.startswith("VmFlags:") and cur is not None:
                if {"lo", "lf"} & set(line.split()[1:]):
                    out.append(cur)
                cur = None
    return out


def release_unused(smaps: str = "/proc/self/smaps", pagemap: str = "/proc/self/pagemap") -> str:
    """After the warm-up, before the drives are enabled (37 ms for the main job; longer than a
    servo's 60 ms Bus Watchdog allows between commands in a larger process, hence not between
    enable and the first cycle): ``munlock`` what the loop does not use, so the
    locked memory is what it touches. Unlocked: the compiler's library (LLVM, 150 MB mapped,
    ~70 MB of it resident after loading the kernels: numba runs it to compile and to load
    cached kernels, not to call them), and in every other locked mapping each run of at least
    ``MIN_RUN`` pages that this process has not mapped (the present bit of
    ``/proc/self/pagemap``): reservations nobody touched (OpenBLAS' 64 MB buffers, malloc's
    reserved heaps, thread stacks), library code never run. A page of those that the loop
    touched later would fault just as it does under ``MCL_ONFAULT``; the loop's page faults
    are counted and are 0 in the tests. Returns the report's line."""
    try:
        libc = _libc()
        maps = _locked_mappings(smaps)
        pm = open(pagemap, "rb", buffering=0)
    except OSError as e:
        return f"not applied: {e}"
    page = os.sysconf("SC_PAGE_SIZE")
    freed = code = 0

    def unlock(lo: int, n: int) -> None:
        nonlocal freed
        if libc.munlock(ctypes.c_void_p(lo), ctypes.c_size_t(n * page)) == 0:
            freed += n

    with pm:
        for lo, hi, compiler in maps:
            n = (hi - lo) // page
            if compiler:
                unlock(lo, n)
                code += n
                continue
            try:
                pm.seek(lo // page * 8)
                entries = np.frombuffer(pm.read(n * 8), np.uint64)
            except (OSError, ValueError):
                continue
            if len(entries) != n:
                continue
            present = (entries >> np.uint64(63)).astype(np.int8)
            edges = np.flatnonzero(np.diff(np.r_[1, present, 1]))  # starts and ends of runs not present
            for start, end in zip(edges[::2], edges[1::2]):
                if end - start >= MIN_RUN:
                    unlock(lo + int(start) * page, int(end - start))
    mb = page / 2**20
    return f"applied ({freed * mb:.0f} MB unlocked, {code * mb:.0f} MB of it the compiler's library)"


def prefault(*arrays: np.ndarray) -> None:
    """Write every page of ``arrays`` (large numpy buffers come from ``mmap`` untouched: the first
    write to each page would fault, in the loop)."""
    for a in arrays:
        a.fill(0)


def thread_faults() -> tuple[int, int]:
    """(minor, major) page faults of the calling thread so far (``RUSAGE_THREAD``)."""
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_minflt, r.ru_majflt


KERNEL_MOVES = ("thp_collapse_alloc", "thp_split_pmd", "pgmigrate_success", "numa_hint_faults")


def kernel_moves() -> dict[str, int]:
    """The kernel's page moves so far, whole system (``/proc/vmstat``): huge pages collapsed by
    khugepaged or split, pages migrated (compaction), NUMA hinting faults. A thread touching a
    page while the kernel moves it takes a minor fault that is not its own doing; a run reports
    these counters' change over its loop beside the loop's faults. Absent counters read 0."""
    out = dict.fromkeys(KERNEL_MOVES, 0)
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                name, _, val = line.partition(" ")
                if name in out:
                    out[name] = int(val)
    except (OSError, ValueError):
        pass
    return out


def status(pid: int | str = "self") -> dict:
    """VmLck, VmRSS, VmSize (MB) of a process (``/proc/PID/status``) and ``locked_mb``: the
    proportional share of its locked pages (``Locked`` of ``smaps_rollup``: shared pages counted
    in part); None where unreadable."""
    out: dict = {"vmlck_mb": None, "vmrss_mb": None, "vmsize_mb": None, "locked_mb": None}
    keys = {"VmLck": "vmlck_mb", "VmRSS": "vmrss_mb", "VmSize": "vmsize_mb"}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, val = line.partition(":")
                if name in keys:
                    out[keys[name]] = round(int(val.split()[0]) / 1024, 1)
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Locked:"):
                    out["locked_mb"] = round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return out
