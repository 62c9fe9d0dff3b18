"""Run logs: a msgpack stream written from preallocated buffers by a background thread.

File layout (format ``pkrt-log``, version 2): a sequence of msgpack maps, each with a ``type``,
the run's ``run_id`` (32 hex digits, random per run), a record sequence number ``seq`` (0 for
the header, then +1 per record in file order) and a ``crc``: CRC32 of the record kind, run id
and sequence number followed by the record's payload, so that no record can be moved into
another log, repeated or reordered unnoticed.

- ``header`` (first, seq 0): ``format``, ``version``, and ``body``: a msgpack map of
  ``created`` (UTC, ISO 8601), ``software`` (pkrt, numpy, numba, msgpack, python versions),
  ``channels`` (list of ``[name, width, unit]``), ``block_cycles``, ``byte_order`` (``"<f8"``)
  and ``run`` (the caller's header: machine, model and tree hashes, rate, axes, units, ...).
  Payload for the CRC: ``body``.
- ``block``: ``first`` (cycle index of its first row), ``n`` (rows), ``data`` (n x row-width
  little-endian float64, row-major, channels in header order). Payload: the 16-byte
  little-endian pair (first, n) followed by ``data``.
- ``event``: ``body``, a msgpack map of ``cycle``, ``kind``, ``message``, ``wall`` (UTC, s
  since the epoch).
- ``end`` (last, written by ``close``): ``body``, a msgpack map of ``summary`` (the caller's),
  ``rows`` (cycles committed), ``rows_written`` and ``blocks`` (what reached the file before
  it), ``dropped_blocks`` (blocks lost because the writer thread fell behind).

Writing: one writer per log. The writer holds an exclusive ``flock`` on ``<log>.lock`` for the
whole run (the kernel releases it when the process dies, so the lock of a killed run is never
in the way: the next writer takes the file over); a second writer is refused. The log is
written under a temporary name beside it until its header is complete, then renamed.

Reading is tolerant and says what it dropped (``Log.problems``): a file cut off mid-write
(e.g. SIGKILL, disk full) reads back to its last complete record (``truncated``, ``summary =
None``); a block whose CRC does not match is skipped and counted in ``bad_blocks``; a record of
another run, a repeated sequence number or a block overlapping cycles already read is skipped
and counted (never read twice); anything after the end record (appended records, another log
concatenated) and anything after undecodable data is dropped. A file that is not a pkrt log,
whose header fails its CRC, or of another format version raises ``LogFileError``.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
import queue
import stat
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgpack
import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.filekind import LOG, expect
from pkrt.rt.core.inputs import excerpt
from pkrt.rt.core.versions import software_versions

FORMAT = "pkrt-log"
VERSION = 2
_MAX_RECORD = 256 * 1024 * 1024  # bytes; a decoded length beyond this is corruption
_MAX_WIDTH = 100_000  # values per row; more is a damaged header


class LogFileError(UserError):
    """A file that is not a readable pkrt log, or a log that cannot be written (exit 2)."""


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


def channel_slices(widths) -> dict[str, slice]:
    """Each channel's columns in a row that holds the channels side by side, in order;
    ``widths``: (name, number of columns) pairs."""
    out: dict[str, slice] = {}
    c = 0
    for name, w in widths:
        out[name] = slice(c, c + int(w))
        c += int(w)
    return out


def _pack(record: dict) -> bytes:
    return msgpack.packb(record, default=_plain, use_bin_type=True, strict_types=False)


def _crc(kind: str, run_id: str, seq: int, *payload: bytes) -> int:
    """CRC32 of kind, run id and sequence number, then the payload pieces."""
    c = zlib.crc32(f"{kind}\0{run_id}\0".encode() + struct.pack("<q", seq))
    for p in payload:
        c = zlib.crc32(p, c)
    return c


def _block_key(first: int, n: int) -> bytes:
    return struct.pack("<qq", first, n)


def sealed(kind: str, run_id: str, seq: int, body: dict) -> dict:
    """A header, event or end record: ``body`` packed, with its CRC."""
    b = _pack(body)
    return {"type": kind, "run_id": run_id, "seq": seq, "body": b, "crc": _crc(kind, run_id, seq, b)}


def _acquire_lock(path: str) -> int:
    """Take the exclusive lock of a log path (``flock`` on ``<path>.lock``); returns its fd.
    Refused (LogFileError) while another process holds it. A lock file left by a process
    that died holds no lock and is taken over."""
    lock = path + ".lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            except OSError:
                owner = "unknown"
            os.close(fd)
            raise LogFileError(f"{path}: another pkrt process (pid {owner}) is writing this log "
                               f"(lock {lock}); give another log file") from None
        try:  # the previous owner may have removed the file between our open and our lock
            same = os.path.samestat(os.stat(lock), os.fstat(fd))
        except FileNotFoundError:
            same = False
        if same:
            try:  # the owner's pid, for the message of a refused writer (a full disk: none)
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass
            return fd
        os.close(fd)


def _release_lock(path: str, fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.unlink(path + ".lock")  # while still holding it: no one can be between open and lock
    except OSError:
        pass
    os.close(fd)


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
    Opening takes the log's lock (LogFileError if another process writes it) and writes the
    header under a temporary name, renamed to ``path`` once complete; an existing non-regular
    file (a FIFO, a device) is written in place.
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
        self.slices = channel_slices((n, w) for n, w, _ in self.channels)
        self.block_cycles = block_cycles
        self.n_buffers = n_buffers
        self.row = np.zeros(self.width)  # the caller's staging row, fixed for the whole run
        self.views = {name: self.row[sl] for name, sl in self.slices.items()}
        self._ring = np.zeros((n_buffers, block_cycles, self.width))
        self._ring.fill(0.0)  # every page written now: the loop's commits take no page fault
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
        self.rows_written = 0  # rows in blocks that reached the file
        self.error: str | None = None
        self._closed = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.run_id = uuid.uuid4().hex
        self._seq = 0
        body = {"created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                "software": _software(), "channels": [list(c) for c in self.channels],
                "block_cycles": block_cycles, "byte_order": "<f8", "run": dict(header)}
        rec = sealed("header", self.run_id, 0, body)
        rec = {"type": "header", "format": FORMAT, "version": VERSION, **rec}
        try:
            self._lock = _acquire_lock(self.path)
        except OSError as e:
            raise LogFileError(f"{self.path}: cannot write the log: {e.strerror or e}") from None
        try:
            self._file = self._open_with_header(_pack(rec))
        except OSError as e:
            _release_lock(self.path, self._lock)
            raise LogFileError(f"{self.path}: cannot write the log: {e.strerror or e}") from None
        except BaseException:
            _release_lock(self.path, self._lock)
            raise
        self._thread = threading.Thread(target=self._run, name="pkrt-log-writer", daemon=True)
        self._thread.start()

    def _open_with_header(self, header: bytes):
        """The open log file, its header written: under a temporary name, then renamed."""
        try:
            special = not stat.S_ISREG(os.stat(self.path).st_mode)
        except FileNotFoundError:
            special = False
        if special and os.path.isdir(self.path):
            raise IsADirectoryError(21, "Is a directory", self.path)
        if special:  # a FIFO or a device: nothing to rename over
            f = open(self.path, "wb")
            f.write(header)
            f.flush()
            return f
        tmp = f"{self.path}.{os.getpid()}.tmp"
        f = open(tmp, "wb")
        try:
            f.write(header)
            f.flush()
            os.replace(tmp, self.path)
        except BaseException:
            try:
                f.close()  # may fail again flushing (disk full)
            except OSError:
                pass
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return f

    # -- caller's thread ----------------------------------------------------------------------
    def commit(self) -> None:
        """Append ``row`` as the next cycle. Never blocks."""
        self._slots[self._cur][self._k][...] = self.row  # Ellipsis: no temporary objects
        self._k += 1
        self._cycle += 1
        if self._k == self.block_cycles:
            self._hand_over()

    def free_rows(self) -> np.ndarray:
        """The rows the next commits fill, in the buffer being filled ((m, width), m >= 1): a
        compiled loop may write several cycles' rows there, then say so with ``committed``."""
        return self._ring[self._cur, self._k:]

    def committed(self, n: int) -> None:
        """``n`` rows of ``free_rows`` were written as the next cycles (as n ``commit`` calls)."""
        if not 0 <= n <= self.block_cycles - self._k:
            raise ValueError(f"committed({n}): {self.block_cycles - self._k} rows were free")
        self._k += n
        self._cycle += n
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
        self._queue.put({"cycle": int(cycle), "kind": str(kind), "message": str(message), "wall": time.time()})

    def close(self, summary: dict | None = None) -> dict:
        """Write the partial block and the end record, join the thread, close the file and
        release the lock. Safe to call more than once (later calls do nothing). Returns the
        writer's counts; ``error`` says where the log stops if writing failed (disk full)."""
        if not self._closed:
            self._closed = True
            if self._k > 0:
                self._wait_for_room(10.0)  # leaving the loop: waiting is fine
                self._hand_over()
            self._queue.put(("end", dict(summary or {})))
            self._queue.put(None)
            self._thread.join()
            try:
                self._file.close()
            except OSError as e:  # the last flush failed (disk full): the log stops earlier
                self._failed(e)
            _release_lock(self.path, self._lock)
            self._lock = None
        return {"rows": self._cycle, "blocks": self.blocks_written, "rows_written": self.rows_written,
                "dropped_blocks": self.dropped_blocks, "error": self.error}

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close({})

    # -- writer thread ------------------------------------------------------------------------
    def _failed(self, e: BaseException) -> None:
        if self.error is None:
            self.error = (f"{self.path}: log write failed: {e}; the log stops after "
                          f"{self.rows_written} cycles ({self.blocks_written} blocks)")

    def _record(self, item) -> dict:
        seq = self._seq
        if isinstance(item, int):
            n = int(self._count[item])
            first = int(self._first[item])
            data = self._ring[item, :n].astype("<f8", copy=False).tobytes()
            return {"type": "block", "run_id": self.run_id, "seq": seq, "first": first, "n": n,
                    "data": data, "crc": _crc("block", self.run_id, seq, _block_key(first, n), data)}
        if isinstance(item, tuple):
            return sealed("end", self.run_id, seq, {
                "summary": item[1], "rows": self._cycle, "rows_written": self.rows_written,
                "blocks": self.blocks_written, "dropped_blocks": self.dropped_blocks})
        return sealed("event", self.run_id, seq, item)

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
                if self.error is None:
                    self._seq += 1
                    self._file.write(_pack(self._record(item)))
                    self._file.flush()
                    if isinstance(item, int):
                        self.blocks_written += 1
                        self.rows_written += int(self._count[item])
            except Exception as e:  # noqa: BLE001 - disk full etc.: keep the loop running
                self._failed(e)
            finally:
                if isinstance(item, int):
                    self._done += 1


