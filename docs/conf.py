"""Sphinx configuration: the guides in Markdown (MyST) and an API reference built from docstrings.

Build (CI runs exactly this, and any warning fails it):

    sphinx-build -W --keep-going -b html docs build/docs
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sphinx import addnodes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tilecraft without an install

project = "tilecraft"
author = "the tilecraft authors"
copyright = "the tilecraft authors"  # noqa: A001 - Sphinx's name

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

# MyST: a link to another guide is checked (a missing document or heading warns, and warnings fail
# the build); a link to an existing file outside docs/ (a module, the README) becomes a download link
# (MyST does that for any file but a Markdown one; _outside_markdown_as_download below for those).
myst_heading_anchors = 3  # [text](architecture.md#layers) reaches the heading "Layers"

# Docstrings are Google style (Args:, Returns:, Raises:, Example:); a class documents its
# constructor's arguments in its own docstring.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # Attributes: as a field list, so an attribute is never described twice
autoclass_content = "class"
autodoc_member_order = "bysource"  # the order of the source: Schedule's primitives grouped as written
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}

html_theme = "furo"
html_title = "tilecraft"


def _outside_markdown_as_download(app, doctree) -> None:
    """A link to a Markdown file outside docs/ (``../README.md``, ``../../DESIGN.md``) becomes a
    download link, as MyST makes a link to any other file there, instead of a missing document;
    so the guides can link the README and DESIGN.md as they read on a forge. Links between
    pages, and to files that do not exist, are still checked."""
    srcdir = Path(app.srcdir).resolve()
    here = (srcdir / app.env.current_document.docname).parent
    for node in list(doctree.findall(addnodes.pending_xref)):
        target = Path(str(node.get("reftarget", "")) + ".md")
        if node.get("refdomain") != "doc" or not target.is_absolute() or not target.is_file() \
                or srcdir in target.resolve().parents:
            continue
        download = addnodes.download_reference("", "", *node.children, refdomain=None, reftype="myst",
                                               reftarget=os.path.relpath(target, here), refdoc=node["refdoc"],
                                               refexplicit=node.get("refexplicit", True))
        node.replace_self(download)


def setup(app) -> None:
    app.connect("doctree-read", _outside_markdown_as_download, priority=100)  # before downloads are collected
