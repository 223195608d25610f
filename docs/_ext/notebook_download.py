"""A download link for the ``.ipynb`` at the top of every rendered notebook page.

On ``source-read`` of a notebook, a Markdown cell with a MyST ``{download}`` role is put in
front of its cells, so Sphinx copies the notebook itself into ``_downloads/`` and links it.
The cell exists only in the build: the committed notebook is untouched.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from sphinx.application import Sphinx


def _add_link(app: Sphinx, docname: str, source: list[str]) -> None:
    if not docname.startswith("notebooks/"):
        return
    notebook = json.loads(source[0])
    name = PurePosixPath(docname).name + ".ipynb"
    link = (
        f"{{download}}`Download this notebook <{name}>` and run it on your machine "
        "(`make lab` opens it in JupyterLab with the project's venv)."
    )
    cell: dict[str, Any] = {"cell_type": "markdown", "metadata": {}, "source": [link]}
    if notebook.get("nbformat_minor", 0) >= 5:  # cells carry ids from nbformat 4.5 on
        cell["id"] = "download-this-notebook"
    cells = notebook["cells"]
    # After the title cell, so the page still starts with its heading.
    cells.insert(1 if cells and cells[0]["cell_type"] == "markdown" else 0, cell)
    source[0] = json.dumps(notebook)


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the source-read hook."""
    app.connect("source-read", _add_link)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
