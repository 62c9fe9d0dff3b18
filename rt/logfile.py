"""Run logs: a msgpack stream written from preallocated buffers by a background thread.

File layout (format ``pkrt-log``, version 1): a sequence of msgpack maps, each with a ``type``:

- ``header`` (first, written and flushed at open): ``format``, ``version``, ``created`` (UTC,
  ISO 8601), ``software`` (pkrt, numpy, numba, msgpack, python versions), ``channels``
  (list of ``[name, width, unit]``), ``block_cycles``, ``byte_order`` (``"<f8"``) and ``run``
  (the caller's header: machine, model and tree hashes, rate, axes, units, controller, ...).
- ``block``: ``first`` (cycle index of its first row), ``n`` (rows), ``data`` (n x row-width
  little-endian float64, row-major, channels in header order), ``crc`` (CRC32 of the 16-byte
  little-endian pair (first, n) followed by ``data``).
- ``event``: ``cycle``, ``kind``, ``message``, ``wall`` (UTC time, s since the epoch).
- ``end`` (last, written by ``close``): ``summary`` (the caller's), ``rows``, ``blocks``,
  ``dropped_blocks`` (blocks lost because the writer thread fell behind).

Reading is tolerant: a file cut off mid-write (e.g. SIGKILL) reads back to its last complete
record (``truncated = True``, ``summary = None``); a block whose CRC does not match is skipped
and counted in ``bad_blocks`` (its cycles are missing, the rest is read); a record that cannot
be decoded ends reading there (``truncated = True``, counted in ``bad_blocks``). A file that is
not a pkrt log, or has another format version, raises ``LogFileError``.
"""

from __future__ import annotations

import datetime as _dt
import os
import queue
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np

from .errors import UserError
from .filekind import LOG, expect
from .versions import software_versions

FORMAT = "pkrt-log"
VERSION = 1
_MAX_RECORD = 256 * 1024 * 1024  # bytes; a decoded length beyond this is corruption
_MAX_WIDTH = 100_000  # values per row; more is a damaged header


class LogFileError(UserError):
    """A file that is not a readable pkrt log (exit 2)."""


def _software() -> dict:
    return software_versions(("pkrt", "numpy", "numba", "msgpack"))


