"""The page template (``report.html``, package data) and the two ways of filling it.

``{{name}}`` takes text, escaped here; ``{{{name}}}`` takes :class:`Html`, markup made by
:meth:`Template.block` from the same file. So every tag on the page is in ``report.html`` and
Python only chooses, repeats and escapes: no markup is built from strings in Python, and a value
can only reach the page raw if it came out of a block.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources

TEMPLATE_FILE = "report.html"

_BLOCK = re.compile(r"<!--block:(?P<name>[a-z_]+)-->\n(?P<body>.*?)\n?<!--endblock-->", re.S)
_SLOT = re.compile(r"\{\{\{(?P<raw>[a-z_0-9]+)\}\}\}|\{\{(?P<text>[a-z_0-9]+)\}\}")


class Html(str):
    """Markup that came out of a template block: inserted as is by ``{{{name}}}``."""

    __slots__ = ()


def join(parts: Iterable[Html]) -> Html:
    """Fragments one after another, still markup."""
    return Html("\n".join(parts))


def fill(text: str, values: Mapping[str, object]) -> Html:
    """``text`` with its slots filled from ``values``. Every slot needs a value and every value
    a slot: a misspelt name is a bug to see at once, not a blank on the page."""
    used: set[str] = set()

    def one(match: re.Match[str]) -> str:
        raw, name = match.group("raw"), match.group("text")
        key = raw or name
        if key not in values:
            raise KeyError(f"{TEMPLATE_FILE}: no value for slot {key!r}")
        used.add(key)
        value = values[key]
        if raw:
            if not isinstance(value, Html):
                raise TypeError(f"{TEMPLATE_FILE}: {{{{{{{key}}}}}}} takes Html, not {value!r:.60}")
            return value
        return html.escape(str(value), quote=True)

    out = _SLOT.sub(one, text)
    unused = set(values) - used
    if unused:
        raise KeyError(f"{TEMPLATE_FILE}: values without a slot: {sorted(unused)}")
    return Html(out)


class Template:
    """``report.html`` split into the page and its named blocks."""

    def __init__(self, text: str) -> None:
        first = _BLOCK.search(text)
        self.page = text[: first.start()] if first else text
        self.blocks = {m.group("name"): m.group("body") for m in _BLOCK.finditer(text)}

    def block(self, block: str, /, **values: object) -> Html:
        return fill(self.blocks[block], values)

    def render(self, **values: object) -> str:
        return fill(self.page, values)


@cache
def load() -> Template:
    """The packaged template (read once per process)."""
    text = resources.files("harness_report").joinpath(TEMPLATE_FILE).read_text(encoding="utf-8")
    return Template(text)
