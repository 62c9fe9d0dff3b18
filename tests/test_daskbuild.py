"""Builds on a real dask.distributed cluster: a scheduler and two workers started as separate
processes on localhost, ``pkrt build --scheduler`` against them (same bytes as the single-
process build), a worker killed mid-build, and refused addresses."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from pkrt.models.kinematics.mechanism import load_mechanism  # noqa: E402

from pkrt.rt.bench.daskcluster import BIN, ProcessCluster, free_port  # noqa: E402

PKRT = [str(BIN / "pkrt")]
# the Orthoglide, 4^3 boxes: 1,325 exact samples and 1,501 for the verification, ~1 s of one core
MODEL, BUILD = "orthoglide", ["--kind", "boxes", "--boxes", "4", "--verify-samples", "300"]
# about a minute of batches, for the tests that act while batches run (BUILD's 4^3 boxes take
# 2.7 s in all: under load the scheduler's state, which the test watches, can come too late)
LONG_BUILD = [a if a != "4" else "8" for a in BUILD]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, client): `dask scheduler` and two `dask worker --nthreads 1` processes
    (under nannies)."""
    with ProcessCluster(2, tmp_path_factory.mktemp("dask-logs")) as c:
        yield c.address, c.client


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> bytes:
    """The single-process build (jobs=1) of the same tree."""
    path = tmp_path_factory.mktemp("ref") / "ref.pkt"
    r = subprocess.run(PKRT + ["build", MODEL, "-o", str(path), "--jobs", "1", *BUILD],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return path.read_bytes()


def _build(tmp_path: Path, *opts: str, **kw) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "tree.pkt"
    r = subprocess.run(PKRT + ["build", MODEL, "-o", str(out), *BUILD, *opts],
                       capture_output=True, text=True, timeout=180, **kw)
    return r, out


def test_cluster_build_same_bytes_as_single_process(cluster, reference, tmp_path):
    address, client = cluster
    r, out = _build(tmp_path, "--scheduler", address, "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no progress bar off a terminal, no dask log lines
    assert out.read_bytes() == reference
    # the model was unloaded from the workers when the build's client left
    loaded = client.run(lambda: list(importlib.import_module("pkrt.models.trees.daskeval")._mechs))
    assert len(loaded) == 2 and not any(loaded.values())


def test_batches_of_chunks_in_index_order(cluster):
    """The pool's own run: tasks of BATCH_CHUNKS chunks on both workers; the samples equal
    the in-process evaluation's."""
    import numpy as np

    from pkrt.models.trees.daskeval import BATCH_CHUNKS
    from pkrt.models.trees.sampling import CHUNK, SampleEvaluator

    address, client = cluster
    mech = load_mechanism("fivebar")
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    n_chunks = 8 * BATCH_CHUNKS + 1  # 4 tasks per worker thread: full batches
    th = lo + (hi - lo) * np.random.default_rng(1).random((CHUNK * n_chunks - 3, 2))
    with distributed.get_task_stream(client) as stream:
        with SampleEvaluator(mech, scheduler=address, progress=False) as ev:
            F, sing = ev.evaluate(th)
    tasks = [t for t in stream.data if str(t["key"]).startswith("run_batch")]
    assert len(tasks) == -(-n_chunks // BATCH_CHUNKS)
    assert len({t["worker"] for t in tasks}) == 2
    with SampleEvaluator(mech, jobs=1) as ev1:
        F1, sing1 = ev1.evaluate(th)
    assert np.array_equal(F, F1, equal_nan=True) and np.array_equal(sing, sing1)
    assert np.isfinite(F).all()


def test_worker_killed_mid_build_costs_its_batch(cluster, reference, tmp_path):
    """SIGKILL a worker while it runs a batch: the scheduler gives the batch to the other
    worker (the nanny restarts the killed one, which loads the model again)."""
    address, client = cluster
    killed: dict = {}

    def kill_busy_worker(proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            busy = [w for w, keys in client.processing().items()
                    if any(str(k).startswith("run_batch") for k in keys)]
            if busy:
                pid = client.run(os.getpid, workers=[busy[0]])[busy[0]]
                os.kill(pid, signal.SIGKILL)
                killed.update(worker=busy[0], pid=pid, tasks=len(client.processing()[busy[0]]))
                return
            time.sleep(0.01)

    out = tmp_path / "tree.pkt"
    proc = subprocess.Popen(PKRT + ["build", MODEL, "-o", str(out), *BUILD, "--scheduler", address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t = threading.Thread(target=kill_busy_worker, args=(proc,))
        t.start()
        stdout, stderr = proc.communicate(timeout=180)
        t.join()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed, "the build never had a batch processing on a worker"
    assert proc.returncode == 0, stderr
    assert out.read_bytes() == reference
    assert killed["worker"] not in client.scheduler_info()["workers"]
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it, for the tests that follow


def _main(capsys, tmp_path: Path, *opts: str) -> tuple[int, str, Path]:
    """``pkrt build`` in this process: exit code, stderr, the tree path."""
    from pkrt.rt.cli import main

    out = tmp_path / "tree.pkt"
    code = main(["build", "fivebar", "-o", str(out), "--kind", "boxes", "--boxes", "2", *opts])
    return code, capsys.readouterr().err, out


@pytest.mark.parametrize("address, message", [
    ("tcp://127.0.0.1:{free}", "cannot reach a Dask scheduler at tcp://127.0.0.1:{free}: "),
    ("127.0.0.1:{free}", "cannot reach a Dask scheduler at 127.0.0.1:{free}: "),
    ("tcp://no-such-host.invalid:8786", "unknown host 'no-such-host.invalid'"),
    ("tls://127.0.0.1:8786", "expected 'local' or tcp://HOST:PORT"),
    ("node1", "expected 'local' or tcp://HOST:PORT"),
    ("tcp://127.0.0.1:99999", "expected 'local' or tcp://HOST:PORT"),
])
def test_bad_scheduler_address_one_line_exit_2(capsys, tmp_path, address, message):
    free = free_port()
    address, message = address.format(free=free), message.format(free=free)
    code, err, out = _main(capsys, tmp_path, "--scheduler", address)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("pkrt: error: ")
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_not_a_scheduler_one_line_exit_2(capsys, tmp_path, monkeypatch):
    """Something else listens at the address (it answers with HTTP)."""
    import dask

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def answer() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi")
            c.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with dask.config.set({"distributed.comm.timeouts.connect": "3s"}):
            code, err, out = _main(capsys, tmp_path, "--scheduler",
                                   f"tcp://127.0.0.1:{srv.getsockname()[1]}")
    finally:
        stop.set()
        t.join()
        srv.close()
    assert code == 2, err
    assert err.count("\n") == 1 and "no Dask scheduler answered at" in err
    assert not out.exists()


def test_jobs_with_a_cluster_address_is_refused(cluster, capsys, tmp_path):
    address, _ = cluster
    code, err, _ = _main(capsys, tmp_path, "--scheduler", address, "--jobs", "2")
    assert code == 2 and "drop --jobs" in err and err.count("\n") == 1


def test_tree_verify_on_the_cluster_same_report(cluster, tmp_path):
    address, _ = cluster
    tree = tmp_path / "fivebar.pkt"
    r = subprocess.run(PKRT + ["build", "fivebar", "-o", str(tree), "--kind", "boxes", "--boxes", "4",
                               "--verify-samples", "0", "--jobs", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    reports = []
    for opts in (["--jobs", "1"], ["--scheduler", address]):
        r = subprocess.run(PKRT + ["tree", "verify", str(tree), "--samples", "500", "--json", *opts],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        reports.append(json.loads(r.stdout))
    assert reports[0] == reports[1]
    assert reports[0]["compared"] > 1500


def test_scheduler_lost_mid_build_one_line_exit_1(tmp_path):
    """SIGKILL the scheduler while batches run: after Dask's reconnection timeout (3 s here)
    the build stops with one line, exit 1, and writes no tree."""
    with ProcessCluster(1, tmp_path / "logs") as c:
        out = tmp_path / "tree.pkt"
        env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}
        proc = subprocess.Popen(PKRT + ["build", MODEL, "-o", str(out), *LONG_BUILD, "--scheduler", c.address],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 60
            while not any(str(k).startswith("run_batch") for keys in c.client.processing().values()
                          for k in keys):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.01)
            c.scheduler.kill()
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 1, stderr
    assert stderr.count("\n") == 1 and "lost the Dask scheduler at" in stderr, stderr
    assert "Traceback" not in stderr and not out.exists()


@pytest.mark.parametrize("what", ["versions", "content hash"])
def test_worker_that_differs_from_the_client_is_refused(cluster, what):
    """The plugin compares the worker's versions and its reading of the model with what the
    client sent; a batch on a worker that differs raises WorkerMismatch naming it."""
    from pkrt.models.trees.daskeval import NUMERICS, ModelPlugin, WorkerMismatch, run_batch
    from pkrt.rt.core.versions import software_versions

    address, client = cluster
    mech = load_mechanism("fivebar")
    raw = Path(mech.description.path).read_bytes()
    versions = software_versions(NUMERICS)
    content_hash = mech.content_hash
    if what == "versions":
        versions = {**versions, "numpy": "0.0.1"}
    else:
        content_hash = "0" * 64
    name = f"test-mismatch-{what.replace(' ', '-')}"
    client.register_plugin(ModelPlugin(name, raw, content_hash, versions), name=name)
    try:
        fut = client.submit(run_batch, name, [mech.theta_ref[None, :]], pure=False)
        with pytest.raises(WorkerMismatch, match=r"worker tcp://127\.0\.0\.1:\d+ ") as e:
            fut.result(timeout=60)
        assert ("numpy" in str(e.value) and "(client 0.0.1)" in str(e.value)) == (what == "versions")
        assert ("content hash" in str(e.value)) == (what == "content hash")
    finally:
        client.unregister_worker_plugin(name)
        fut.release()


def test_ctrl_c_cancels_the_batches(cluster, tmp_path):
    """SIGINT while batches run: exit 130, one line, and no pkrt task left on the scheduler."""
    address, client = cluster
    out = tmp_path / "tree.pkt"
    # Ctrl-C as at a terminal: a suite started in the background of a script (bash ignores
    # SIGINT in its asynchronous commands) passes SIG_IGN on, and Python then installs no handler
    proc = subprocess.Popen(PKRT + ["build", MODEL, "-o", str(out), *LONG_BUILD, "--scheduler", address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not any(str(k).startswith("run_batch") for keys in client.processing().values()
                      for k in keys):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and stderr == "pkrt: interrupted\n", stderr
    assert not out.exists()

    def pkrt_tasks(dask_scheduler) -> int:
        """Batches still wanted (queued, running or held); other tests' erred ones aside."""
        return sum(1 for k, ts in dask_scheduler.tasks.items()
                   if str(k).startswith("run_batch") and ts.state != "erred")

    deadline = time.monotonic() + 20
    while client.run_on_scheduler(pkrt_tasks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.run_on_scheduler(pkrt_tasks) == 0


def test_without_dask_installed_one_line_exit_2(capsys, tmp_path, monkeypatch):
    """Where dask.distributed cannot be imported, --scheduler says what to install."""
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "pkrt.models.trees.daskeval", raising=False)
    code, err, out = _main(capsys, tmp_path, "--scheduler", "local")
    assert code == 2 and err == "pkrt: error: --scheduler needs dask.distributed: pip install 'pkrt[dask]'\n"
    assert not out.exists()
