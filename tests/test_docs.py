"""The documentation: the site builds with ``mkdocs build --strict`` offline, the configuration
reference is the one the schema generates, and the README stays short, with the two commands at
its top and links that resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pkrt.rt.cli import schemadoc

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"
# any attempt to fetch something during the build fails: the site must build offline
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": "", "NO_MKDOCS_2_WARNING": "1"}


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)], cwd=config.parent,
                          env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=600)


def test_configuration_page_is_generated_from_the_schema():
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text(encoding="utf-8") == schemadoc.page(), (
        "docs/configuration.md differs from the schema: python -m pkrt.rt.cli.schemadoc > docs/configuration.md")
    assert schemadoc.main(["--check", str(page)]) == 0


def test_the_check_fails_on_a_stale_page(tmp_path, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text(schemadoc.page().replace("| `rate_hz` |", "| `rate` |"), encoding="utf-8")
    assert schemadoc.main(["--check", str(stale)]) == 1
    assert "differs from the schema" in capsys.readouterr().err
    assert schemadoc.main(["--check", str(tmp_path / "missing.md")]) == 2


def test_every_table_and_field_is_on_the_page():
    from pkrt.drivers import BACKENDS
    from pkrt.rt.core import schema
    from pkrt.rt.runtime.machine.config import tables_of

    page = schemadoc.page()
    for backend in BACKENDS:
        for _, cls in tables_of(backend):
            assert f"## {schemadoc.heading_and_text(cls)[0]}\n" in page
            for f in schema.fields(cls):
                assert f"| `{f.name}` |" in page


@pytest.mark.slow
def test_site_builds_strict_and_offline(tmp_path):
    r = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site"
    # the generated reference and the API pages from docstrings are there
    assert "bus_watchdog_ms" in (site / "configuration" / "index.html").read_text(encoding="utf-8")
    api = (site / "api" / "drivers" / "index.html").read_text(encoding="utf-8")
    assert "pkrt.drivers.base" in api and "open_drives" in api
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    assert "usage: pkrt run [-h]" in cli and "pkrt verbs" not in cli
    assert (site / "changelog" / "index.html").read_text(encoding="utf-8").count("2026-11-2") >= 2


@pytest.mark.slow
def test_strict_validation_fails_on_a_broken_link(tmp_path):
    """The ``validation`` settings of mkdocs.yml turn broken links and anchors into warnings, which
    ``--strict`` fails on (checked on a two-page site with the same settings and theme)."""
    import yaml

    class Loader(yaml.SafeLoader):  # mkdocs.yml's tags (!relative) read as plain values
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    validation = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)["validation"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# A\n\n## Here\n\nSee [b](b.md#here).\n")
    config = tmp_path / "mkdocs.yml"
    lines = ["site_name: t", "theme:", "  name: material", "  font: false", "validation:"]
    lines += [f"  {k}: {v}" for k, v in validation.items()]
    config.write_text("\n".join(lines) + "\n")
    for page, ok in (("# B\n\n## Here\n", True), ("# B\n\n## There\n", False), ("# B\n\nSee [c](c.md).\n", False)):
        (docs / "b.md").write_text(page)
        r = mkdocs_build(config, tmp_path / "site")
        assert (r.returncode == 0) == ok, (page, r.stderr)


def test_readme_is_short_with_the_two_commands_first():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) <= 200, "README.md: keep it short; the documentation goes to docs/"
    assert readme[0] == "# pkrt" and readme[2] == "```sh" and readme[5] == "```"
    commands = readme[3:5]
    assert commands[0] == "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/pkrt run"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci.splitlines()  # CI runs the README's test command, exactly
    started = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert "\n".join(commands) in started


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "the README links to the documentation pages"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


def test_the_cli_page_gets_every_verbs_help():
    from pkrt.rt.cli import COMMANDS, clidoc

    assert clidoc.MARKER in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    text = clidoc.verbs_markdown()
    for verb in COMMANDS:
        assert f"\n### pkrt {verb}\n" in text and f"usage: pkrt {verb} [-h]" in text
    assert "--theta-ddot" in clidoc.verb_help("model eval")


def test_files_the_documentation_names_exist():
    """A module or file named in the documentation (``rt/runtime/machine/run.py``, ``models/machines/x.toml``)
    exists, so a move or rename that leaves the pages behind fails here."""
    named = re.compile(r"(?<![\w./-])((?:rt|models|drivers|hil|tests|docs)/[\w/.-]*\.(?:py|toml|pkt|png|md))")
    pages = [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    missing = sorted({f"{page.relative_to(ROOT)}: {path}" for page in pages
                      for path in named.findall(page.read_text(encoding="utf-8")) if not (ROOT / path).exists()})
    assert not missing, "\n".join(missing)


def test_every_module_has_an_api_entry():
    """Each module of the four packages is on an API page (``::: pkrt.models.kinematics.description``),
    itself or through a sub-package named as a whole (``::: pkrt.rt.cli``)."""
    top = {f"pkrt.{name}" for name in ("rt", "models", "drivers", "hil")}
    named = {m for page in (ROOT / "docs" / "api").glob("*.md")
             for m in re.findall(r"^::: ([\w.]+)$", page.read_text(encoding="utf-8"), flags=re.M)}
    modules = {".".join(("pkrt", folder, *f.relative_to(ROOT / folder).with_suffix("").parts))
               for folder in ("rt", "models", "drivers", "hil") for f in (ROOT / folder).rglob("*.py")
               if f.stem not in ("__init__", "__main__")}

    def covered(module: str) -> bool:
        parents = {module.rsplit(".", k)[0] for k in range(1, module.count(".") - 1)}
        return module in named or bool((parents - top) & named)

    missing = sorted(m for m in modules if not covered(m))
    assert not missing, "add to docs/api/*.md: " + ", ".join(missing)

