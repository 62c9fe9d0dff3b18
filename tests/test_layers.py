"""The layers of design.md ("Layout") hold: the import-linter contracts in .importlinter pass,
every runtime module is placed in a layer, ``pkrt run`` on the simulated plant loads no
``pkrt.models`` module, and ``pkrt bench`` runs from a wheel installed outside the source tree."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rt", "models", "drivers", "hil")


def _contracts() -> configparser.ConfigParser:
    c = configparser.ConfigParser()
    c.read(ROOT / ".importlinter")
    return c


def _modules(c: configparser.ConfigParser, contract: str, key: str) -> set[str]:
    return set(c[f"importlinter:contract:{contract}"][key].split())


def test_import_contracts_pass(tmp_path):
    # grimp scans a package on disk; the editable install maps pkrt.* to four folders, so
    # lay them out as one package (symbolic links) the way a wheel installs them
    (tmp_path / "pkrt").mkdir()
    for name in PACKAGES:
        (tmp_path / "pkrt" / name).symlink_to(ROOT / name)
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), str(ROOT / ".importlinter"), "--no-cache"], cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    n = len([s for s in _contracts().sections() if s.startswith("importlinter:contract:")])
    assert f"Contracts: {n} kept, 0 broken." in r.stdout


def test_every_rt_module_has_a_layer():
    """A module's layer is its folder: rt/ holds only layer folders, each one in the layers
    contract; no benchmark imports the CLI (bench is the layer below the CLI)."""
    c = _contracts()
    layers = c["importlinter:contract:layers"]["layers"].split()
    listed = {x for x in layers if x != "|"}
    loose = [p.name for p in (ROOT / "rt").glob("*.py") if p.stem != "__init__"]
    assert not loose, f"modules of rt/ outside a layer folder: {loose}"
    folders = {f"pkrt.rt.{p.parent.name}" for p in (ROOT / "rt").glob("*/__init__.py")}
    assert folders <= listed, f"place the new folder in the layers contract: {sorted(folders - listed)}"
    assert layers.index("pkrt.rt.cli") < layers.index("pkrt.rt.bench") < layers.index("pkrt.rt.app")


def test_every_models_module_has_a_layer():
    """models/ holds sub-package folders only (and the data folder machines/), each one in the
    models' own layers contract."""
    layers = _contracts()["importlinter:contract:models-layers"]["layers"].split()
    listed = {x for x in layers if x != "|"}
    loose = [p.name for p in (ROOT / "models").glob("*.py") if p.stem != "__init__"]
    assert not loose, f"modules of models/ outside a domain folder: {loose}"
    folders = {f"pkrt.models.{p.parent.name}" for p in (ROOT / "models").glob("*/__init__.py")}
    assert folders == listed, f"models' layers contract vs folders: {sorted(folders ^ listed)}"
    assert not (ROOT / "models" / "machines" / "__init__.py").exists()  # data, not code


def test_every_runtime_module_has_a_layer():
    """rt/runtime/ holds sub-package folders only, each one in the runtime's own layers contract."""
    layers = _contracts()["importlinter:contract:runtime-layers"]["layers"].split()
    listed = {x for x in layers if x != "|"}
    loose = [p.name for p in (ROOT / "rt" / "runtime").glob("*.py") if p.stem != "__init__"]
    assert not loose, f"modules of rt/runtime/ outside a domain folder: {loose}"
    folders = {f"pkrt.rt.runtime.{p.parent.name}" for p in (ROOT / "rt" / "runtime").glob("*/__init__.py")}
    assert folders == listed, f"runtime's layers contract vs folders: {sorted(folders ^ listed)}"


PROBE = """
import sys
from pkrt.rt.cli import main
code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.startswith("pkrt."))
print(json.dumps({"code": code, "loaded": loaded}))
"""


def test_run_on_the_simulated_plant_imports_no_models(tmp_path):
    """A run of actuator values loads no model; the demo (and a task-space CSV) is planned from
    the model in the CLI layer before the run, so that run does load pkrt.models."""
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree, tree_axes

    axes, _ = tree_axes(load_controller_tree(load_machine("orthoglide")))
    traj = tmp_path / "q.csv"
    traj.write_text("t," + ",".join(axes) + "\n0,-0.1,-0.1,-0.1\n0.5,-0.08,-0.1,-0.1\n1.0,-0.1,-0.1,-0.1\n")
    for extra, models in ((["--traj", str(traj)], False), ([], True)):
        r = subprocess.run([sys.executable, "-c", "import json\n" + PROBE, "run", "--lockstep", "--no-log",
                            "--duration", "0.2", "--json", *extra], capture_output=True, text=True, timeout=600,
                           cwd=ROOT)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["code"] == 0, r.stderr
        assert "pkrt.rt.runtime.machine.run" in out["loaded"] and "pkrt.drivers.sim" in out["loaded"]  # it did run
        loaded = [m for m in out["loaded"] if m.startswith("pkrt.models")]
        assert (loaded != []) == models, loaded


def test_model_verbs_do_import_models():
    """The probe sees imports: an offline verb loads pkrt.models."""
    r = subprocess.run([sys.executable, "-c", "import json\n" + PROBE, "model", "check", "fourbar", "--json"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["code"] == 0, r.stderr
    assert "pkrt.models.kinematics.mechanism" in out["loaded"]


@pytest.mark.slow
def test_bench_runs_from_a_wheel_outside_the_source_tree(tmp_path):
    src = tmp_path / "src"  # a copy, so that the build leaves nothing in the source tree
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
                   check=True, capture_output=True, timeout=600, cwd=tmp_path)
    (wheel,) = wheels.glob("pkrt-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=600)
    site = next(venv.glob("lib/python*/site-packages"))
    # the dependencies come from this venv's site-packages (a plain path: its .pth files, and so
    # the editable pkrt, are not processed); pkrt itself only from the wheel
    deps = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (site / "deps.pth").write_text(f"{deps}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=600, cwd=tmp_path)
    py = str(venv / "bin" / "python")
    where = subprocess.run([py, "-c", "import pkrt.rt.bench; print(pkrt.rt.bench.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv)
    r = subprocess.run([str(venv / "bin" / "pkrt"), "bench", "--only", "reduction", "--json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    red = json.loads(r.stdout)["reduction"]
    assert set(red["machines"]) >= {"fourbar", "orthoglide"}
    assert all(m["p50_ms"] > 0 for m in red["machines"].values())