@dataclass
class Log:
    """A run log read back. ``channels[name]``: (n_cycles, width) float64, 1-D when width is 1;
    ``cycles``: the cycle index of each row (gaps where blocks were dropped or bad).
    ``problems``: one sentence per thing that was skipped or dropped while reading."""
    path: str
    header: dict  # the caller's header plus format, version, created, software, run_id
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
    problems: list[str] = field(default_factory=list)
    skipped_records: int = 0  # duplicated, foreign or overlapping records not read
    dropped_bytes: int = 0  # bytes after the end record or after undecodable data
    labels: dict[str, list[str]] = field(default_factory=dict)  # column names of channels not per axis

    def with_channels(self, extra: list[tuple[str, np.ndarray, str, list[str]]]) -> "Log":
        """This log with channels computed after the run appended (not in the file):
        ``(name, values (n_cycles, width), unit or comma-separated units, column labels)``."""
        channels, units, widths, labels = dict(self.channels), dict(self.units), dict(self.widths), dict(self.labels)
        for name, a, unit, lab in extra:
            a = np.asarray(a, dtype=float)
            if a.shape != (self.n_cycles, len(lab)) or name in channels:
                raise ValueError(f"derived channel {name!r}: shape {a.shape} for {self.n_cycles} rows, "
                                 f"{len(lab)} labels, or the name is taken")
            channels[name], units[name], widths[name], labels[name] = a, unit, len(lab), list(lab)
        return replace(self, channels=channels, units=units, widths=widths, labels=labels)

    @property
    def n_cycles(self) -> int:
        return len(self.cycles)

    def get(self, name: str) -> np.ndarray | None:
        return self.channels.get(name)

    def problem_text(self) -> str | None:
        """All problems in one line, or None for a clean, complete log."""
        return "; ".join(self.problems) if self.problems else None

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


