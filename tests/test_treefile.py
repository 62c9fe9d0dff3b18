"""Tree file format: round trip, deterministic bytes, and one clear error for every bad file."""

from __future__ import annotations

import dataclasses
import hashlib

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkrt.rt.cli import main
from pkrt.rt.core.tree import OUT_OF_DOMAIN, SPLINE_FAST, Tree, eval_outputs, eval_tau, n_basis, n_outputs
from pkrt.rt.core.treefile import (TreeFileError, check_tree_matches_model, load_tree, save_tree,
                              tree_bytes, tree_from_bytes)


def small_tree(ok=(1, 1, 1)) -> Tree:
    """s = 2 on [0, 1] x [-1, 1]: root splits axis 0 at 0.5, its upper child axis 1 at 0."""
    s = 2
    lo, hi = np.array([0.0, -1.0]), np.array([1.0, 1.0])
    node_dim = np.array([0, -1, 1, -1, -1], dtype=np.int32)
    node_split = np.array([0.5, 0.0, 0.0, 0.0, 0.0])
    node_child = np.array([[1, 2], [0, 0], [3, 4], [1, 0], [2, 0]], dtype=np.int32)
    leaf_box = np.array([[[0.0, -1.0], [0.5, 1.0]],
                         [[0.5, -1.0], [1.0, 0.0]],
                         [[0.5, 0.0], [1.0, 1.0]]])
    rng = np.random.default_rng(0)
    coef = rng.normal(size=(3, n_outputs(s), n_basis(s)))
    header = {
        "model": {"name": "test", "content_hash": "ab" * 32},
        "actuators": {"names": ["a", "b"], "units": ["rad", "m"], "ranges": [[0.0, 1.0], [-1.0, 1.0]]},
        "outputs": [f"f{i}" for i in range(n_outputs(s))],
        "output_scale": [1.0] * n_outputs(s),
        "build": {"mode": "test"}, "verification": {},
    }
    return Tree(lo, hi, node_dim, node_split, node_child, leaf_box,
                np.array(ok, dtype=np.uint8), coef, header=header)


def repack(tree_or_payload, mutate=None, outer_mutate=None) -> bytes:
    """File bytes with a valid checksum after mutating the decoded payload (or outer map)."""
    data = tree_bytes(tree_or_payload)
    outer = msgpack.unpackb(data, raw=False)
    body = msgpack.unpackb(outer["payload"], raw=False)
    if mutate:
        mutate(body)
    outer["payload"] = msgpack.packb(body, use_bin_type=True)
    outer["checksum"] = hashlib.sha256(outer["payload"]).hexdigest()
    if outer_mutate:
        outer_mutate(outer)
    return msgpack.packb(outer, use_bin_type=True)


def set_array(name, arr):
    def f(body):
        a = np.asarray(arr)
        body["arrays"][name]["data"] = a.tobytes()
        body["arrays"][name]["shape"] = list(a.shape)
    return f


def test_round_trip_and_deterministic_bytes(tmp_path):
    t = small_tree()
    p = tmp_path / "t.pkt"
    save_tree(t, p)
    u = load_tree(p)
    assert t.kind == u.kind == t.arrays[0]
    for a, b in zip(t.arrays[1:SPLINE_FAST], u.arrays[1:SPLINE_FAST]):  # exact: storage, no arithmetic
        assert a.dtype == b.dtype and a.ndim == b.ndim and np.array_equal(a, b)
    assert u.header == t.header
    # same inputs, same bytes, whatever the header's key order
    h2 = dict(reversed(list(t.header.items())))
    t2 = dataclasses.replace(t, header=h2)
    assert tree_bytes(t2) == p.read_bytes() == tree_bytes(u)


def test_loaded_tree_evaluates_like_the_original():
    t = small_tree(ok=(1, 0, 1))
    u = tree_from_bytes(tree_bytes(t))
    f1, f2 = np.empty(n_outputs(2)), np.empty(n_outputs(2))
    for th in ([0.2, 0.3], [0.7, -0.5], [0.7, 0.5]):
        s1 = eval_outputs(t.arrays, np.array(th), f1)
        s2 = eval_outputs(u.arrays, np.array(th), f2)
        assert s1 == s2 and np.array_equal(f1, f2)  # exact: same arrays, same kernel, one process
    assert eval_outputs(u.arrays, np.array([0.7, -0.5]), f1) == OUT_OF_DOMAIN


@pytest.mark.parametrize("mutate, message", [
    (set_array("node_child", np.array([[1, 2], [0, 0], [3, 9], [1, 0], [2, 0]], np.int32)), "child 9"),
    (set_array("node_child", np.array([[1, 2], [0, 0], [3, 0], [1, 0], [2, 0]], np.int32)), "outside 1.."),
    (set_array("node_child", np.array([[1, 2], [0, 0], [2, 4], [1, 0], [2, 0]], np.int32)), "reached twice"),
    (set_array("node_child", np.array([[1, 2], [0, 0], [3, 4], [1, 0], [7, 0]], np.int32)), "leaf 7"),
    (set_array("node_child", np.array([[1, 2], [0, 0], [3, 4], [1, 0], [1, 0]], np.int32)), "two nodes"),
    (set_array("node_dim", np.array([0, -1, 5, -1, -1], np.int32)), "dimension 5"),
    (set_array("node_split", np.array([1.5, 0, 0, 0, 0.0])), "not strictly inside"),
    (set_array("node_split", np.array([np.nan, 0, 0, 0, 0.0])), "not strictly inside"),
    (set_array("leaf_box", np.array([[[0.0, -1.0], [0.5, 1.0]], [[0.5, -1.0], [1.0, 0.0]],
                                     [[0.5, 0.0], [1.0, 2.0]]])), "box differs"),
    (set_array("leaf_ok", np.array([1, 2, 1], np.uint8)), "0 or 1"),
    (set_array("lo", np.array([0.0, 1.0])), "lo < hi"),
    (set_array("coef", np.zeros((3, 12, 6))), "coef has shape"),
    (set_array("node_split", np.zeros(4)), "disagree"),
])
def test_inconsistent_arrays_are_refused(mutate, message):
    with pytest.raises(TreeFileError, match=message):
        tree_from_bytes(repack(small_tree(), mutate))


