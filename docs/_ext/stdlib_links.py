"""Inline code that names a standard-library object links to its entry on docs.python.org.

The pages write ``asyncio.Queue.shutdown()`` or ``threading.excepthook`` as inline code. When
that text, less a trailing ``()``, is the full dotted name of an object in the ``python``
intersphinx inventory (which ``conf.py`` reads from a local file), the code becomes a
cross-reference that intersphinx resolves. A bare ``Thread.join()`` stays plain code: only a
full name is certain to mean that object.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform


def _python_names(inventory: dict[str, dict[str, Any]]) -> set[str]:
    return {
        name for kind, entries in inventory.items() if kind.startswith("py:") for name in entries
    }


class LinkStdlibNames(SphinxTransform):
    """Wrap inline literals that are full standard-library names in a pending reference."""

    default_priority = 400

    def apply(self, **kwargs: Any) -> None:
        """Replace each matching literal with a ``py:obj`` reference around it."""
        inventories = getattr(self.env, "intersphinx_named_inventory", {})
        names = _python_names(inventories.get("python", {}))
        if not names:
            return
        for literal in list(self.document.findall(nodes.literal)):
            if isinstance(literal.parent, (nodes.reference, addnodes.pending_xref)):
                continue
            if literal.get("classes") and "xref" in literal["classes"]:
                continue
            text = literal.astext()
            name = text.removesuffix("()")
            if "." not in name or name not in names:
                continue
            xref = addnodes.pending_xref(
                "",
                refdomain="py",
                reftype="obj",
                reftarget=name,
                refexplicit=True,
                refwarn=True,
            )
            literal.replace_self(xref)
            xref += literal


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the transform."""
    app.setup_extension("sphinx.ext.intersphinx")
    app.add_transform(LinkStdlibNames)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
