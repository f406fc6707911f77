"""robots.txt as RFC 9309 reads it: groups per user agent, longest match wins.

The standard library's ``urllib.robotparser`` predates the RFC: it takes the
first matching rule instead of the longest, and knows neither ``*`` nor
``$`` in paths. This module implements the RFC's matching:

* The crawler obeys the groups whose ``User-agent`` equals its product token
  (case-insensitive; several such groups are merged), else the ``*`` groups,
  else nothing is disallowed.
* Of the rules matching a URL's path (plus query), the longest pattern wins;
  on a tie ``Allow`` wins. ``*`` matches any run of characters, a final ``$``
  anchors the end. ``/robots.txt`` itself is always allowed.
* ``Crawl-delay`` (not in the RFC, widely used) is read from the same groups.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Rule:
    """One Allow or Disallow line."""

    allow: bool
    pattern: str

    def matches(self, path: str) -> bool:
        return pattern_matches(self.pattern, path)


@dataclass
class _Group:
    agents: list[str] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    crawl_delay: float | None = None
    closed: bool = False  # a rule line came: the next user-agent line starts a new group


def pattern_matches(pattern: str, path: str) -> bool:
    """Whether a robots.txt path pattern matches ``path`` (from its start; ``*`` any run of
    characters, a final ``$`` the end).

    The site writes the pattern and, through sitemaps and redirects, chooses the paths, so
    matching must not backtrack: ``/*a*a*a*a*a*a*a*a*a*b`` as a regex took 88 s of CPU on a
    70-character path. Each ``*`` part is found at its leftmost place after the previous one
    (leftmost is never worse for what follows), so a match costs one ``str.find`` per part.
    """
    anchored = pattern.endswith("$")
    first, *rest = (pattern[:-1] if anchored else pattern).split("*")
    if not rest:
        return path == first if anchored else path.startswith(first)
    if not path.startswith(first):
        return False
    at = len(first)
    middle, last = (rest[:-1], rest[-1]) if anchored else (rest, "")
    for part in middle:
        found = path.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return not anchored or (path.endswith(last) and len(path) - len(last) >= at)


def _normalise(path: str) -> str:
    # Compare decoded octets: /a%7Eb and /a~b are the same path.
    return unquote(path)


@dataclass(frozen=True)
class RobotsRules:
    """The rules of one robots.txt that apply to one user agent."""

    rules: tuple[Rule, ...] = ()
    crawl_delay: float | None = None
    sitemaps: tuple[str, ...] = ()

    @classmethod
    def allow_all(cls) -> RobotsRules:
        return cls()

    @classmethod
    def parse(cls, text: str, user_agent: str) -> RobotsRules:
        """Rules of ``text`` for the product token of ``user_agent`` (``ragpipe/0.1 ...``)."""
        token = product_token(user_agent)
        groups: list[_Group] = []
        current: _Group | None = None
        sitemaps: list[str] = []
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if ":" not in line:
                continue
            key, _, value = line.partition(":")
            key, value = key.strip().lower(), value.strip()
            if key == "user-agent":
                if current is None or current.closed:
                    current = _Group()
                    groups.append(current)
                current.agents.append(product_token(value))  # "RagPipe/1.0": ragpipe
            elif key in ("allow", "disallow", "crawl-delay") and current is not None:
                # Any rule line ends the group's user-agent lines, an empty "Disallow:"
                # too (RFC 9309): else "User-agent: ragpipe / Disallow: / User-agent: * /
                # Disallow: /" gave ragpipe the "*" group's Disallow.
                current.closed = True
                if key != "crawl-delay":
                    if value:
                        current.rules.append(Rule(key == "allow", _normalise(value)))
                    continue
                with contextlib.suppress(ValueError):
                    current.crawl_delay = max(0.0, float(value))
            elif key == "sitemap" and value:
                sitemaps.append(value)
        mine = [g for g in groups if token in g.agents]
        if not mine:
            mine = [g for g in groups if "*" in g.agents]
        delays = [g.crawl_delay for g in mine if g.crawl_delay is not None]
        return cls(
            tuple(r for g in mine for r in g.rules),
            max(delays) if delays else None,
            tuple(sitemaps),
        )

    def allowed(self, url: str) -> bool:
        """Whether the crawler may fetch ``url``."""
        parts = urlsplit(url)
        path = _normalise(parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if path == "/robots.txt":
            return True
        best: Rule | None = None
        for rule in self.rules:
            if not rule.matches(path):
                continue
            if (
                best is None
                or len(rule.pattern) > len(best.pattern)
                or (len(rule.pattern) == len(best.pattern) and rule.allow)
            ):
                best = rule
        return best is None or best.allow

    def rule_for(self, url: str) -> Rule | None:
        """The rule that decides ``url`` (for messages), or None when none matches."""
        parts = urlsplit(url)
        path = _normalise(parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        matching = [r for r in self.rules if r.matches(path)]
        return max(matching, key=lambda r: (len(r.pattern), r.allow), default=None)


def product_token(user_agent: str) -> str:
    """``ragpipe/0.1 (+https://...)`` -> ``ragpipe``: what robots.txt groups name."""
    first = user_agent.strip().split()[0] if user_agent.strip() else ""
    return first.split("/", 1)[0].lower()
