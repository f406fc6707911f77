"""discover.ignore against git itself: the same tree, the same patterns, `git ls-files
--others --ignored` beside ragpipe's discovery. A fixed table of the cases that differed
(each one a finding of the source review), the documented differences with both answers,
and a seeded random fuzz of patterns and trees."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ragpipe.config import DiscoverConfig
from ragpipe.ingest.discover import IgnoreRules, discover

GIT = shutil.which("git")
needs_git = pytest.mark.skipif(
    GIT is None, reason="git is not installed: these tests compare with git's own answers"
)


class Tree:
    """Files under a root, and a git dir outside it (the root holds no .git to ignore)."""

    def __init__(self, base: Path, files: list[str]) -> None:
        self.root = base / "root"
        self.root.mkdir()
        for i, rel in enumerate(files):
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{i}\n")  # distinct bytes: no duplicate_content skip
        self.files = set(files)
        self.git_dir = base / "git"

    def git_ignores(self, patterns: list[str]) -> set[str]:
        """The files git leaves out under these .gitignore patterns (info/exclude)."""
        assert GIT is not None
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.git_dir.parent),
               "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}  # fmt: skip
        if not self.git_dir.exists():
            subprocess.run([GIT, "init", "-q", "--bare", str(self.git_dir)], env=env, check=True)
        (self.git_dir / "info").mkdir(exist_ok=True)
        (self.git_dir / "info" / "exclude").write_text("\n".join(patterns) + "\n", "utf-8")
        listed = subprocess.run(
            [GIT, "-c", f"core.excludesFile={os.devnull}", "-c", "core.ignoreCase=false",
             "-c", "core.bare=false", f"--git-dir={self.git_dir}", f"--work-tree={self.root}",
             "ls-files", "-z", "--others", "--ignored", "--exclude-standard"],
            cwd=self.root, env=env, capture_output=True, check=True,
        ).stdout  # fmt: skip
        return {p for p in listed.decode("utf-8").split("\0") if p}

    def ragpipe_ignores(self, patterns: list[str]) -> set[str]:
        """The files discovery leaves out: neither indexed nor a skip or failure row. Also
        checks that IgnoreRules.ignores (object keys: no walk) says the same of each."""
        result = discover(DiscoverConfig(roots=[self.root], ignore=patterns))
        prefix = f"{self.root.as_posix()}/"
        seen = {r.file_path.removeprefix(prefix) for r in (*result.files, *result.skipped)}
        seen |= {f.file_path.removeprefix(prefix) for f in result.failures}
        walked = self.files - seen
        rules = IgnoreRules(patterns)
        assert {f for f in self.files if rules.ignores(f)} == walked, patterns
        return walked


# (files, pattern): git's answer is ragpipe's. Each group was a finding: what ragpipe
# ignored before is in the comment.
AGREE = [
    # 1. ^ negates a bracket as ! does (x.md was left out: the opposite)
    (["x.md", "y.md", "^.md"], "[^x].md"),
    # 2. dir/**/ is the folders below dir (b/f.md was left out too)
    (["b/f.md", "b/sub/g.md"], "b/**/"),
    # 3. ** spans folders only as a whole part (docs/x/y.md, a/b/c.md, my/dir were left
    # out); *** is ** (y.md was not)
    (["docs/y.md", "docs/x/y.md"], "docs/**.md"),
    (["a/c.md", "a/bc.md", "a/b/c.md"], "a/**c.md"),
    (["mydir", "my/dir", "x/mydir/a.md"], "/**dir"),
    (["y.md", "d/a.md"], "***/**"),
    (["a/c.md", "a/b/c.md", "a/b/d/c.md"], "a/**/c.md"),
    # 4. a backslash escapes (these matched a literal backslash: nothing was left out)
    (["#c.md", "c.md"], r"\#c.md"),
    (["!n.md", "n.md"], r"\!n.md"),
    (["x .md", "x.md"], r"x\ .md"),
    (["q?.md", "qx.md"], r"q\?.md"),
    (["a*", "ab"], r"a\*"),
    (["[x].md", "x.md"], r"\[x].md"),
    (["a.md ", "a.md"], "a.md\\ "),
    # 5. ] first is a member ([]x].md matched nothing), a bracket never matches /
    # (a/b.md was left out), git's classes (they never matched), x-y lists x
    (["x.md", "y.md", "].md"], "[]x].md"),
    (["x.md", "y.md", "].md"], "[!]x].md"),
    (["a/b.md", "a-b.md"], "a[/-]b.md"),
    (["x.md", "1.md", "_.md"], "[[:alpha:]].md"),
    (["x.md", "1.md", "_.md"], "[[:digit:]_].md"),
    (["x.md", "%.md"], "[![:alnum:]].md"),
    (["z.md", "a.md", "m.md"], "[z-a].md"),
    (["x.md"], "[[:foo:]].md"),
    # 7. a ! that does not start the pattern is a name's
    (["!keep.md", "d/!keep.md"], "/!keep.md"),
    # and the basics
    (["a/b/c.log", "c.md"], "*.log"),
    (["drafts/x.md", "d/drafts/y.md", "drafts.md"], "drafts/"),
    (["drafts/x.md", "d/drafts/y.md"], "/drafts"),
    (["a/b/c.md", "a/c.md"], "a/*"),
]


@needs_git
@pytest.mark.parametrize(("files", "pattern"), AGREE)
def test_ignore_globs_agree_with_git(tmp_path: Path, files: list[str], pattern: str) -> None:
    tree = Tree(tmp_path, files)
    assert tree.ragpipe_ignores([pattern]) == tree.git_ignores([pattern])


# (files, pattern, ragpipe's answer, git's): the differences docs/how-to/ingest.md lists.
DIFFER = [
    # a non-ASCII character is one character (git matches bytes: é is two)
    (["e.md", "é.md"], "?.md", {"e.md", "é.md"}, {"e.md"}),
    (["e.md", "é.md"], "[!e].md", {"é.md"}, set()),
    # a [ or a \ that ends nothing is itself (git's pattern matches nothing)
    (["[ab.md", "a.md"], "[ab.md", {"[ab.md"}, set()),
    (["a\\", "a"], "a\\", {"a\\"}, set()),
    # a # or ! that starts a pattern is a name's (git: a comment, a negation)
    (["#c.md", "c.md"], "#c.md", {"#c.md"}, set()),
    (["!x.md", "x.md"], "!x.md", {"!x.md"}, set()),
    # ./ anchors as / does; slashes repeated at either end count as one; a leading space
    # is dropped
    (["b.md", "d/b.md"], "./b.md", {"b.md"}, set()),
    (["foo/a.md", "x/foo/a.md"], "foo//", {"foo/a.md", "x/foo/a.md"}, set()),
    (["a.md", "d/a.md"], "//a.md", {"a.md"}, set()),
    ([" a.md", "a.md"], " a.md", {"a.md"}, {" a.md"}),
    # ** after a literal start of the pattern (git's prefix shortcut reads a**/c as
    # a + **/c, against its own documentation)
    (["ab/c", "a/b/c", "a/c"], "a**/c", {"ab/c", "a/c"}, {"ab/c", "a/b/c", "a/c"}),
]


@pytest.mark.parametrize(("files", "pattern", "ours", "gits"), DIFFER)
def test_the_documented_differences_from_git(
    tmp_path: Path, files: list[str], pattern: str, ours: set[str], gits: set[str]
) -> None:
    tree = Tree(tmp_path, files)
    assert tree.ragpipe_ignores([pattern]) == ours
    if GIT is not None:  # and git answers as the docs say it does
        assert tree.git_ignores([pattern]) == gits


NAMES = ["a", "b", "ab", "ba", ".h", "x y", "[x]", "é", "a.md", "b.md", "dir", "#c", "!n",
         "a b.md", "x\\y", "foo", "c*", "q?", "]", "^", "-", "A", "1", "_"]  # fmt: skip
ATOMS = ["a", "b", "ab", "*", "**", "?", "[a-b]", "[!a]", "[^a]", "[]x]", "[[:alpha:]]",
         "[[:digit:]_]", "[z-a]", "a[/-]b", ".h", "é", "x y", "dir", "md", ".md", r"\#c",
         r"\!n", r"x\ y", r"\[x]", r"\*", "foo", r"q\?", "c*", r"x\\y", "A"]  # fmt: skip


def _random_tree(rng: np.random.Generator, folder: str = "", depth: int = 0) -> list[str]:
    files: list[str] = []
    for name in dict.fromkeys(rng.choice(NAMES, size=int(rng.integers(2, 6)))):
        rel = f"{folder}{name}"
        if depth < 3 and rng.random() < 0.4:
            files += _random_tree(rng, f"{rel}/", depth + 1)
        else:
            files.append(rel)
    return files


def _random_pattern(rng: np.random.Generator) -> str:
    while True:
        parts = ["".join(rng.choice(ATOMS, size=int(rng.integers(1, 3))))
                 for _ in range(int(rng.integers(1, 4)))]  # fmt: skip
        if rng.random() < 0.2:
            parts.insert(int(rng.integers(0, len(parts) + 1)), "**")
        pattern = "/".join(parts)
        if not _git_prefix_shortcut(pattern):  # a documented difference (DIFFER)
            break
    if rng.random() < 0.25:
        pattern = "/" + pattern
    if rng.random() < 0.25:
        pattern += "/"
    return pattern


def _git_prefix_shortcut(pattern: str) -> bool:
    """Whether git reads a ** after the pattern's literal start as a whole part."""
    start = next((i for i, c in enumerate(pattern) if c in "*?[\\"), len(pattern))
    return pattern.startswith("**", start) and start > 0 and pattern[start - 1] != "/"


def _explained(path: str, patterns: list[str]) -> bool:
    """A difference on a non-ASCII name under a ? or a bracket: git matches bytes."""
    return not path.isascii() and any("?" in p or "[" in p for p in patterns)


@needs_git
@pytest.mark.parametrize("seed", range(5))
def test_random_ignore_globs_agree_with_git(tmp_path: Path, seed: int) -> None:
    """40 random pattern lists of one or two patterns on each of five random trees."""
    rng = np.random.default_rng(seed)
    files = []
    while len(files) < 12:
        files = _random_tree(rng)
    tree = Tree(tmp_path, files)
    for _ in range(40):
        patterns = [_random_pattern(rng) for _ in range(int(rng.integers(1, 3)))]
        ours, gits = tree.ragpipe_ignores(patterns), tree.git_ignores(patterns)
        unexplained = {p for p in ours ^ gits if not _explained(p, patterns)}
        assert not unexplained, (patterns, sorted(ours - gits), sorted(gits - ours))
