"""Exact-model sampling on a Dask cluster: the ``--scheduler`` backend of ``SampleEvaluator``.

``DaskPool`` runs the same chunks as the process pool (``exact.CHUNK`` points each, every
chunk from the reference assembly, warm starts in spatial order inside it), grouped into
batches of up to ``BATCH_CHUNKS`` chunks per task, and hands each chunk's result back with its
index, so the samples -- and the tree -- are the same bytes whatever the scheduler, the
number of workers and which worker ran what (on hosts with the same software and CPUs).

The model file's bytes travel once per worker, in a ``WorkerPlugin`` that compiles the
Mechanism there (workers that join later, or replace a lost one, get it too); each worker
thread keeps its own ExactModel (warm-start state). A lost worker costs its batches: the
scheduler gives them to other workers, up to ``distributed.scheduler.allowed-failures``
times per batch; a batch that raises is retried ``RETRIES`` times.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import sys
import threading
import uuid
from pathlib import Path

import dask
import distributed
import numpy as np
from distributed import as_completed
from distributed.client import FutureCancelledError

from pkrt.rt.core.errors import Fault, UserError
from pkrt.rt.core.versions import software_versions

from ..kinematics.mechanism import Mechanism, load_mechanism
from ..reduction.exact import ExactModel
from .exact import eval_chunk

LOCAL = "local"  # --scheduler local: a LocalCluster of processes on this machine
BATCH_CHUNKS = 16  # chunks per task at most (384 points: ~0.15 s of the Orthoglide's model)
TASKS_PER_THREAD = 4  # fewer chunks per task when a call would give a worker thread fewer tasks
RETRIES = 2  # resubmissions of a batch that raised on a worker
NUMERICS = ("pkrt", "numpy", "scipy", "numba")  # versions that must match the client's


class WorkerMismatch(RuntimeError):
    """A worker's pkrt or numerical libraries differ from the client's, or it cannot load
    the model (raised in the task, reported by the client as a usage error)."""


# -- on the workers ------------------------------------------------------------------------------

_mechs: dict[str, Mechanism | str] = {}  # plugin name -> Mechanism, or why it is missing
_local = threading.local()  # per worker thread: plugin name -> ExactModel


def _mechanism_from_bytes(name: str, model_bytes: bytes, directory: str) -> Mechanism:
    """Compile a model from its file's bytes (the loader reads files: one in ``directory``
    for the time of the loading)."""
    path = Path(directory) / f"{name}.toml"
    path.write_bytes(model_bytes)
    try:
        return load_mechanism(str(path))
    finally:
        path.unlink(missing_ok=True)


class ModelPlugin(distributed.WorkerPlugin):
    """Compiles the model on each worker from the file's bytes and checks the worker's versions
    and the model's content hash against the client's."""

    idempotent = False

    def __init__(self, name: str, model_bytes: bytes, content_hash: str, versions: dict):
        self.name, self.model_bytes, self.content_hash, self.versions = name, model_bytes, content_hash, versions

    def setup(self, worker) -> None:
        mine = software_versions(NUMERICS)
        if mine != self.versions:
            diff = ", ".join(f"{k} {mine.get(k)} (client {v})" for k, v in self.versions.items()
                             if mine.get(k) != v)
            _mechs[self.name] = f"worker {worker.address} has {diff}: install the same versions"
            return
        try:
            mech = _mechanism_from_bytes(self.name, self.model_bytes, worker.local_directory)
        except Exception as e:  # noqa: BLE001 -- reported to the client by every task
            _mechs[self.name] = f"worker {worker.address} cannot load the model: {e}"
            return
        if mech.content_hash != self.content_hash:
            _mechs[self.name] = (f"worker {worker.address} reads the model with another content "
                                 f"hash: install the same pkrt version")
            return
        _mechs[self.name] = mech

    def teardown(self, worker) -> None:
        _mechs.pop(self.name, None)


def run_batch(name: str, chunks: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Task: ``eval_chunk`` on each chunk, in order, with this thread's ExactModel."""
    mech = _mechs.get(name)
    if not isinstance(mech, Mechanism):
        raise WorkerMismatch(mech or f"the model is not loaded on this worker (plugin {name})")
    if not hasattr(_local, "models"):
        _local.models = {}
    models = _local.models
    if name not in models:
        models[name] = ExactModel(mech)
    return [eval_chunk(models[name], c) for c in chunks]


# -- on the client -------------------------------------------------------------------------------

def check_address(address: str) -> tuple[str, int]:
    """(host, port) of ``tcp://HOST:PORT`` or ``HOST:PORT``; refuses other schemes."""
    scheme, loc = address.split("://", 1) if "://" in address else ("tcp", address)
    host, _, port = loc.rpartition(":")
    if scheme != "tcp" or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--scheduler: expected '{LOCAL}' or tcp://HOST:PORT (e.g. "
                        f"tcp://node1:8786), got '{address}'")
    return host.strip("[]"), int(port)


