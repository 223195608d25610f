"""Sphinx configuration. The build never touches the network (intersphinx reads a local file)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from sphinx.errors import ConfigError
from sphinx.ext import intersphinx

# Document the checkout being built, whatever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# Local extensions: the pitfall catalogue table (read from the race tests), notebook download
# links, the lane pictures, links from inline code to the standard library.
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "shutdown-patterns"
author = "shutdown-patterns contributors"
copyright = "2026, shutdown-patterns contributors"  # noqa: A001 - Sphinx reads this name

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.graphviz",
    "sphinx.ext.intersphinx",
    "sphinx.ext.extlinks",
    "sphinx_copybutton",
    "pitfall_catalogue",
    "notebook_download",
    "lanes",
    "stdlib_links",
]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Notebooks live in ../notebooks (docs/notebooks is a link to it), are committed without
# outputs, and are executed on every build; a failing cell fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 120
nb_execution_show_tb = True
# A cell's printed lines and log lines in one output box, not one box per write.
nb_merge_streams = True

exclude_patterns = ["_build", "_ext", "jupyter_execute", "**/.ipynb_checkpoints"]

nitpicky = True

# Names from the standard library link to docs.python.org, resolved from the inventory that
# Debian's python3.11-doc package installs (`make docs` installs it with scripts/need.sh), so
# the build needs no network. PYTHON_INVENTORY names another copy of objects.inv.
DEBIAN_INVENTORY = "/usr/share/doc/python3.11/html/objects.inv"
PYTHON_INVENTORY = os.environ.get("PYTHON_INVENTORY", DEBIAN_INVENTORY)
intersphinx_mapping = {"python": ("https://docs.python.org/3", PYTHON_INVENTORY)}

# {gh}`90882` (:gh:`90882` in a docstring) links the CPython issue, shown as gh-90882.
extlinks = {"gh": ("https://github.com/python/cpython/issues/%s", "gh-%s")}

# Names the standard library's inventory knows under another name: the private module a
# class is defined in (what autodoc sees in an annotation), or the bare name a docstring uses.
STDLIB_ALIASES = {
    "_asyncio.Task": "asyncio.Task",
    "_thread.allocate_lock": "threading.Lock",
    "asyncio.locks.Event": "asyncio.Event",
    "concurrent.futures._base.Executor": "concurrent.futures.Executor",
    "concurrent.futures._base.Future": "concurrent.futures.Future",
    "concurrent.futures.process.ProcessPoolExecutor": "concurrent.futures.ProcessPoolExecutor",
    "multiprocessing.queues.Queue": "multiprocessing.Queue",
    "BrokenProcessPool": "concurrent.futures.process.BrokenProcessPool",
    "Connection": "multiprocessing.connection.Connection",
    "Future.cancel": "concurrent.futures.Future.cancel",
    "ModuleType": "types.ModuleType",
    "ProcessPoolExecutor": "concurrent.futures.ProcessPoolExecutor",
    "ThreadPoolExecutor": "concurrent.futures.ThreadPoolExecutor",
    "ThreadPoolExecutor.shutdown": "concurrent.futures.Executor.shutdown",
    "ThreadPoolExecutor.submit": "concurrent.futures.Executor.submit",
}


def _stdlib_alias(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve an unresolved name through `STDLIB_ALIASES` and the stdlib inventory."""
    target = STDLIB_ALIASES.get(node.get("reftarget", "").lstrip("~"))
    if node.get("refdomain") != "py" or target is None:
        return None
    aliased = node.deepcopy()
    aliased["reftarget"] = target
    return intersphinx.missing_reference(app, env, aliased, contnode)


def setup(app: Any) -> None:
    """Stop at once without the inventory; try `STDLIB_ALIASES` when a name is not found."""
    if not Path(PYTHON_INVENTORY).is_file():
        raise ConfigError(
            f"the standard library's Sphinx inventory is missing: {PYTHON_INVENTORY}\n"
            f"Install it with `scripts/need.sh {DEBIAN_INVENTORY} python3.11-doc` (Debian's"
            " package; `make docs` does it), or set PYTHON_INVENTORY to the path of a copy of"
            " https://docs.python.org/3/objects.inv."
        )
    app.connect("missing-reference", _stdlib_alias, priority=900)


nitpick_ignore_regex = [
    # Type variables of generic signatures (``P``, ``T``) are not documented objects, nor
    # are a module's private type variables and aliases (``_R``, ``_StepHook``).
    (r"py:class", r"(~?P|~?T|patterns\..*\.(P|T))"),
    (r"py:class", r"~?(patterns\..*\.)?_\w+"),
    # A ParamSpec's ``P.args`` as autodoc renders it.
    (r"py:obj", r"typing\.~P"),
    # Documented by Python without an entry in its inventory.
    (r"py:.*", r"(multiprocessing\.context\.)?BaseContext|signal\.default_int_handler"),
    # psycopg (an optional dependency) has no inventory here.
    (r"py:.*", r"(psycopg|sql)(\..*)?"),
]

# `name` in a docstring is a cross-reference (to any Python object), checked by -n like the rest.
default_role = "py:obj"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Diagrams are drawn at build time from the text in docs/diagrams/*.dot, by graphviz's dot
# (Debian's package, installed by scripts/need.sh from `make docs`).
graphviz_output_format = "svg"

html_theme = "furo"
html_title = "shutdown-patterns"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
# A link under a diagram wider than a phone's screen, to open it on its own.
html_js_files = ["diagram-links.js"]
html_favicon = "_static/favicon.svg"
