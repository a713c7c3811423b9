"""Text that reaches people: free text from outside made safe for a terminal. Pure.

A runtime's report carries an error message its agent read from the cluster (`lastError`); the
broker stores it in the mapping's status, puts it in the `Connected` condition and in Events, all
of which operators read with `kubectl` in a terminal. Escape sequences (ESC), BEL, carriage
returns and backspaces rewrite what the terminal shows; bidi overrides (U+202E) and isolates
reverse what the eye reads. So every character that is not printable goes, whatever its source:
control characters (Unicode Cc), format characters (Cf: bidi controls, zero-width characters),
line and paragraph separators, surrogates, private and unassigned code points; whitespace
(tab, newline, CR, no-break and other spaces) becomes a plain space.
"""

from __future__ import annotations

import unicodedata

_SPACES = frozenset("\t\n\r\v\f")


def for_humans(text: str) -> str:
    """`text` without characters that can change how a terminal shows it."""
    if text.isascii() and text.isprintable():
        return text  # the usual case, at no cost
    return "".join(ch if ch.isprintable() else " " if _is_space(ch) else "" for ch in text)


def _is_space(ch: str) -> bool:
    return ch in _SPACES or unicodedata.category(ch) == "Zs"