def _probe(address: str, timeout: float) -> None:
    """One TCP connection to the scheduler's port, so that a wrong address fails fast with
    one line (the Dask client retries refused connections until its timeout)."""
    host, port = check_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror:
        raise UserError(f"cannot reach a Dask scheduler at {address}: unknown host '{host}'") from None
    except (TimeoutError, socket.timeout):
        raise UserError(f"cannot reach a Dask scheduler at {address}: no answer within "
                        f"{timeout:g} s") from None
    except OSError as e:
        raise UserError(f"cannot reach a Dask scheduler at {address}: "
                        f"{e.strerror or e}") from None


def _quiet_dask_logs() -> dict[str, int]:
    """Silence Dask's client-side logs (reconnection attempts, tracebacks on stderr): pkrt
    reports a failure in one line. Returns the previous levels."""
    names = ("distributed", "distributed.client", "distributed.gc", "tornado", "tornado.application")
    old = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.CRITICAL + 1)
    return old


class DaskPool:
    """A connection to a Dask scheduler (or a LocalCluster it starts) with the model loaded on
    every worker. ``workers``: LocalCluster size (``local`` only; default: the cores)."""

    def __init__(self, mech: Mechanism, scheduler: str, workers: int | None = None):
        from dask.utils import parse_timedelta

        if scheduler != LOCAL:
            check_address(scheduler)
            if workers is not None:
                raise UserError(f"--jobs sets the local worker count; the cluster at {scheduler} "
                                f"has its own workers (drop --jobs)")
        self.address = scheduler
        raw = Path(mech.description.path).read_bytes()
        self.name = f"pkrt-model-{hashlib.sha256(raw).hexdigest()[:16]}-{uuid.uuid4().hex[:8]}"
        self.log_levels = _quiet_dask_logs()
        self.cluster = None
        self.client = None
        timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
        try:
            if scheduler == LOCAL:
                self.cluster = distributed.LocalCluster(
                    n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                    processes=True, dashboard_address=":0", silence_logs=logging.ERROR)
                self.client = distributed.Client(self.cluster)
                self.address = self.cluster.scheduler_address
            else:
                _probe(scheduler, timeout)
                try:
                    self.client = distributed.Client(scheduler, timeout=timeout)
                except Exception as e:  # noqa: BLE001 -- whatever answered is not a scheduler
                    raise UserError(f"no Dask scheduler answered at {scheduler} "
                                    f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                                    ) from None
            self.client.register_plugin(ModelPlugin(self.name, raw, mech.content_hash,
                                                    software_versions(NUMERICS)), name=self.name)
        except BaseException:
            self.close()
            raise
        if not self.client.nthreads():
            print(f"pkrt: no workers at {scheduler} yet; the batches wait for them (Ctrl-C stops)",
                  file=sys.stderr)

    def threads(self) -> int:
        return max(1, sum(self.client.nthreads().values()))

    def run(self, chunks: list[np.ndarray]):
        """Yield (chunk index, (F, sing)) in completion order."""
        futures: dict = {}
        try:
            per = max(1, min(BATCH_CHUNKS, math.ceil(len(chunks) / (TASKS_PER_THREAD * self.threads()))))
            for k in range(0, len(chunks), per):
                fut = self.client.submit(run_batch, self.name, chunks[k:k + per], retries=RETRIES,
                                         pure=False)
                futures[fut] = k
            for fut in as_completed(futures):
                results = fut.result()
                for j, r in enumerate(results):
                    yield futures[fut] + j, r
        except WorkerMismatch as e:
            self._cancel(futures)
            raise UserError(str(e)) from None
        except distributed.KilledWorker:
            self._cancel(futures)
            limit = dask.config.get("distributed.scheduler.allowed-failures")
            raise Fault(f"the Dask cluster at {self.address}: workers died running the same batch "
                        f"more than {limit} times (distributed.scheduler.allowed-failures)") from None
        except (FutureCancelledError, distributed.CancelledError, OSError) as e:
            raise Fault(f"lost the Dask scheduler at {self.address} while sampling the model "
                        f"({type(e).__name__})") from None
        except BaseException:  # Ctrl-C, or the caller stopped reading
            self._cancel(futures)
            raise

    def _cancel(self, futures) -> None:
        try:
            self.client.cancel(list(futures), force=True)
        except Exception:  # noqa: BLE001 -- the scheduler may be gone
            pass

    def close(self) -> None:
        """Unload the model from the workers, leave the scheduler (stop a LocalCluster); quiet
        when the cluster is gone already."""
        if self.client is not None:
            for step in (lambda: self.client.unregister_worker_plugin(self.name), self.client.close):
                try:
                    step()
                except Exception:  # noqa: BLE001 -- the cluster may be gone already
                    pass
            self.client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
        for name, level in self.log_levels.items():
            logging.getLogger(name).setLevel(level)


__all__ = ["DaskPool", "ModelPlugin", "run_batch", "check_address", "WorkerMismatch", "LOCAL",
           "BATCH_CHUNKS"]