def _unpack_body(rec: dict):
    """The decoded ``body`` of a sealed record, or None if it is not a msgpack map."""
    try:
        b = msgpack.unpackb(rec["body"], raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - any decode failure
        return None
    return b if isinstance(b, dict) else None


def _crc_ok(rec: dict, run_id: str) -> bool:
    kind, seq, crc = rec.get("type"), rec.get("seq"), rec.get("crc")
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(crc, int):
        return False
    if kind == "block":
        first, n, data = rec.get("first"), rec.get("n"), rec.get("data")
        if not (isinstance(first, int) and isinstance(n, int) and isinstance(data, bytes)) or n < 1:
            return False
        return crc == _crc(kind, run_id, seq, _block_key(first, n), data)
    body = rec.get("body")
    return isinstance(kind, str) and isinstance(body, bytes) and crc == _crc(kind, run_id, seq, body)


def _check_header(rec, path: str) -> tuple[str, dict]:
    """The header record's run id and decoded body, checked."""
    if not isinstance(rec, dict) or rec.get("type") != "header" or rec.get("format") != FORMAT:
        raise LogFileError(f"{path}: not a pkrt log (no '{FORMAT}' header)")
    _check_version(rec.get("version"), path)
    run_id = rec.get("run_id")
    if not isinstance(run_id, str) or rec.get("seq") != 0 or not _crc_ok(rec, run_id):
        raise LogFileError(f"{path}: damaged pkrt log header (checksum mismatch)")
    body = _unpack_body(rec)
    ch = body.get("channels") if body else None
    if not _channels_ok(ch) or not isinstance(body.get("run"), dict) or body.get("byte_order", "<f8") != "<f8":
        raise LogFileError(f"{path}: damaged pkrt log header")
    if len({c[0] for c in ch}) != len(ch) or sum(c[1] for c in ch) > _MAX_WIDTH:
        raise LogFileError(f"{path}: damaged pkrt log header (duplicate channel names or an impossible width)")
    rate = body["run"].get("rate_hz")  # every reader divides or multiplies by it
    if rate is not None and not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and 1e-3 <= rate <= 1e6):
        raise LogFileError(f"{path}: damaged pkrt log header: rate_hz: expected a number in [1e-3, 1e6], got {excerpt(rate)}")
    return run_id, body


