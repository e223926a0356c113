"""Sphinx configuration of the API reference (docs/api): what a plugin author may import.

Built in CI with warnings as errors and ``nitpicky = True`` (tools/dev.sh, and
tests/unit/test_api_docs.py under plain pytest), so a public name without a docstring, or a
signature naming a type the reference does not document, fails the build instead of rotting.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# the source tree, not an installed copy, is what gets documented
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

project = "harness"
author = "harness contributors"
root_doc = "index"
extensions = ["sphinx.ext.autodoc"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
# hookspecs.py imports Run only for type checking; this names it for the signatures
autodoc_type_aliases = {"Run": "harness.runtime.Run", "Tensor": "harness.api.Tensor"}

nitpicky = True

# Types from outside harness have no page here (no intersphinx: the build must work offline).
# A harness type missing from the reference is still an error.
nitpick_ignore_regex = [
    ("py:.*", r"(numpy|np|collections\.abc|contextlib|abc|pathlib|concurrent\.futures)(\..+)?"),
    ("py:.*", r"(argparse|logging)(\..+)?"),
]
nitpick_ignore = [
    # type variables of generic classes
    ("py:class", "harness.remote.T"),
    ("py:obj", "harness.remote.T"),
    ("py:class", "harness.registry.R"),
    ("py:obj", "harness.registry.R"),
    # what connect() returns: a private wrapper of the Client, documented in words
    ("py:class", "harness.remote._Connection"),
    # harness.commands' signatures: public modules (harness.public) without a page of their own
    ("py:class", "harness.config.Config"),
    ("py:class", "harness.plugins.HarnessPluginManager"),
]


def _readable_signature(
    app: object,
    what: str,
    name: str,
    obj: object,
    options: object,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None]:
    """Signatures Sphinx would garble: a dataclass field with a default factory shows as
    ``= <factory>``, which is not Python, so Sphinx would split the signature at every comma
    and cross-reference the pieces."""
    if signature is not None:
        signature = signature.replace("= <factory>", "= ...")
        # an alias nested in a generic comes out as its repr (Sphinx 9: Sequence[Tensor])
        signature = re.sub(r"TypeAliasForwardRef\('([\w.]+)'\)", r"\1", signature)
    return signature, return_annotation


def setup(app: object) -> None:
    app.connect("autodoc-process-signature", _readable_signature)  # type: ignore[attr-defined]