def test_non_finite_coefficients_only_allowed_out_of_domain():
    t = small_tree(ok=(1, 0, 1))
    t.coef[1, 0, 0] = np.nan
    tree_from_bytes(tree_bytes(t))  # leaf 1 is out of domain: fine
    t.coef[2, 3, 1] = np.inf
    with pytest.raises(TreeFileError, match="leaf 2 is marked in domain"):
        tree_from_bytes(tree_bytes(t))


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b["arrays"]["coef"].update(dtype="<f4"), "dtype"),
    (lambda b: b["arrays"]["coef"].update(data=b["arrays"]["coef"]["data"][:-8]), "bytes"),
    (lambda b: b["arrays"].pop("leaf_ok"), "arrays"),
    (lambda b: b["header"]["model"].pop("content_hash"), "model"),
    (lambda b: b["header"]["actuators"].update(names=["a"]), "names"),
    (lambda b: b["header"]["actuators"].update(ranges=[[0.0, 1.0], [-1.0, 2.0]]), "ranges"),
    (lambda b: b["header"].update(output_scale=[0.0] * 14), "output_scale"),
    (lambda b: b["header"].update(outputs=["x"]), "outputs"),
])
def test_bad_payload_fields_are_refused(mutate, message):
    with pytest.raises(TreeFileError, match=message):
        tree_from_bytes(repack(small_tree(), mutate))


def test_format_version_checksum_and_truncation():
    good = tree_bytes(small_tree())
    with pytest.raises(TreeFileError, match="format 'other'"):
        tree_from_bytes(repack(small_tree(), outer_mutate=lambda o: o.update(format="other")))
    with pytest.raises(TreeFileError, match="version 3 is not supported"):
        tree_from_bytes(repack(small_tree(), outer_mutate=lambda o: o.update(version=3)))
    with pytest.raises(TreeFileError, match="version 1 is not supported.*rebuild the tree"):
        tree_from_bytes(repack(small_tree(), outer_mutate=lambda o: o.update(version=1)))
    with pytest.raises(TreeFileError, match="checksum mismatch"):
        tree_from_bytes(repack(small_tree(), outer_mutate=lambda o: o.update(checksum="0" * 64)))
    with pytest.raises(TreeFileError, match="not a complete msgpack"):
        tree_from_bytes(good[:len(good) // 2])
    with pytest.raises(TreeFileError, match="not a pkrt tree"):
        tree_from_bytes(msgpack.packb([1, 2, 3]))
    with pytest.raises(TreeFileError, match="extension type"):
        tree_from_bytes(msgpack.packb({"format": msgpack.ExtType(5, b"x")}))


def test_wrong_model_hash():
    t = small_tree()
    check_tree_matches_model(t, "ab" * 32)
    with pytest.raises(TreeFileError, match="rebuild the tree"):
        check_tree_matches_model(t, "cd" * 32)


def test_cli_reports_bad_file_with_exit_2(tmp_path, capsys):
    p = tmp_path / "bad.pkt"
    p.write_bytes(tree_bytes(small_tree())[:-5])
    assert main(["tree", "info", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert main(["tree", "info", str(tmp_path / "missing.pkt")]) == 2


GOOD = tree_bytes(small_tree(ok=(1, 0, 1)))


def _probe(tree: Tree) -> None:
    """Evaluate a loaded tree everywhere: must not crash, status in {0, 1, 2}."""
    H, D, p, tau, f = np.empty((2, 2)), np.empty((2, 3)), np.empty(2), np.empty(2), np.empty(n_outputs(2))
    for th in ([0.1, 0.1], [0.9, -0.9], [0.5, 0.0], [-5.0, 5.0], [np.nan, 0.3]):
        st_ = eval_tau(tree.arrays, np.array(th), np.ones(2), np.ones(2), H, D, p, tau)
        assert st_ in (0, 1, 2)
        assert eval_outputs(tree.arrays, np.array(th), f) in (0, 1, 2)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(1, 255)), min_size=1, max_size=4),
       st.integers(0, len(GOOD)))
def test_fuzz_byte_flips_and_truncations(flips, cut):
    data = bytearray(GOOD)
    for pos, x in flips:
        data[pos] ^= x
    data = bytes(data[:cut]) if cut < len(GOOD) else bytes(data)
    try:
        tree = tree_from_bytes(data)
    except TreeFileError:
        return
    _probe(tree)


ARRAY_NAMES = ["node_dim", "node_split", "node_child", "leaf_box", "leaf_ok", "coef", "lo", "hi"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ARRAY_NAMES), st.integers(0, 10 ** 6), st.integers(0, 255))
def test_fuzz_array_bytes_with_valid_checksum(name, pos, x):
    """Corrupt an array's bytes and re-sign the file: the loader still refuses anything that
    could make a kernel index out of bounds, and whatever it accepts evaluates safely."""
    def mutate(body):
        d = bytearray(body["arrays"][name]["data"])
        d[pos % len(d)] ^= x
        body["arrays"][name]["data"] = bytes(d)
    try:
        tree = tree_from_bytes(repack(small_tree(ok=(1, 0, 1)), mutate))
    except TreeFileError:
        return
    _probe(tree)