def _plain(x):
    """msgpack ``default``: numpy values to Python, dates and anything else to text."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (_dt.date, _dt.time)):
        return x.isoformat()
    if isinstance(x, (set, frozenset)):
        return sorted(x, key=str)
    if isinstance(x, Path):
        return str(x)
    return str(x)


def _pack(record: dict) -> bytes:
    return msgpack.packb(record, default=_plain, use_bin_type=True, strict_types=False)


def _crc(first: int, n: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(struct.pack("<qq", first, n)))


class LogWriter:
    """Write a run log. Per cycle the caller fills ``row`` (through ``slices[name]``, or faster
    through the preallocated views ``views[name]``: ``views["pos"][...] = x``,
    ``views["t"][0] = t``) and calls ``commit()``; that copies the row into a ring of preallocated block buffers and never blocks
    or allocates arrays. Full blocks go to a background thread that packs, writes and flushes
    them. If the ring is full the block just filled is dropped and counted.

    ``channels``: (name, width, unit) in row order. ``n_buffers``: blocks in the ring.
    ``wait_when_full``: wait for the thread instead of dropping (no real-time deadline to
    keep); ``None`` means wait exactly when ``header["lockstep"]`` is true, so lockstep runs,
    which may run far faster than real time, log every cycle.
    """

    def __init__(self, path, header: dict, channels: list[tuple[str, int, str]],
                 block_cycles: int = 256, n_buffers: int = 8, wait_when_full: bool | None = None):
        if block_cycles < 1 or n_buffers < 2:
            raise ValueError("block_cycles must be >= 1 and n_buffers >= 2")
        names = [c[0] for c in channels]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate channel names in {names}")
        self.path = str(path)
        self.channels = [(str(n), int(w), str(u)) for n, w, u in channels]
        self.width = sum(w for _, w, _ in self.channels)
        self.slices: dict[str, slice] = {}
        c = 0
        for name, w, _ in self.channels:
            self.slices[name] = slice(c, c + w)
            c += w
        self.block_cycles = block_cycles
        self.n_buffers = n_buffers
        self.row = np.zeros(self.width)  # the caller's staging row, fixed for the whole run
        self.views = {name: self.row[sl] for name, sl in self.slices.items()}
        self._ring = np.zeros((n_buffers, block_cycles, self.width))
        self._slots = [[self._ring[b, k] for k in range(block_cycles)] for b in range(n_buffers)]
        self._first = np.zeros(n_buffers, dtype=np.int64)
        self._count = np.zeros(n_buffers, dtype=np.int64)
        self._cur = 0  # buffer being filled
        self._k = 0  # next row in it
        self._cycle = 0  # cycle index of the next commit
        self._submitted = 0  # blocks handed to the thread (caller's thread only)
        self._done = 0  # blocks finished by the thread (writer thread only)
        self.wait_when_full = bool(header.get("lockstep", False)) if wait_when_full is None else wait_when_full
        self.dropped_blocks = 0
        self.blocks_written = 0
        self.error: str | None = None
        self._closed = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._file = open(self.path, "wb")
        rec = {"type": "header", "format": FORMAT, "version": VERSION,
               "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
               "software": _software(), "channels": [list(c) for c in self.channels],
               "block_cycles": block_cycles, "byte_order": "<f8", "run": dict(header)}
        self._file.write(_pack(rec))
        self._file.flush()
        self._thread = threading.Thread(target=self._run, name="pkrt-log-writer", daemon=True)
        self._thread.start()

    # -- caller's thread ----------------------------------------------------------------------
    def commit(self) -> None:
        """Append ``row`` as the next cycle. Never blocks."""
        self._slots[self._cur][self._k][...] = self.row  # Ellipsis: no temporary objects
        self._k += 1
        self._cycle += 1
        if self._k == self.block_cycles:
            self._hand_over()

    def _hand_over(self) -> None:
        b = self._cur
        self._first[b] = self._cycle - self._k
        self._count[b] = self._k
        self._k = 0
        if self.wait_when_full:
            self._wait_for_room(None)
        if self._submitted - self._done >= self.n_buffers - 1:
            self.dropped_blocks += 1  # next buffer still being written: lose this block
            return
        self._submitted += 1
        self._queue.put(b)
        self._cur = (b + 1) % self.n_buffers

    def _wait_for_room(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._submitted - self._done >= self.n_buffers - 1 and self._thread.is_alive():
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(0.0002)

    def event(self, cycle: int, kind: str, message: str) -> None:
        """Record a rare event (fault, state change) at a cycle index."""
        if self._closed:
            return
        self._queue.put({"type": "event", "cycle": int(cycle), "kind": str(kind),
                         "message": str(message), "wall": time.time()})

    def close(self, summary: dict | None = None) -> dict:
        """Write the partial block and the end record, join the thread, close the file.
        Safe to call more than once (later calls do nothing). Returns the writer's counts."""
        if not self._closed:
            self._closed = True
            if self._k > 0:
                self._wait_for_room(10.0)  # leaving the loop: waiting is fine
                self._hand_over()
            self._queue.put(("end", dict(summary or {})))
            self._queue.put(None)
            self._thread.join()
            self._file.close()
        return {"rows": self._cycle, "blocks": self.blocks_written,
                "dropped_blocks": self.dropped_blocks, "error": self.error}

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close({})

    # -- writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:  # lower priority than the loop's thread when the CPUs are contended (Linux: per thread)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (OSError, AttributeError):
            pass
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if isinstance(item, int):
                    n = int(self._count[item])
                    first = int(self._first[item])
                    data = self._ring[item, :n].astype("<f8", copy=False).tobytes()
                    rec = {"type": "block", "first": first, "n": n, "data": data,
                           "crc": _crc(first, n, data)}
                elif isinstance(item, tuple):
                    rec = {"type": "end", "summary": item[1], "rows": self._cycle,
                           "blocks": self.blocks_written, "dropped_blocks": self.dropped_blocks}
                else:
                    rec = item
                if self.error is None:
                    self._file.write(_pack(rec))
                    self._file.flush()
                    if isinstance(item, int):
                        self.blocks_written += 1
            except Exception as e:  # noqa: BLE001 - disk full etc.: keep the loop running
                if self.error is None:
                    self.error = f"{self.path}: log write failed: {e}"
            finally:
                if isinstance(item, int):
                    self._done += 1


@dataclass
class Log:
    """A run log read back. ``channels[name]``: (n_cycles, width) float64, 1-D when width is 1;
    ``cycles``: the cycle index of each row (gaps where blocks were dropped or bad)."""
    path: str
    header: dict  # the caller's header plus format, version, created, software
    channels: dict[str, np.ndarray]
    units: dict[str, str]
    widths: dict[str, int]
    cycles: np.ndarray
    events: list[dict] = field(default_factory=list)
    summary: dict | None = None
    truncated: bool = False
    bad_blocks: int = 0
    dropped_blocks: int = 0
    end: dict | None = None

    @property
    def n_cycles(self) -> int:
        return len(self.cycles)

    def get(self, name: str) -> np.ndarray | None:
        return self.channels.get(name)

    def row_of_cycle(self, cycle: int) -> int:
        """The first row at or after a loop cycle index (events carry the loop's index; rows
        count commits, which differ once a real-time loop skipped periods). Uses
        t = cycle / rate_hz when the log has both, else the row cycle indices."""
        rate, t = self.header.get("rate_hz"), self.channels.get("t")
        if isinstance(rate, (int, float)) and rate > 0 and t is not None and len(t):
            return int(np.searchsorted(t, cycle / rate - 0.5 / rate))
        return int(np.searchsorted(self.cycles, cycle))

    def axes(self) -> list[str]:
        """Axis names from the header, or q1..qs from the width of ``pos``/``ref_pos``."""
        ax = self.header.get("axes")
        if isinstance(ax, list) and ax:
            return [str(a) for a in ax]
        for name in ("ref_pos", "pos", "tau"):
            if name in self.widths:
                return [f"q{i + 1}" for i in range(self.widths[name])]
        return []


