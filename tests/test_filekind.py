"""Files are told apart by their content, whatever their name: every verb that takes a file
accepts it under any name and refuses a file of another kind with one line (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pkrt.rt.core import filekind as fk
from pkrt.rt.cli import main

MACHINES = Path(__file__).resolve().parent.parent / "models" / "machines"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The shipped files under names that say nothing, and a short run's log and trajectory
    (the demo is the configuration's [demo] table, planned from the model whatever its name)."""
    d = tmp_path_factory.mktemp("kinds")
    f = {"tree": d / "controller.tree", "model": d / "orthoglide.desc", "fourbar": d / "fourbar.desc",
         "fourbar_tree": d / "fb", "machine": d / "machine.conf", "log": d / "run.data",
         "traj": d / "path.txt", "png": d / "picture.bin"}
    shutil.copy(MACHINES / "orthoglide.pkt", f["tree"])
    shutil.copy(MACHINES / "orthoglide.toml", f["model"])
    shutil.copy(MACHINES / "fourbar.toml", f["fourbar"])
    shutil.copy(MACHINES / "fourbar.pkt", f["fourbar_tree"])
    conf = (MACHINES / "orthoglide-sim.toml").read_text()
    # relative to the configuration, as shipped; the model file's extension is not .toml
    conf = conf.replace('model = "orthoglide"', f'model = "{f["model"].name}"')
    conf = conf.replace('tree = "orthoglide.pkt"', f'tree = "{f["tree"].name}"')
    conf = conf.replace('plant_tree = "orthoglide-plant.pkt"',
                        f'plant_tree = "{MACHINES / "orthoglide-plant.pkt"}"')
    f["machine"].write_text(conf)
    assert main(["run", "--machine", str(f["machine"]), "--lockstep", "--duration", "0.3",
                 "--log", str(f["log"]), "--plot", str(f["png"]), "--json"]) == 0
    f["traj"].write_text("t,q1,q2,q3\n" + "".join(f"{t},-0.1,-0.1,-0.1\n" for t in (0, 0.1, 0.2, 0.3)))
    return f


def test_sniff_tells_every_kind_by_content(files, tmp_path):
    expected = {"tree": fk.TREE, "model": fk.MODEL, "fourbar": fk.MODEL, "fourbar_tree": fk.TREE,
                "machine": fk.MACHINE, "log": fk.LOG, "traj": fk.CSV, "png": "png"}
    assert {k: fk.sniff(p) for k, p in files.items()} == expected
    (tmp_path / "e").write_bytes(b"")
    (tmp_path / "t").write_text("just words\n")
    (tmp_path / "o").write_text("[server]\nport = 80\n")
    (tmp_path / "m").write_bytes(msgpack.packb({"format": "other", "x": 1}))
    (tmp_path / "b").write_bytes(bytes(range(256)))
    got = {n: fk.sniff(tmp_path / n) for n in "etomb"}
    assert got == {"e": fk.EMPTY, "t": fk.TEXT, "o": fk.TOML, "m": fk.MSGPACK, "b": fk.BINARY}
    assert fk.sniff(tmp_path / "none") == fk.MISSING and fk.sniff(tmp_path) == fk.FOLDER


def test_a_damaged_file_of_the_expected_kind_is_left_to_its_loader(files, tmp_path):
    """A tree cut in its first bytes is no longer recognisable: the tree loader's own message
    says what is wrong (not 'this is a binary file')."""
    cut = tmp_path / "cut"
    cut.write_bytes(files["tree"].read_bytes()[:40])
    fk.expect(cut, fk.TREE)  # not refused by kind
    bad = tmp_path / "bad"
    bad.write_text("[model\nname = 'x'\n")  # broken TOML, still text
    fk.expect(bad, fk.MODEL)
    with pytest.raises(fk.WrongFileKind, match="this is a pkrt tree file, expected a CSV file"):
        fk.expect(files["tree"], fk.CSV)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_sniff_any_bytes(data):
    assert fk.kind_of_bytes(data) in fk.DESCRIPTION


