"""The exact reduced model at chunks of states, in this process or in a pool's worker process.

Points are cut into fixed chunks (``CHUNK``) that do not depend on the number of processes, and
every chunk starts its ExactModel from the reference assembly, so the results are bit-identical
whatever the number of processes (local or Dask workers: ``sampling``, ``daskeval``).
"""

from __future__ import annotations

import numpy as np

from ..kinematics.mechanism import AssemblyError, Mechanism
from ..reduction.exact import ExactModel, flatten_outputs, output_layout

MAX_SAMPLES = 10 ** 7  # verification states (memory: about 100 bytes per state and output)
CHUNK = 24  # points per chunk; fixed so results do not depend on the process count

_worker_model: ExactModel | None = None


def _init_worker(mech: Mechanism) -> None:
    global _worker_model
    _worker_model = ExactModel(mech)


def eval_chunk(model: ExactModel, thetas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact flat outputs (n, n_out) and singularity measures (n,) at thetas, in order,
    starting from the reference assembly. A point that cannot be assembled gets NaN outputs
    and a measure of 0."""
    mech = model.mech
    s = mech.n_act
    n_out = len(output_layout(s))
    F = np.full((len(thetas), n_out), np.nan)
    sing = np.zeros(len(thetas))
    model.assembler.reset()
    for i, th in enumerate(thetas):
        try:
            r = model(th)
            f = flatten_outputs(r.H, r.D, r.p_ext)
            sg = mech.singularity_measure(r.config, th)
        except (AssemblyError, np.linalg.LinAlgError):
            continue
        if np.all(np.isfinite(f)):
            F[i], sing[i] = f, sg
    return F, sing


def _worker_chunk(thetas: np.ndarray):
    return eval_chunk(_worker_model, thetas)
