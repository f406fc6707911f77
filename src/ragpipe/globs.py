"""``discover.ignore``'s globs as regular expressions, read as git's wildmatch reads a
``.gitignore`` pattern (``config.parse_ignore`` splits off the anchoring and the trailing
``/`` first)."""

from __future__ import annotations

import fnmatch
import re
from functools import lru_cache


@lru_cache(maxsize=256)
def glob_regex(glob: str) -> re.Pattern[str]:
    """The whole-string regex of a glob.

    ``*`` and ``?`` never match ``/``; ``**`` spans folders only as a whole path part
    (``**/x``, ``a/**/b``, ``a/**``; ``***`` is ``**``), elsewhere (``docs/**.md``,
    ``a/**c``) it is ``*``. ``\\`` makes the next character a literal one (``\\#``,
    ``\\*``, ``\\ ``); a ``\\`` that ends the glob is itself (git's never matches).
    """
    return re.compile(translate(glob) + r"\Z", re.DOTALL)


def translate(glob: str) -> str:
    """The regex source of a glob, unanchored (see ``glob_regex``)."""
    out = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            j = i
            while j < n and glob[j] == "*":
                j += 1
            # A run of two or more stars alone between slashes (or the ends) spans
            # folders; git reads any other as one star.
            alone = (i == 0 or glob[i - 1] == "/") and (j == n or glob[j] == "/")
            if j - i >= 2 and (i == 0 or glob[i - 1] == "/") and glob.startswith("\\/", j):
                out.append(".*")  # git's **\/: one or more folders, then the escaped /
            elif j - i < 2 or not alone:
                out.append("[^/]*")
            elif j == n:
                out.append(".*")
            else:  # **/: no folders, or any number of them
                out.append("(?:.*/)?")
                j += 1
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 2
        elif c == "[":
            end = glob.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
                i += 1
            else:
                out.append(fnmatch.translate(glob[i : end + 1])[4:-3])
                i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)
