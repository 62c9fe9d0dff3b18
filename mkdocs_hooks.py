"""mkdocs hooks of pkrt's documentation site (``hooks:`` in mkdocs.yml).

The ``pkrt`` package is four folders mapped by setuptools' ``package-dir`` (``rt``, ``models``,
``drivers``, ``hil``); there is no ``pkrt/`` folder for mkdocstrings (griffe) to read. This hook
lays the four folders out as one package in a temporary directory (symbolic links, as a wheel
installs them) and gives it to the Python handler as its search path, for the build only.
The command-line page gets every verb's ``--help`` (``pkrt.rt.cli.clidoc``) where it says
``<!-- pkrt verbs -->``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority

PACKAGES = ("rt", "models", "drivers", "hil")
_tmp: list[Path] = []


@event_priority(100)  # before mkdocstrings, which creates its handlers in its own on_config
def on_config(config):
    root = Path(config.config_file_path).resolve().parent
    tmp = Path(tempfile.mkdtemp(prefix="pkrt-docs-"))
    _tmp.append(tmp)
    (tmp / "pkrt").mkdir()
    for name in PACKAGES:
        (tmp / "pkrt" / name).symlink_to(root / name, target_is_directory=True)
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [str(tmp)]
    return config


def on_shutdown():
    while _tmp:
        shutil.rmtree(_tmp.pop(), ignore_errors=True)


def on_page_markdown(markdown, page, config, files):
    from pkrt.rt.cli import clidoc

    if clidoc.MARKER not in markdown:
        return markdown
    return markdown.replace(clidoc.MARKER, clidoc.verbs_markdown())
