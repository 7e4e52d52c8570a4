"""The one way the plugin's pages put a value into HTML: every value is escaped unless it is already :class:`Html`.

A page cell written as ``html("<td>{}</td>", value)`` cannot forget to escape ``value`` (the stored XSS of issue 38
was one f-string cell among escaped ones); a fragment built this way is :class:`Html` and nests unescaped.
"""

from __future__ import annotations

import html as _html
import string
from typing import Any


class Html(str):
    """A fragment of HTML whose every value was escaped (by :func:`html`)."""

    __slots__ = ()


class _Escaping(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        text = super().format_field(value, format_spec)
        return text if isinstance(value, Html) else _html.escape(text)


_FORMATTER = _Escaping()


def html(template: str, *values: Any) -> Html:
    """``template`` (HTML written in the code) with each ``{}`` filled by a value, escaped unless it is
    :class:`Html` -- format specs work as in :meth:`str.format` (``{:.3f}``)."""
    return Html(_FORMATTER.vformat(template, values, {}))
