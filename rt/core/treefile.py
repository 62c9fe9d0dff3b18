"""Tree files: msgpack, deterministic bytes, validated completely on load.

Layout (msgpack map, keys sorted):

    {"format": "pkrt-tree", "version": 2, "checksum": sha256 hex of payload, "payload": bytes}

``payload`` is itself a msgpack map ``{"arrays": {...}, "header": {...}, "kind": "boxes" |
"spline"}``. Each array is ``{"dtype": "<f8" | "<i4" | "|u1", "shape": [...], "data":
little-endian bytes}``; the arrays are those of :class:`pkrt.rt.core.tree.Tree`, both kinds' (the
unused kind's are empty). Version 1 files (boxes only, no kind) are refused with a message to
rebuild. The header holds the model's name and content hash,
actuator names, units and ranges (SI), the output layout, the output scales, the build
settings and the verification report. Nothing in a file is ever executed: msgpack is read with
``raw=False``, ``strict_map_key=True`` and no extension types, and every field is type-checked.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import msgpack
import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.filekind import TREE, expect

from pkrt.rt.core.tree import BOXES, KIND_NAMES, ORDER, Tree, n_basis, n_outputs

FORMAT = "pkrt-tree"
VERSION = 2

# array name -> (stored dtype string, numpy dtype)
_ARRAYS = {
    "lo": ("<f8", np.float64),
    "hi": ("<f8", np.float64),
    "node_dim": ("<i4", np.int32),
    "node_split": ("<f8", np.float64),
    "node_child": ("<i4", np.int32),
    "leaf_box": ("<f8", np.float64),
    "leaf_ok": ("|u1", np.uint8),
    "coef": ("<f8", np.float64),
    "knots": ("<f8", np.float64),
    "knot_start": ("<i4", np.int32),
    "knot_count": ("<i4", np.int32),
    "spl_coef": ("<f8", np.float64),
}
_KINDS = {name: k for k, name in KIND_NAMES.items()}


class TreeFileError(UserError):
    """A tree file is unreadable, corrupted, of another format or version, or inconsistent."""


# -- writing ----------------------------------------------------------------------------------

def canonical(x):
    """Plain msgpack-able data with sorted keys (numpy scalars and arrays become Python)."""
    if isinstance(x, dict):
        return {str(k): canonical(x[k]) for k in sorted(x, key=str)}
    if isinstance(x, (list, tuple)):
        return [canonical(v) for v in x]
    if isinstance(x, np.ndarray):
        return canonical(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return v if math.isfinite(v) else None
    if x is None or isinstance(x, (str, bytes)):
        return x
    raise TypeError(f"cannot store {type(x).__name__} in a tree header")


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, use_single_float=False, strict_types=False)


def tree_bytes(tree: Tree) -> bytes:
    """The file bytes of a tree (same tree and header, same bytes)."""
    arrays = {}
    for name, (code, dt) in _ARRAYS.items():
        a = np.ascontiguousarray(getattr(tree, name), dtype=np.dtype(code))
        arrays[name] = {"dtype": code, "shape": list(a.shape), "data": a.tobytes()}
    payload = _pack({"arrays": arrays, "header": canonical(tree.header), "kind": tree.kind_name})
    outer = {"checksum": hashlib.sha256(payload).hexdigest(), "format": FORMAT,
             "payload": payload, "version": VERSION}
    return _pack(outer)


def save_tree(tree: Tree, path) -> None:
    """Write a tree file (atomically: a temporary file beside it, then a rename)."""
    from pkrt.rt.core.outputs import atomic_write

    data = tree_bytes(tree)
    with atomic_write(path, "tree", "wb") as f:
        f.write(data)


# -- reading ----------------------------------------------------------------------------------

def _no_ext(code, data):
    raise TreeFileError(f"msgpack extension type {code} is not allowed")


def _unpack(data: bytes, what: str):
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_no_ext,
                               use_list=True, timestamp=0)
    except TreeFileError as e:
        raise TreeFileError(f"{what}: {e}") from None
    except Exception as e:  # msgpack raises many types on malformed input
        raise TreeFileError(f"{what}: not a complete msgpack document ({type(e).__name__}: {e})"
                            .rstrip(": ")) from None


def _fail(where: str, msg: str):
    raise TreeFileError(f"{where}: {msg}")


def _str_list(h: dict, key: str, n: int, where: str) -> list[str]:
    v = h.get(key)
    if not isinstance(v, list) or len(v) != n or not all(isinstance(x, str) for x in v):
        _fail(where, f"header field '{key}' must be a list of {n} strings")
    return v


def _array(arrays: dict, name: str, where: str) -> np.ndarray:
    code, dt = _ARRAYS[name]
    rec = arrays.get(name)
    if not isinstance(rec, dict) or set(rec) != {"dtype", "shape", "data"}:
        _fail(where, f"array '{name}' must be a map with dtype, shape and data")
    if rec["dtype"] != code:
        _fail(where, f"array '{name}' has dtype {rec['dtype']!r}, expected {code!r}")
    shape = rec["shape"]
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 3
            or not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 2**31
                       for k in shape)):
        _fail(where, f"array '{name}' has an invalid shape {shape!r}")
    data = rec["data"]
    if not isinstance(data, bytes):
        _fail(where, f"array '{name}' data must be bytes")
    size = math.prod(shape) * np.dtype(code).itemsize
    if len(data) != size:
        _fail(where, f"array '{name}' holds {len(data)} bytes, its shape {shape} needs {size}")
    return np.frombuffer(data, dtype=np.dtype(code)).astype(dt).reshape(shape)


_NDIM = {"lo": 1, "hi": 1, "node_dim": 1, "node_split": 1, "node_child": 2, "leaf_box": 3,
         "leaf_ok": 1, "coef": 3, "knots": 1, "knot_start": 1, "knot_count": 1, "spl_coef": 2}


def _check_root(a: dict, where: str) -> int:
    for name, nd in _NDIM.items():
        if a[name].ndim != nd:
            _fail(where, f"array '{name}' has {a[name].ndim} dimensions, expected {nd}")
    lo, hi = a["lo"], a["hi"]
    if lo.shape[0] < 1 or hi.shape != lo.shape:
        _fail(where, f"root box lo {lo.shape} and hi {hi.shape} must be two equal 1-d arrays")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo < hi)):
        _fail(where, "root box must be finite with lo < hi on every axis")
    return lo.shape[0]


def _check_unused(a: dict, names, kind: str, where: str) -> None:
    for name in names:
        if a[name].size != 0:
            _fail(where, f"array '{name}' must be empty in a tree of kind '{kind}'")


def _check_spline(a: dict, s: int, where: str) -> None:
    """Knot vectors clamped to the root box with non-empty spans 3..n-1, consistent counts
    and offsets, a finite (prod n_a, n_out) coefficient table: then the kernel's span search
    and row indices stay in bounds."""
    count, start, knots, C = a["knot_count"], a["knot_start"], a["knots"], a["spl_coef"]
    if count.shape != (s,) or start.shape != (s,):
        _fail(where, f"knot_count {count.shape} and knot_start {start.shape} must have {s} entries")
    if np.any(count < 2 * ORDER) or np.any(count > 2 ** 20):
        _fail(where, f"knot_count {count.tolist()} must be in {2 * ORDER}..2^20 per axis")
    want_start = np.concatenate([[0], np.cumsum(count.astype(np.int64))[:-1]])
    if not np.array_equal(start, want_start) or knots.shape != (int(count.sum()),):
        _fail(where, f"knot_start {start.tolist()} and knots ({knots.shape[0]}) disagree with "
                     f"knot_count {count.tolist()}")
    if not np.all(np.isfinite(knots)):
        _fail(where, "knots must be finite")
    for d in range(s):
        t = knots[start[d]:start[d] + count[d]]
        n = len(t) - ORDER
        if np.any(np.diff(t) < 0):
            _fail(where, f"knots of axis {d} are not non-decreasing")
        if not (np.all(t[:ORDER] == a["lo"][d]) and np.all(t[n:] == a["hi"][d])):
            _fail(where, f"knots of axis {d} must start with lo and end with hi, each {ORDER} times")
        if np.any(np.diff(t[ORDER - 1:n + 1]) <= 0):
            _fail(where, f"interior knots of axis {d} must be strictly increasing inside the box")
    rows = int(np.prod(count.astype(np.int64) - ORDER))
    if C.shape != (rows, n_outputs(s)):
        _fail(where, f"spl_coef has shape {C.shape}, expected {(rows, n_outputs(s))}")
    if not np.all(np.isfinite(C)):
        _fail(where, "spl_coef holds non-finite coefficients")


def _check_shapes(a: dict, s: int, where: str) -> tuple[int, int]:
    n_nodes = a["node_dim"].shape[0]
    if a["node_dim"].ndim != 1 or n_nodes < 1:
        _fail(where, "node_dim must be a non-empty 1-d array")
    if a["node_split"].shape != (n_nodes,) or a["node_child"].shape != (n_nodes, 2):
        _fail(where, f"node arrays disagree on the node count {n_nodes}: split "
                     f"{a['node_split'].shape}, child {a['node_child'].shape}")
    n_leaves = a["leaf_ok"].shape[0]
    if a["leaf_ok"].ndim != 1 or n_leaves < 1:
        _fail(where, "leaf_ok must be a non-empty 1-d array")
    if a["leaf_box"].shape != (n_leaves, 2, s):
        _fail(where, f"leaf_box has shape {a['leaf_box'].shape}, expected {(n_leaves, 2, s)}")
    want = (n_leaves, n_outputs(s), n_basis(s))
    if a["coef"].shape != want:
        _fail(where, f"coef has shape {a['coef'].shape}, expected {want}")
    if not np.all((a["leaf_ok"] == 0) | (a["leaf_ok"] == 1)):
        _fail(where, "leaf_ok values must be 0 or 1")
    return n_nodes, n_leaves


def _check_topology(a: dict, s: int, n_nodes: int, n_leaves: int, where: str) -> None:
    """Every node reached once from the root, splits inside their boxes, leaf boxes equal to
    the boxes the splits define: then find_leaf can never index out of bounds or loop."""
    dim, split, child, box = a["node_dim"], a["node_split"], a["node_child"], a["leaf_box"]
    seen = np.zeros(n_nodes, dtype=bool)
    leaf_seen = np.zeros(n_leaves, dtype=bool)
    stack = [(0, a["lo"].copy(), a["hi"].copy())]
    while stack:
        n, blo, bhi = stack.pop()
        if seen[n]:
            _fail(where, f"node {n} is reached twice (a cycle or a shared node)")
        seen[n] = True
        d = int(dim[n])
        if d == -1:
            leaf = int(child[n, 0])
            if not 0 <= leaf < n_leaves:
                _fail(where, f"node {n} points to leaf {leaf}, outside 0..{n_leaves - 1}")
            if leaf_seen[leaf]:
                _fail(where, f"leaf {leaf} is referenced by two nodes")
            leaf_seen[leaf] = True
            if not (np.array_equal(box[leaf, 0], blo) and np.array_equal(box[leaf, 1], bhi)):
                _fail(where, f"leaf {leaf} box differs from the box its node's splits define "
                             f"(or lies outside the root box)")
            continue
        if not 0 <= d < s:
            _fail(where, f"node {n} splits dimension {d}, outside -1..{s - 1}")
        v = float(split[n])
        if not blo[d] < v < bhi[d]:
            _fail(where, f"node {n} split {v!r} is not strictly inside its box "
                         f"[{blo[d]!r}, {bhi[d]!r}] on axis {d}")
        c0, c1 = int(child[n, 0]), int(child[n, 1])
        for c in (c0, c1):
            if not 0 < c < n_nodes:
                _fail(where, f"node {n} has child {c}, outside 1..{n_nodes - 1}")
        hi0, lo1 = bhi.copy(), blo.copy()
        hi0[d] = v
        lo1[d] = v
        stack.append((c1, lo1, bhi))
        stack.append((c0, blo, hi0))
    if not seen.all():
        _fail(where, f"{int((~seen).sum())} node(s) are not reachable from the root")
    if not leaf_seen.all():
        _fail(where, f"{int((~leaf_seen).sum())} leaf/leaves are not referenced by any node")
    ok = a["leaf_ok"] == 1
    if not np.all(np.isfinite(a["coef"][ok])):
        bad = int(np.flatnonzero(ok & ~np.isfinite(a["coef"]).all(axis=(1, 2)))[0])
        _fail(where, f"leaf {bad} is marked in domain but has non-finite coefficients")


def _plain_data(x, depth: int = 0) -> bool:
    """True if x is only maps, lists, strings, bytes, numbers, booleans and nil."""
    if depth > 32:
        return False
    if isinstance(x, dict):
        return all(_plain_data(v, depth + 1) for v in x.values())
    if isinstance(x, list):
        return all(_plain_data(v, depth + 1) for v in x)
    return x is None or isinstance(x, (str, bytes, int, float, bool))


def _check_header(h: dict, s: int, lo: np.ndarray, hi: np.ndarray, where: str) -> None:
    if not _plain_data(h):
        _fail(where, "header holds a value that is not plain data (or is nested too deeply)")
    model = h.get("model")
    if (not isinstance(model, dict) or not isinstance(model.get("name"), str)
            or not isinstance(model.get("content_hash"), str)):
        _fail(where, "header field 'model' must hold a name and a content_hash")
    _check_actuators(h.get("actuators"), s, lo, hi, where)
    _str_list(h, "outputs", n_outputs(s), where)
    scale = h.get("output_scale")
    if (not isinstance(scale, list) or len(scale) != n_outputs(s)
            or not all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in scale)):
        _fail(where, f"header field 'output_scale' must be {n_outputs(s)} positive numbers")
    for key in ("build", "verification"):
        if not isinstance(h.get(key), dict):
            _fail(where, f"header field '{key}' must be a map")


def _check_actuators(act, s: int, lo: np.ndarray, hi: np.ndarray, where: str) -> None:
    """The header's ``actuators``: s names, s units and s ranges equal to the root box."""
    if not isinstance(act, dict):
        _fail(where, "header field 'actuators' is missing")
    _str_list(act, "names", s, where)
    _str_list(act, "units", s, where)
    ranges = act.get("ranges")
    if (not isinstance(ranges, list) or len(ranges) != s
            or not all(isinstance(r, list) and len(r) == 2
                       and all(isinstance(x, float) for x in r) for r in ranges)):
        _fail(where, f"header field 'actuators.ranges' must be {s} pairs of numbers")
    if not (np.array_equal(np.array(ranges)[:, 0], lo) and np.array_equal(np.array(ranges)[:, 1], hi)):
        _fail(where, "actuator ranges in the header differ from the tree's root box")


