"""``discover.ignore``'s globs as regular expressions, read as git's wildmatch reads a
``.gitignore`` pattern (``config.parse_ignore`` splits off the anchoring and the trailing
``/`` first)."""

from __future__ import annotations

import re
from functools import lru_cache

# git's [:class:] names, as its own ctype reads them: ASCII alone, no locale.
POSIX_CLASSES = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "blank": " \\t",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "\\x21-\\x7e",
    "lower": "a-z",
    "print": "\\x20-\\x7e",
    "punct": "\\x21-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7e",
    "space": "\\t\\n\\r ",
    "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
}


@lru_cache(maxsize=256)
def glob_regex(glob: str) -> re.Pattern[str]:
    """The whole-string regex of a glob.

    ``*`` and ``?`` never match ``/``; ``**`` spans folders only as a whole path part
    (``**/x``, ``a/**/b``, ``a/**``; ``***`` is ``**``), elsewhere (``docs/**.md``,
    ``a/**c``) it is ``*``. ``\\`` makes the next character a literal one (``\\#``,
    ``\\*``, ``\\ ``); a ``\\`` that ends the glob is itself (git's never matches).
    ``[...]`` is one character, never ``/``: ``[!...]`` or ``[^...]`` one not listed; a
    ``]`` first in it is listed, not its end; ``a-z`` is a range, ``[:alpha:]`` a class
    of git's (``[[:digit:]_]``; an unknown class never matches). A ``[`` that is never
    closed is itself (git's never matches).
    """
    return re.compile(_translate(glob)[0] + r"\Z", re.DOTALL)


def unknown_classes(glob: str) -> list[str]:
    """The ``[:name:]`` classes in the glob's brackets that git does not know (such a
    bracket never matches)."""
    return list(_translate(glob)[1])


@lru_cache(maxsize=256)
def _translate(glob: str) -> tuple[str, tuple[str, ...]]:
    out = []
    unknown: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            j = i
            while j < n and glob[j] == "*":
                j += 1
            # A run of two or more stars alone between slashes (or the ends) spans
            # folders; git reads any other as one star.
            starts_part = j - i >= 2 and (i == 0 or glob[i - 1] == "/")
            if starts_part and glob.startswith("\\/", j):
                out.append(".*")  # git's **\/: one or more folders, then the escaped /
            elif not starts_part or (j < n and glob[j] != "/"):
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
            bracket, end = _bracket(glob, i + 1, unknown)
            if bracket is None:  # never closed: a literal "["
                out.append(re.escape(c))
                i += 1
            else:
                out.append(bracket)
                i = end
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out), tuple(unknown)


def _bracket(glob: str, start: int, unknown: list[str]) -> tuple[str | None, int]:
    """The regex of the bracket expression whose ``[`` is just before ``start``, and the
    index past its ``]``; (None, start) when no ``]`` closes it. Read as git's wildmatch
    reads one: the first character (after ``!`` or ``^``) is listed even if it is ``]``;
    ``\\`` escapes; ``x-y`` is a range (a ``-`` first, last or after a range is itself,
    and ``x`` is listed even when ``y`` sorts before it); ``[:name:]`` is a class."""
    n = len(glob)
    k = start
    negate = k < n and glob[k] in "!^"
    k += negate
    members: list[str] = []
    prev: str | None = None  # the character a "-" would start a range from
    never = False
    first = True
    while k < n and (glob[k] != "]" or first):
        first = False
        c = glob[k]
        if c == "\\":
            k += 1
            if k == n:
                break
            c = glob[k]
            members.append(re.escape(c))
            prev = c
        elif c == "-" and prev is not None and k + 1 < n and glob[k + 1] != "]":
            k += 1
            high = glob[k]
            if high == "\\":
                k += 1
                if k == n:
                    break
                high = glob[k]
            if prev <= high:
                members.append(f"{re.escape(prev)}-{re.escape(high)}")
            prev = None
        elif (
            c == "["
            and glob.startswith(":", k + 1)
            and (close := glob.find("]", k + 2)) != -1
            and close > k + 2
            and glob[close - 1] == ":"
        ):
            name = glob[k + 2 : close - 1]
            if name in POSIX_CLASSES:
                members.append(POSIX_CLASSES[name])
            else:
                unknown.append(name)
                never = True
            prev = None
            k = close
        else:
            members.append(re.escape(c))
            prev = c
        k += 1
    if k >= n:
        return None, start
    body = "".join(members)
    if never or not body:
        return "(?!)", k + 1
    return (f"[^/{body}]" if negate else f"(?!/)[{body}]"), k + 1