def _json(capsys, *argv) -> dict:
    assert main([*map(str, argv), "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_every_verb_accepts_files_under_any_name(files, capsys, tmp_path):
    r = _json(capsys, "model", "eval", files["tree"], "--theta", "-0.1,0.02,0")
    assert r["tree"] == str(files["tree"]) and len(r["H"]) == 3
    assert _json(capsys, "model", "eval", files["model"], "--theta", "-0.1,0.02,0")["model"] == "orthoglide"
    assert _json(capsys, "model", "check", files["fourbar"])["mobility"] == 1
    info = _json(capsys, "tree", "info", files["fourbar_tree"])
    assert info["kind"] == "spline" and len(info["grid_points"]) == 1
    r = _json(capsys, "tree", "verify", files["fourbar_tree"], "--model", files["fourbar"],
              "--samples", "20", "--stress", "10", "--jobs", "1")
    assert r["compared"] == 20 + 10 + 201
    out = tmp_path / "new.tree.bin"
    assert _json(capsys, "build", files["fourbar"], "-o", out, "--kind", "boxes", "--boxes", "2", "--jobs", "1",
                 "--verify-samples", "0")["leaves"] == 2
    assert fk.sniff(out) == fk.TREE
    assert _json(capsys, "log", "info", files["log"])["cycles"] == 301
    assert _json(capsys, "log", "plot", files["log"], "-o", tmp_path / "p.png")
    assert _json(capsys, "log", "export", files["log"], "--csv", tmp_path / "c.out")
    r = _json(capsys, "run", "--machine", files["machine"], "--traj", files["traj"],
              "--lockstep", "--no-log")
    assert r["cycles"] >= 301
    r = _json(capsys, "replay", files["log"], "--offline", "--tree", files["tree"])
    assert r["mode"] == "offline" and r["same_tree_as_run"] is True


WRONG = [
    (["model", "eval", "{log}", "--theta", "0"], "pkrt run log", "a machine description or a pkrt tree file"),
    (["model", "eval", "{machine}", "--theta", "0"], "machine configuration", "a machine description or a pkrt tree file"),
    (["model", "check", "{tree}"], "pkrt tree file", "a machine description"),
    (["build", "{machine}", "-o", "{out}", "--boxes", "2"], "machine configuration", "a machine description"),
    (["tree", "info", "{model}"], "machine description", "a pkrt tree file"),
    (["tree", "info", "{png}"], "PNG image", "a pkrt tree file"),
    (["tree", "verify", "{log}"], "pkrt run log", "a pkrt tree file"),
    (["tree", "verify", "{tree}", "--model", "{machine}"], "machine configuration", "a machine description"),
    (["run", "--machine", "{model}", "--lockstep"], "machine description", "a machine configuration"),
    (["run", "--machine", "{machine}", "--traj", "{tree}", "--lockstep"], "pkrt tree file", "a CSV file"),
    (["hil", "--bus", "can", "--machine", "{log}", "--duration", "0.1"], "pkrt run log", "a machine configuration"),
    (["hil", "--bus", "serial", "--machine", "{tree}", "--duration", "0.1"], "pkrt tree file", "a machine configuration"),
    (["replay", "{tree}"], "pkrt tree file", "a pkrt run log"),
    (["replay", "{log}", "--offline", "--tree", "{model}"], "machine description", "a pkrt tree file"),
    (["log", "info", "{traj}"], "CSV file", "a pkrt run log"),
    (["log", "export", "{tree}", "--csv", "{out}"], "pkrt tree file", "a pkrt run log"),
    (["log", "plot", "{machine}", "-o", "{out}"], "machine configuration", "a pkrt run log"),
]


@pytest.mark.parametrize("argv,what,expected", WRONG, ids=[" ".join(w[0][:3]) for w in WRONG])
def test_a_wrong_kind_of_file_is_one_line(files, capsys, tmp_path, argv, what, expected):
    names = {k: str(v) for k, v in files.items()} | {"out": str(tmp_path / "out")}
    assert main([a.format(**names) for a in argv]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pkrt: error: "), cap.err
    assert f"this is a {what}" in lines[0] or f"this is an {what}" in lines[0], lines[0]
    assert lines[0].endswith(f"expected {expected}") or f"expected {expected} (" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