def tree_from_bytes(data: bytes, where: str = "tree") -> Tree:
    """Decode and validate tree file bytes; raise TreeFileError with a one-line message."""
    outer = _unpack(data, where)
    if not isinstance(outer, dict):
        _fail(where, "not a pkrt tree file (top level is not a map)")
    fmt = outer.get("format")
    if fmt != FORMAT:
        _fail(where, f"not a pkrt tree file (format {fmt!r}, expected {FORMAT!r})")
    ver = outer.get("version")
    if ver != VERSION or isinstance(ver, bool):
        _fail(where, f"tree file version {ver!r} is not supported (this pkrt reads version "
                     f"{VERSION}); rebuild the tree with 'pkrt build'")
    if set(outer) != {"format", "version", "checksum", "payload"}:
        _fail(where, f"unexpected top-level fields {sorted(set(outer))}")
    payload, checksum = outer["payload"], outer["checksum"]
    if not isinstance(payload, bytes) or not isinstance(checksum, str):
        _fail(where, "payload must be bytes and checksum a string")
    if hashlib.sha256(payload).hexdigest() != checksum:
        _fail(where, "checksum mismatch: the file is corrupted")
    body = _unpack(payload, where)
    if not isinstance(body, dict) or set(body) != {"arrays", "header", "kind"}:
        _fail(where, "payload must be a map with 'arrays', 'header' and 'kind'")
    kind = body["kind"]
    if kind not in _KINDS:
        _fail(where, f"tree kind {kind!r} is not one of {sorted(_KINDS)}")
    arrays, header = body["arrays"], body["header"]
    if not isinstance(arrays, dict) or not isinstance(header, dict):
        _fail(where, "'arrays' and 'header' must be maps")
    if set(arrays) != set(_ARRAYS):
        _fail(where, f"arrays {sorted(arrays)} differ from the expected {sorted(_ARRAYS)}")
    a = {name: _array(arrays, name, where) for name in _ARRAYS}
    s = _check_root(a, where)
    if _KINDS[kind] == BOXES:
        _check_unused(a, ("knots", "knot_start", "knot_count", "spl_coef"), kind, where)
        n_nodes, n_leaves = _check_shapes(a, s, where)
        _check_topology(a, s, n_nodes, n_leaves, where)
    else:
        _check_unused(a, ("node_dim", "node_split", "node_child", "leaf_box", "leaf_ok", "coef"),
                      kind, where)
        _check_spline(a, s, where)
    _check_header(header, s, a["lo"], a["hi"], where)
    return Tree(**a, header=header, kind=_KINDS[kind])


def load_tree(path) -> Tree:
    """Read and validate a tree file (raises TreeFileError, or OSError if unreadable)."""
    path = Path(path)
    expect(path, TREE, TreeFileError)  # another kind of file: say what it is
    return tree_from_bytes(path.read_bytes(), str(path))


def check_tree_matches_model(tree: Tree, content_hash: str, model_name: str | None = None) -> None:
    """Raise TreeFileError unless the tree was built from the model file with this hash."""
    m = tree.header.get("model", {})
    if m.get("content_hash") != content_hash:
        name = model_name or m.get("name", "?")
        raise TreeFileError(
            f"the tree was built from model '{m.get('name', '?')}' with content hash "
            f"{str(m.get('content_hash'))[:12]}..., but model '{name}' has hash "
            f"{content_hash[:12]}...: rebuild the tree with 'pkrt build' (or give the model file "
            f"it was built from)")


__all__ = ["FORMAT", "VERSION", "TreeFileError", "save_tree", "load_tree", "tree_bytes",
           "tree_from_bytes", "check_tree_matches_model", "canonical"]
