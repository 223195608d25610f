"""Sphinx configuration. The build never touches the network: no intersphinx, no link check."""

from __future__ import annotations

import sys
from pathlib import Path

# Document the checkout being built, whatever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# Local extensions: the pitfall catalogue table, read from the race tests.
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
    "sphinx_copybutton",
    "pitfall_catalogue",
    "notebook_download",
    "lanes",
]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Notebooks live in ../notebooks (docs/notebooks is a link to it), are committed without
# outputs, and are executed on every build; a failing cell fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 120
nb_execution_show_tb = True

exclude_patterns = ["_build", "_ext", "jupyter_execute", "**/.ipynb_checkpoints"]

nitpicky = True
# Without intersphinx (no network), references into the standard library (and psycopg) cannot
# resolve; those, and only those, are ignored.
nitpick_ignore_regex = [
    # Type variables of generic signatures (``P``, ``T``) are not documented objects, nor
    # are a module's private type variables and aliases (``_R``, ``_StepHook``).
    (r"py:class", r"(~?P|~?T|patterns\..*\.(P|T))"),
    (r"py:class", r"~?(patterns\..*\.)?_\w+"),
    (
        r"py:.*",
        (
            r"(asyncio|_asyncio|concurrent|threading|queue|socket|typing|collections|contextlib|"
            r"types|io|logging|"
            r"signal|subprocess|os|sys|time|dataclasses|functools|ctypes|_thread|weakref|atexit|"
            r"multiprocessing|sqlite3)"
            r"(\..*)?"
        ),
    ),
    # psycopg (an optional dependency) has no inventory here either.
    (r"py:.*", r"(psycopg|sql)(\..*)?"),
    (
        r"py:.*",
        (
            r"(Callable|Iterator|Iterable|Future|ThreadPoolExecutor|Thread|Event|Any|TypeVar|"
            r"Future\.\w+|ThreadPoolExecutor\.\w+|BaseContext|Connection|ModuleType|"
            r"ProcessPoolExecutor|BrokenProcessPool|"
            r"ParamSpec|BaseException|Exception|RuntimeError|KeyboardInterrupt|TimeoutError|"
            r"ValueError|SystemError|object|float|int|str|bool|None)"
        ),
    ),
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
html_favicon = "_static/favicon.svg"
