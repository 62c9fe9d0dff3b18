"""`pkrt tree plot`: the series it draws against the exact model, and the image itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.reduction.exact import ExactModel
from pkrt.models.trees.build import build_tree
from pkrt.models.trees.settings import BuildSettings
from pkrt.models.trees.plot import PLOT_SIZE_PX, plot_data, slice_planes
from pkrt.rt.cli import main
from pkrt.rt.core.tree import eval_outputs
from pkrt.rt.core.treefile import save_tree

MACHINES = Path(__file__).resolve().parent.parent / "models" / "machines"


@pytest.fixture(scope="module")
def orthoglide():
    return load_mechanism("orthoglide")


@pytest.fixture(scope="module")
def tree2(orthoglide, tmp_path_factory):
    tree, _ = build_tree(orthoglide, BuildSettings(boxes=2, verify_samples=0), jobs=2, progress=False)
    path = tmp_path_factory.mktemp("plot") / "o2.tree"
    save_tree(tree, path)
    return tree, path


@pytest.fixture(scope="module")
def data(tree2, orthoglide):
    return plot_data(tree2[0], orthoglide, points=21, grid=7, jobs=2, progress=False)


def test_diagonal_series_is_the_exact_model_and_the_tree(data, tree2, orthoglide):
    tree = tree2[0]
    d, scale = data["diagonal"], data["scale"]
    assert np.all(scale >= np.array(tree.header["output_scale"]))
    assert np.all(np.abs(d["exact"]).max(axis=0) <= scale)
    exact = ExactModel(orthoglide)
    f = np.empty(len(scale))
    for k in (0, 7, 10, 20):
        th = tree.lo + d["t"][k] * (tree.hi - tree.lo)
        assert np.array_equal(d["theta"][k], th)
        assert np.max(np.abs(d["exact"][k] - exact.outputs(th)) / scale) < 1e-9
        eval_outputs(tree.arrays, th, f)
        assert np.array_equal(d["tree"][k], f)
    assert np.allclose(d["rel"], np.abs(d["tree"] - d["exact"]) / scale, rtol=1e-12, atol=0)
    assert d["t"][0] == 0 and d["t"][-1] == 1 and len(d["t"]) == 21


def test_error_maps_are_the_largest_error_over_outputs(data, tree2, orthoglide):
    tree = tree2[0]
    sl = data["slices"]
    assert [s["label"] for s in sl] == ["near the lower corner", "through the centre",
                                       "near the upper corner"]
    assert sl[1]["fixed"][0] == pytest.approx((tree.lo[2] + tree.hi[2]) / 2)
    assert tree.lo[2] < sl[0]["fixed"][0] < sl[1]["fixed"][0] < sl[2]["fixed"][0] < tree.hi[2]
    exact = ExactModel(orthoglide)
    f = np.empty(len(data["scale"]))
    for s in sl:
        assert s["err"].shape == (7, 7) and np.all(np.isfinite(s["err"]))
        for iy, ix in ((0, 0), (3, 5), (6, 6)):
            th = np.array([s["x"][ix], s["y"][iy], s["fixed"][0]])
            eval_outputs(tree.arrays, th, f)
            want = np.max(np.abs(f - exact.outputs(th)) / data["scale"])
            assert s["err"][iy, ix] == pytest.approx(want, rel=1e-6)


def test_slices_for_one_and_two_actuators():
    from pkrt.rt.core.treefile import load_tree
    assert slice_planes(load_tree(MACHINES / "fourbar.pkt")) == []
    two = slice_planes(load_tree(MACHINES / "fivebar.pkt"))
    assert len(two) == 1 and two[0]["fixed"].size == 0


def _png(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == PLOT_SIZE_PX
        return np.asarray(im.convert("L"), float)


def test_cli_plot_writes_the_figure(tree2, data, tmp_path, capsys):
    tree, path = tree2
    out = tmp_path / "o2.png"
    assert main(["tree", "plot", str(path), "-o", str(out), "--points", "21", "--grid", "7",
                 "--jobs", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    px = _png(out)
    assert px.std() > 10  # not blank
    assert r["png"] == str(out) and r["size_px"] == list(PLOT_SIZE_PX)
    assert r["diagonal_max_rel_coef_error"] == pytest.approx(np.nanmax(data["diagonal"]["rel"]), rel=1e-9)
    assert [s["max_rel_coef_error"] for s in r["slices"]] == pytest.approx(
        [np.nanmax(s["err"]) for s in data["slices"]], rel=1e-9)
    # one actuator: the coefficient panels and the error along the range, no maps
    fb = tmp_path / "fourbar.png"
    assert main(["tree", "plot", str(MACHINES / "fourbar.pkt"), "-o", str(fb), "--points", "41",
                 "--jobs", "1"]) == 0
    assert "wrote" in capsys.readouterr().out and _png(fb).std() > 10


def test_cli_plot_refuses_to_overwrite_inputs(tree2, tmp_path, capsys):
    _, path = tree2
    copy = tmp_path / "copy.tree"
    shutil.copy(path, copy)
    for out, text in ((copy, "is a pkrt tree file"), (tmp_path / "no" / "x.png", "folder does not exist"),
                      (tmp_path, "is a folder")):
        assert main(["tree", "plot", str(path), "-o", str(out), "--jobs", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("pkrt: error: ") and text in err and len(err.strip().splitlines()) == 1
    assert copy.read_bytes() == path.read_bytes()
    assert main(["tree", "plot", str(MACHINES / "fourbar.toml"), "-o", str(tmp_path / "p.png")]) == 2
    assert "expected a pkrt tree file" in capsys.readouterr().err