def _check_version(ver, path: str) -> None:
    """Refuse a header version other than ``VERSION`` (an older one with its own message)."""
    if isinstance(ver, int) and not isinstance(ver, bool) and 1 <= ver < VERSION:
        raise LogFileError(f"{path}: pkrt log version {ver} was written by an older pkrt and its records "
                           f"carry no checksums; this pkrt reads version {VERSION} only (record the run again)")
    if ver != VERSION:
        raise LogFileError(f"{path}: pkrt log version {ver!r} is not supported "
                           f"(this pkrt reads version {VERSION})")


def _channels_ok(ch) -> bool:
    """``ch`` is a list of [name, width >= 1, unit] channels."""
    return isinstance(ch, list) and all(
        isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and isinstance(c[1], int)
        and c[1] >= 1 and isinstance(c[2], str) for c in ch)


def _what(rec: dict) -> str:
    """A record named for a message: 'block of cycles 0..255', 'end record', ..."""
    kind = rec.get("type")
    if kind == "block" and isinstance(rec.get("first"), int) and isinstance(rec.get("n"), int):
        return f"block of cycles {rec['first']}..{rec['first'] + rec['n'] - 1}"
    return f"{kind} record" if isinstance(kind, str) else "record"


class _Reader:
    """The record-by-record checks of ``read_log``."""

    def __init__(self, path: str, run_id: str, width: int, size: int):
        self.path, self.run_id, self.width, self.size = path, run_id, width, size
        self.blocks: list[tuple[int, np.ndarray]] = []
        self.events: list[dict] = []
        self.end: dict | None = None
        self.end_body: dict | None = None
        self.problems: list[str] = []
        self.bad_blocks = self.bad_records = self.skipped = self.dropped_bytes = 0
        self.next_seq = 1
        self.bad_since = 0  # records with a bad CRC since the last good one
        self.next_cycle = 0  # first cycle a new block may start at
        self.truncated = False

    def drop_rest(self, pos: int, why: str) -> None:
        self.dropped_bytes = self.size - pos
        self.problems.append(f"{why} at byte {pos}: the rest of the file ({self.dropped_bytes} bytes) dropped")

    def skip(self, rec: dict, pos: int, why: str) -> None:
        self.skipped += 1
        self.problems.append(f"{_what(rec)} at byte {pos} skipped: {why}")

    def take(self, rec: dict, pos: int) -> bool:
        """Check and keep one record; False when reading must stop here."""
        kind = rec.get("type")
        if kind == "header":
            self.drop_rest(pos, "another log follows (concatenated)")
            return False
        if self.end is not None:
            self.drop_rest(pos, f"data after the end record ({_what(rec)})")
            return False
        if rec.get("run_id") != self.run_id:
            self.skip(rec, pos, "it belongs to another run")
            return True
        if not _crc_ok(rec, self.run_id):
            self.bad_since += 1
            if kind == "block":
                self.bad_blocks += 1
            else:
                self.bad_records += 1
                self.problems.append(f"{_what(rec)} at byte {pos} skipped: checksum mismatch")
            return True
        seq = rec["seq"]
        if seq < self.next_seq:
            self.skip(rec, pos, f"sequence number {seq} already read (a repeated record)")
            return True
        missing = seq - self.next_seq - self.bad_since  # records neither read nor found damaged
        if missing > 0:
            self.problems.append(f"{missing} record(s) missing before byte {pos} (sequence numbers "
                                 f"{self.next_seq}..{seq - 1} not all found)")
        self.next_seq, self.bad_since = seq + 1, 0
        if kind == "block":
            first, n, data = rec["first"], rec["n"], rec["data"]
            if len(data) != n * self.width * 8:
                self.bad_blocks += 1
            elif first < self.next_cycle:
                self.skip(rec, pos, f"overlaps cycles already read (up to {self.next_cycle - 1})")
            else:
                self.blocks.append((first, np.frombuffer(data, dtype="<f8").reshape(n, self.width)))
                self.next_cycle = first + n
            return True
        body = _unpack_body(rec)
        if body is None:
            self.bad_records += 1
            self.problems.append(f"{_what(rec)} at byte {pos} skipped: undecodable body")
        elif kind == "event":
            self.events.append({"cycle": body.get("cycle"), "kind": body.get("kind"),
                                "message": body.get("message"), "wall": body.get("wall")})
        elif kind == "end":
            self.end, self.end_body = rec, body
            self.check_end(body)
        else:
            self.skip(rec, pos, "unknown record type")
        return True

    def check_end(self, body: dict) -> None:
        """The end record's counts against what was read."""
        blocks, rows = body.get("blocks"), body.get("rows_written")
        read_rows = sum(len(b) for _, b in self.blocks)
        if isinstance(blocks, int) and blocks != len(self.blocks) + self.bad_blocks:
            self.problems.append(f"the end record counts {blocks} blocks, the file holds "
                                 f"{len(self.blocks) + self.bad_blocks}")
        elif isinstance(rows, int) and not self.bad_blocks and rows != read_rows:
            self.problems.append(f"the end record counts {rows} logged cycles, the blocks hold {read_rows}")


