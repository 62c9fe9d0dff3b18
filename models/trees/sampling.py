"""Exact-model sampling over processes (local or a Dask cluster), parallel and deterministic."""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from pkrt.rt.core.errors import UserError

from ..kinematics.mechanism import Mechanism
from ..reduction.exact import ExactModel, output_layout
from .exact import CHUNK, _init_worker, _worker_chunk, eval_chunk


class SampleEvaluator:
    """Exact model over processes: ``evaluate(thetas)`` -> (F, sing). Use as a context
    manager; ``jobs=1`` runs in this process. ``scheduler``: on a Dask cluster instead
    (``daskeval.DaskPool``: a scheduler's address, or ``local`` for a LocalCluster of ``jobs``
    worker processes), same chunks, same results. Progress goes to a tqdm bar on stderr only
    when stderr is a terminal (or ``progress`` says otherwise)."""

    def __init__(self, mech: Mechanism, jobs: int | None = None, progress: bool | None = None,
                 desc: str = "exact model", scheduler: str | None = None):
        self.mech = mech
        cores = os.cpu_count() or 1
        # results do not depend on jobs: more processes than a few per core only cost forks
        self.jobs = max(1, min(jobs or cores, 4 * max(2, cores)))
        self.scheduler, self.dask_workers = scheduler, jobs
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.desc = desc
        self.pool: ProcessPoolExecutor | None = None
        self.dask = None  # daskeval.DaskPool
        self.model: ExactModel | None = None
        self.n_evaluated = 0

    def __enter__(self) -> "SampleEvaluator":
        if self.scheduler is not None:
            try:
                from .daskeval import DaskPool
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] not in ("dask", "distributed"):
                    raise
                raise UserError("--scheduler needs dask.distributed: pip install 'pkrt[dask]'") from None
            self.dask = DaskPool(self.mech, self.scheduler, self.dask_workers)
        elif self.jobs > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=ctx, initializer=_init_worker,
                                            initargs=(self.mech,))
        else:
            self.model = ExactModel(self.mech)
        return self

    def __exit__(self, *exc) -> None:
        if self.dask is not None:
            self.dask.close()
            self.dask = None
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def evaluate(self, thetas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """thetas (n, s), already in a spatially coherent order (warm starts follow it)."""
        thetas = np.asarray(thetas, float).reshape(-1, self.mech.n_act)
        n = len(thetas)
        chunks = [thetas[i:i + CHUNK] for i in range(0, n, CHUNK)]
        from tqdm import tqdm
        bar = tqdm(total=n, desc=self.desc, unit="pt", file=sys.stderr, disable=not self.progress,
                   leave=False)
        results: list = [None] * len(chunks)
        try:
            for k, r in self._completed(chunks):
                results[k] = r
                bar.update(len(chunks[k]))
        finally:
            bar.close()
        self.n_evaluated += n
        n_out = len(output_layout(self.mech.n_act))
        if not results:
            return np.zeros((0, n_out)), np.zeros(0)
        return (np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results]))

    def _completed(self, chunks: list[np.ndarray]):
        """(chunk index, eval_chunk result) per chunk, in completion order."""
        if self.dask is not None:
            yield from self.dask.run(chunks)
        elif self.pool is None:
            for k, c in enumerate(chunks):
                yield k, eval_chunk(self.model, c)
        else:
            from concurrent.futures import as_completed
            futures = {self.pool.submit(_worker_chunk, c): k for k, c in enumerate(chunks)}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()


def spatial_order(thetas: np.ndarray, lo: np.ndarray, hi: np.ndarray, cells: int = 8) -> np.ndarray:
    """A permutation visiting points cell by cell (cells per axis), so warm starts stay short."""
    u = (thetas - lo) / (hi - lo)
    cell = np.clip((u * cells).astype(int), 0, cells - 1)
    keys = [thetas[:, d] for d in reversed(range(thetas.shape[1]))]
    keys += [cell[:, d] for d in reversed(range(thetas.shape[1]))]
    return np.lexsort(keys)