def _check_header(rec, path: str) -> dict:
    if not isinstance(rec, dict) or rec.get("type") != "header" or rec.get("format") != FORMAT:
        raise LogFileError(f"{path}: not a pkrt log (no '{FORMAT}' header)")
    if rec.get("version") != VERSION:
        raise LogFileError(f"{path}: pkrt log version {rec.get('version')!r} is not supported "
                           f"(this pkrt reads version {VERSION})")
    ch = rec.get("channels")
    ok = isinstance(ch, list) and all(
        isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and isinstance(c[1], int)
        and c[1] >= 1 and isinstance(c[2], str) for c in ch)
    if not ok or not isinstance(rec.get("run"), dict) or rec.get("byte_order", "<f8") != "<f8":
        raise LogFileError(f"{path}: damaged pkrt log header")
    if len({c[0] for c in ch}) != len(ch) or sum(c[1] for c in ch) > _MAX_WIDTH:
        raise LogFileError(f"{path}: damaged pkrt log header (duplicate channel names or an impossible width)")
    return rec


def read_log(path) -> Log:
    """Read a log (see the module docstring for what is tolerated)."""
    path = str(path)
    expect(path, LOG, LogFileError)  # another kind of file: say what it is
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise LogFileError(f"{path}: no such log file") from None
    except IsADirectoryError:
        raise LogFileError(f"{path}: is a directory, not a log file") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        unp = msgpack.Unpacker(f, raw=False, max_buffer_size=_MAX_RECORD, strict_map_key=False)
        try:
            head = unp.unpack()
        except Exception:  # noqa: BLE001 - any decode failure of the first record
            raise LogFileError(f"{path}: not a pkrt log (unreadable or empty)") from None
        head = _check_header(head, path)
        channels = [(c[0], c[1], c[2]) for c in head["channels"]]
        width = sum(w for _, w, _ in channels)
        blocks: list[tuple[int, np.ndarray]] = []
        events: list[dict] = []
        end = None
        bad = 0
        truncated = False
        while True:
            try:
                rec = unp.unpack()
            except msgpack.OutOfData:
                truncated = unp.tell() < size or end is None
                break
            except Exception:  # noqa: BLE001 - undecodable record: stop here
                bad += 1
                truncated = True
                break
            if not isinstance(rec, dict):
                bad += 1
                truncated = True
                break
            kind = rec.get("type")
            if kind == "block":
                first, n, data, crc = rec.get("first"), rec.get("n"), rec.get("data"), rec.get("crc")
                if (not isinstance(first, int) or not isinstance(n, int) or n < 1
                        or not isinstance(data, bytes) or len(data) != n * width * 8
                        or crc != _crc(first, n, data)):
                    bad += 1
                    continue
                blocks.append((first, np.frombuffer(data, dtype="<f8").reshape(n, width)))
            elif kind == "event":
                events.append({"cycle": rec.get("cycle"), "kind": rec.get("kind"),
                               "message": rec.get("message"), "wall": rec.get("wall")})
            elif kind == "end":
                end = rec
            else:
                bad += 1
    blocks.sort(key=lambda b: b[0])
    if blocks:
        data = np.concatenate([b for _, b in blocks]).astype(np.float64)
        cycles = np.concatenate([np.arange(f, f + len(b)) for f, b in blocks])
    else:
        data = np.zeros((0, width))
        cycles = np.zeros(0, dtype=np.int64)
    out: dict[str, np.ndarray] = {}
    c = 0
    for name, w, _ in channels:
        a = data[:, c:c + w]
        out[name] = np.ascontiguousarray(a[:, 0] if w == 1 else a)
        c += w
    header = dict(head["run"])
    for k in ("format", "version", "created", "software", "block_cycles"):
        header.setdefault(k, head.get(k))
    events.sort(key=lambda e: (e["cycle"] if isinstance(e["cycle"], int) else -1))
    summary = end.get("summary") if isinstance(end, dict) else None
    dropped = end.get("dropped_blocks", 0) if isinstance(end, dict) else 0
    dropped = dropped if isinstance(dropped, int) and not isinstance(dropped, bool) else 0
    return Log(path, header, out, {n: u for n, _, u in channels}, {n: w for n, w, _ in channels},
               cycles.astype(np.int64), events, summary if isinstance(summary, dict) else None,
               truncated or end is None, bad, dropped, end)