def read_log(path) -> Log:
    """Read a log (see the module docstring for what is tolerated and reported)."""
    path = str(path)
    expect(path, LOG, LogFileError)  # another kind of file: say what it is
    with _open_log(path) as f:
        size = os.fstat(f.fileno()).st_size
        unp = msgpack.Unpacker(f, raw=False, max_buffer_size=_MAX_RECORD, strict_map_key=False)
        try:
            head = unp.unpack()
        except Exception:  # noqa: BLE001 - any decode failure of the first record
            raise LogFileError(f"{path}: not a pkrt log (unreadable or empty)") from None
        run_id, body = _check_header(head, path)
        channels = [(c[0], c[1], c[2]) for c in body["channels"]]
        width = sum(w for _, w, _ in channels)
        r = _Reader(path, run_id, width, size)
        _read_records(unp, r)
    if r.bad_blocks:
        r.problems.insert(0, f"{r.bad_blocks} block(s) with a bad checksum skipped (their cycles are missing)")
    if r.end is None and not any("cut off" in p for p in r.problems):
        r.problems.append("no end record (run cut off): read to the last complete record")
    cycles, out = _columns(r.blocks, channels, width)
    header = dict(body["run"])
    for k, v in (("format", FORMAT), ("version", VERSION), ("run_id", run_id), ("created", body.get("created")),
                 ("software", body.get("software")), ("block_cycles", body.get("block_cycles"))):
        header.setdefault(k, v)
    events = sorted(r.events, key=lambda e: (e["cycle"] if isinstance(e["cycle"], int) else -1))
    end = r.end_body
    summary = end.get("summary") if end is not None else None
    dropped = _dropped_blocks(end)
    if dropped:
        r.problems.append(f"{dropped} block(s) dropped while writing (the writer fell behind)")
    return Log(path, header, out, {n: u for n, _, u in channels}, {n: w for n, w, _ in channels},
               cycles.astype(np.int64), events, summary if isinstance(summary, dict) else None,
               r.truncated or end is None, r.bad_blocks, dropped, end, r.problems,
               r.skipped + r.bad_records, r.dropped_bytes)


def _open_log(path: str):
    """The log file opened for binary reading; a missing file or a folder: ``LogFileError``."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise LogFileError(f"{path}: no such log file") from None
    except IsADirectoryError:
        raise LogFileError(f"{path}: is a directory, not a log file") from None


def _read_records(unp, r: _Reader) -> None:
    """Feed the records after the header to ``r`` until the end of the file, a record it
    refuses, or data that does not decode (the rest dropped and reported)."""
    while True:
        pos = unp.tell()
        try:
            rec = unp.unpack()
        except msgpack.OutOfData:
            if pos < r.size:
                r.truncated = True
                r.drop_rest(pos, "an incomplete record (file cut off)")
            return
        except Exception:  # noqa: BLE001 - undecodable record: stop here
            rec = None
        if not isinstance(rec, dict):
            r.truncated = True
            r.drop_rest(pos, "undecodable data")
            return
        if not r.take(rec, pos):
            return


def _columns(blocks: list[tuple[int, np.ndarray]], channels: list, width: int
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The cycle numbers of the rows read and each channel's column(s) (1-D for width 1)."""
    if blocks:
        data = np.concatenate([b for _, b in blocks]).astype(np.float64)
        cycles = np.concatenate([np.arange(f0, f0 + len(b)) for f0, b in blocks])
    else:
        data = np.zeros((0, width))
        cycles = np.zeros(0, dtype=np.int64)
    out: dict[str, np.ndarray] = {}
    c = 0
    for name, w, _ in channels:
        a = data[:, c:c + w]
        out[name] = np.ascontiguousarray(a[:, 0] if w == 1 else a)
        c += w
    return cycles, out


def _dropped_blocks(end: dict | None) -> int:
    """The blocks the writer dropped, as its end record counts them (0 without one)."""
    dropped = end.get("dropped_blocks", 0) if end is not None else 0
    return dropped if isinstance(dropped, int) and not isinstance(dropped, bool) else 0
