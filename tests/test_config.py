from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragpipe import yamlio
from ragpipe.config import (
    ChunkConfig,
    ChunkerKind,
    DiscoverConfig,
    PdfMode,
    RagpipeConfig,
    fingerprint,
    load_config,
)
from ragpipe.errors import ConfigError


def test_defaults_without_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config()
    assert cfg.convert.pdf_mode is PdfMode.FAST
    assert cfg.chunk.chunker is ChunkerKind.RECURSIVE
    assert (cfg.chunk.size, cfg.chunk.overlap, cfg.chunk.window) == (1000, 150, 3)
    assert cfg.discover.roots == [Path("data/sample")]


def test_yaml_then_environment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("chunk:\n  size: 500\n  overlap: 50\nconvert:\n  pdf_mode: auto\n")
    monkeypatch.setenv("RAGPIPE_CHUNK__SIZE", "700")
    cfg = load_config(path)
    assert cfg.chunk.size == 700  # env beats YAML
    assert cfg.chunk.overlap == 50  # YAML beats default
    assert cfg.convert.pdf_mode is PdfMode.AUTO


def test_overlap_not_below_size_names_fields(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("chunk:\n  size: 100\n  overlap: 100\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "chunk" in message and "overlap (100) must be smaller than size (100)" in message


def test_bad_value_names_field_env_and_description(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("chunk:\n  size: -5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "chunk.size" in message
    assert "RAGPIPE_CHUNK__SIZE" in message
    assert "maximum chunk size in characters" in message


def test_unknown_field_lists_valid_names(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("chunk:\n  sise: 10\n")
    with pytest.raises(ConfigError, match=r"chunk.sise: unknown field; valid names here: .*size"):
        load_config(path)


def test_bad_enum_and_regex(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("convert:\n  pdf_mode: turbo\nclean:\n  extra_patterns: ['(unclosed']\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "convert.pdf_mode" in str(err.value) and "turbo" in str(err.value)
    assert "invalid regular expression '(unclosed'" in str(err.value)
    # A pattern matching the empty string dropped every body line: headings alone indexed.
    path.write_text("clean:\n  extra_patterns: ['^DRAFT', 'Confidential|']\n")
    with pytest.raises(
        ConfigError,
        match=r"clean.extra_patterns: .*extra_patterns\[1\] "
        r"'Confidential\|' matches an empty stretch of any line, so it would drop every line",
    ):
        load_config(path)
    for pattern, refused in (("(?=.)", True), ("x*", True), (".*", True), ("[^|]*", True),
                             ("^$", False), ("^\\s*$", False)):  # fmt: skip
        path.write_text(f"clean:\n  extra_patterns: ['{pattern}']\n")
        if refused:
            with pytest.raises(ConfigError, match="would drop every line"):
                load_config(path)
        else:
            assert load_config(path).clean.extra_patterns == [pattern]


def test_missing_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("chunk: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)


def test_a_key_written_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"  # PyYAML alone keeps the second block: chunk.size 1000 again
    path.write_text("chunk:\n  size: 500\nembed:\n  batch_size: 8\nchunk:\n  overlap: 50\n")
    with pytest.raises(ConfigError, match=r"r.yaml: key 'chunk' is written twice in one mapping "
                       r"\(lines 1 and 5\)"):  # fmt: skip
        load_config(path)
    merged = "base: &base {size: 500, overlap: 50}\nchunk:\n  <<: *base\n  size: 800\n"
    loaded = yamlio.load(merged, "config", yamlio.CONFIG_LIMIT)  # a merged key may be overridden
    assert loaded["chunk"] == {"size": 800, "overlap": 50}
    # A merge source that itself merges and overrides is flattened before it is built:
    # its inherited 'size' beside its own is no duplicate; nor is a bare '=' key.
    nested = "d: &d {size: 500}\nenvs:\n  dev: &dev\n    <<: *d\n    size: 800\nprod: {<<: *dev}\n"
    assert yamlio.load(nested, "config", yamlio.CONFIG_LIMIT)["prod"] == {"size": 800}
    assert yamlio.load("=: a\nb: c\n", "config", yamlio.CONFIG_LIMIT) == {"=": "a", "b": "c"}


def test_fingerprint_tracks_config_and_version() -> None:
    a = RagpipeConfig()
    b = RagpipeConfig(chunk={"size": 900})
    assert fingerprint(a.chunk, "1") == fingerprint(RagpipeConfig().chunk, "1")
    assert fingerprint(a.chunk, "1") != fingerprint(b.chunk, "1")
    assert fingerprint(a.chunk, "1") != fingerprint(a.chunk, "2")


def test_example_config_loads_and_yaml_off_means_off(tmp_path: Path) -> None:
    example = load_config(Path(__file__).resolve().parents[1] / "ragpipe.example.yaml")
    assert example.retrieve.hyde == "off" and example.llm.provider == "llamacpp"
    # Copied as its header says, it keeps the default ignores (it dropped .venv's and
    # node_modules').
    assert set(DiscoverConfig().ignore) <= set(example.discover.ignore)
    path = tmp_path / "ragpipe.yaml"
    path.write_text("retrieve:\n  hyde: off\n  mode: dense\n", encoding="utf-8")
    assert load_config(path).retrieve.hyde == "off"  # YAML reads a bare `off` as false
    path.write_text("retrieve:\n  sparse_engine: rank_bm25\n  fusion: qdrant\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"retrieve\.fusion 'qdrant' computes only"):
        load_config(path)
    path.write_text("retrieve:\n  prefetch_mul: 4\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"set e\.g\. prefetch: 40"):
        load_config(path)


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("chunk: [unclosed\n", ["not valid YAML"]),
        ("chunk:\n  chunker: semantic\n", ["chunk.chunker", "semantic", "recursive"]),
        ("chunk:\n  size: 500\n  overlap: 500\n", ["overlap (500) must be smaller than size"]),
        ("llm:\n  model: /nowhere/model.gguf\n", ["llm", "/nowhere/model.gguf does not exist"]),
        ("eval:\n  judge:\n    model: /nowhere/judge.gguf\n", ["eval.judge", "does not exist"]),
        ("store:\n  retries: -1\n", ["store.retries", "greater than or equal to 0"]),
    ],
)
def test_config_mistakes_stop_the_cli_before_any_work(
    tmp_path: Path, yaml_text: str, expected: list[str]
) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    config = tmp_path / "ragpipe.yaml"
    config.write_text(yaml_text + f"paths:\n  work_dir: {tmp_path / 'work'}\n")
    if yaml_text.startswith("chunk: [unclosed"):
        config.write_text(yaml_text)
    result = CliRunner().invoke(app, ["ingest", "--config", str(config)])
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())  # rich wraps long lines at the terminal width
    for text in expected:
        assert text in output
    assert "Traceback" not in result.output
    assert not (tmp_path / "work").exists()  # nothing started


def test_tests_reach_loopback_only() -> None:
    """The autouse guard in conftest: a connection beyond loopback fails at once."""
    import socket

    with socket.socket() as sock, pytest.raises(OSError, match=r"loopback only, not 192\.0\.2\.1"):
        sock.connect(("192.0.2.1", 80))  # TEST-NET-1: never routed
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())  # loopback is allowed


def test_the_quality_profile_loads_with_its_measured_settings() -> None:
    profile = load_config(Path(__file__).resolve().parents[1] / "ragpipe.quality.yaml")
    assert profile.embed.model == "all-mpnet-base-v2"
    assert profile.chunk.tokenizer == "all-mpnet-base-v2" and profile.chunk.max_tokens == 384
    assert profile.retrieve.alpha == 0.7 and not profile.chunk.whole_sections


def test_paths_expand_home_and_an_empty_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`~/docs` was a folder named "~" for pathlib (a missing root; a './~' tree made, whose
    checkpoints pyarrow wrote under $HOME instead: a traceback); "" was ".", so an empty root
    indexed the whole working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "r.yaml"
    path.write_text(
        "discover: {roots: ['~/docs']}\nstore: {path: ~/store}\npaths: {work_dir: ~/work}\n"
        "eval: {golden: ~/g.yaml, reports_dir: ~/reports}\n"
    )
    cfg = load_config(path)
    assert cfg.discover.roots == [tmp_path / "docs"]
    assert (cfg.store.path, cfg.paths.work_dir) == (tmp_path / "store", tmp_path / "work")
    assert (cfg.eval.golden, cfg.eval.reports_dir) == (tmp_path / "g.yaml", tmp_path / "reports")
    # "~name" is a folder of that name, not a user's home ('~backup' was /var/backups, and
    # '~nosuchuser/docs' a traceback).
    path.write_text("discover: {roots: ['~backup', '~nosuchuser/docs']}\n")
    assert load_config(path).discover.roots == [Path("~backup"), Path("~nosuchuser/docs")]

    def homeless(self: Path) -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "expanduser", homeless)  # no HOME, no passwd entry
    path.write_text("discover: {roots: ['~/docs']}\n")
    with pytest.raises(ConfigError, match=r"discover.roots.0: cannot expand '~'"):
        load_config(path)
    for field, text in [("discover.roots.0", "discover: {roots: ['']}"),
                        ("store.path", "store: {path: ''}"),
                        ("paths.work_dir", "paths: {work_dir: ' '}")]:  # fmt: skip
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=rf"{field}: is empty: give a path"):
            load_config(path)


def test_a_list_in_the_environment_not_written_as_json_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RAGPIPE_DISCOVER__IGNORE='*.tmp' was a traceback (pydantic-settings' SettingsError),
    or 'invalid configuration (from the command line)' when an option was given."""
    monkeypatch.setenv("RAGPIPE_DISCOVER__IGNORE", "*.tmp")
    for overrides in (None, {"retrieve": {"mode": "dense"}}):
        with pytest.raises(
            ConfigError,
            match=r"from the environment: RAGPIPE_DISCOVER__IGNORE\)"
            r".*written as JSON, e\.g\. RAGPIPE_DISCOVER__IGNORE='\[\"\*\.tmp\"\]'",
        ):
            load_config(None, overrides)  # fmt: skip
    monkeypatch.setenv("RAGPIPE_DISCOVER__IGNORE", '["*.tmp"]')
    assert load_config(None).discover.ignore == ["*.tmp"]


def test_a_mistake_in_the_file_is_the_files_when_an_option_sets_the_same_section(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("retrieve:\n  prefetch_mul: 4\n")
    for overrides in ({"retrieve": {}}, {"retrieve": {"mode": "dense"}}):
        with pytest.raises(ConfigError) as err:
            load_config(path, overrides)
        assert f"(from {path}" in str(err.value) and "command line" not in str(err.value)
    path.write_text("retrieve:\n  mode: dense\n")
    with pytest.raises(ConfigError, match=r"from the command line"):
        load_config(path, {"retrieve": {"top_k": 0}})  # the option's own mistake


def test_a_variable_that_sets_nothing_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAGPIPE_CHUNK_SIZE", "5")  # one underscore: passed by in silence
    monkeypatch.setenv("RAGPIPE_CHUNKS__SIZE", "5")  # no such section
    monkeypatch.setenv("RAGPIPE_MODEL_CACHE", "/tmp/models")  # not a setting, but known
    with caplog.at_level("WARNING", logger="ragpipe.config"):
        assert load_config(None).chunk.size == ChunkConfig().size
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all("sets nothing" in w for w in warned)
    assert "RAGPIPE_CHUNKS__SIZE sets nothing" in warned[0] and "RAGPIPE_CHUNK_SIZE" in warned[1]


def test_a_section_as_json_sets_it_and_a_mistake_is_blamed_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """RAGPIPE_CHUNK='{...}' (pydantic-settings reads a section as JSON) was warned about as
    setting nothing; an option's own mistake was blamed on the file when the option also
    mended the file's."""
    monkeypatch.setenv("RAGPIPE_CHUNK", '{"size": 500, "overlap": 50}')
    with caplog.at_level("WARNING", logger="ragpipe.config"):
        assert load_config(None).chunk.size == 500
    assert "sets nothing" not in caplog.text
    monkeypatch.setenv("RAGPIPE_CHUNK", "{not json")
    with pytest.raises(ConfigError, match=r"from the environment: RAGPIPE_CHUNK\)"):
        load_config(None)
    monkeypatch.delenv("RAGPIPE_CHUNK")
    path = tmp_path / "r.yaml"
    path.write_text("chunk: {overlap: 1200}\n")  # invalid alone: overlap over the size
    overrides = {"chunk": {"size": 2000}, "retrieve": {"top_k": -5}}
    with pytest.raises(ConfigError, match=r"(?s)from the command line\).*retrieve\.top_k"):
        load_config(path, overrides)


def _refused(path: Path, text: str, message: str) -> ConfigError:
    """Load ``text`` written to ``path``: refused with ``message`` (a regex)."""
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    return err.value


def test_a_web_url_in_roots_is_a_page_to_fetch(tmp_path: Path) -> None:
    """An https:// root was the local path https:/example.org/docs (a missing root, or a
    folder of that name), where an s3:// one moved to object_roots and the CLI's sources
    put a web URL in discover.urls."""
    path = tmp_path / "r.yaml"
    path.write_text(
        'discover:\n  roots: [docs, "https://example.org/docs", "s3://b/x"]\n'
        '  urls: ["https://example.org/a"]\n'
    )
    cfg = load_config(path).discover
    assert cfg.roots == [Path("docs")]
    assert cfg.urls == ["https://example.org/a", "https://example.org/docs"]
    assert cfg.object_roots == ["s3://b/x"]
    only = DiscoverConfig(roots=["HTTP://example.org/"])  # type: ignore[list-item]
    assert (only.roots, only.urls) == ([], ["HTTP://example.org/"])
    # "urls:" left empty (None) took a TypeError traceback; a string is named as it is.
    path.write_text('discover:\n  roots: ["https://x.org/docs"]\n  urls:\n')
    assert load_config(path).discover.urls == ["https://x.org/docs"]
    _refused(
        path,
        'discover:\n  roots: ["https://x.org/docs"]\n  urls: "https://y.org/"\n',
        r"discover\.urls: Input should be a valid list",
    )
    _refused(
        path,
        'discover:\n  roots: ["ftp://example.org/docs"]\n',
        r"discover\.urls.*'ftp://example\.org/docs' is not an",
    )


def test_the_variable_a_config_error_names_is_one_that_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list item's hint was RAGPIPE_DISCOVER__ROOTS__0 (it sets nothing), a whole
    section's check (embed without a model) RAGPIPE_EMBED, not RAGPIPE_EMBED__MODEL."""
    path = tmp_path / "r.yaml"
    path.write_text("discover: {roots: [2024]}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "or RAGPIPE_DISCOVER__ROOTS (the whole list, as JSON)." in str(err.value)
    assert "__0" not in str(err.value)
    monkeypatch.setenv("RAGPIPE_DISCOVER__ROOTS", '["docs"]')  # and that one works
    assert load_config(path).discover.roots == [Path("docs")]
    _refused(
        path, "embed: {provider: openai}\n", r"set it in the YAML file or RAGPIPE_EMBED__MODEL$"
    )
    monkeypatch.setenv("RAGPIPE_EMBED__MODEL", "text-embedding-3-small")
    assert load_config(path).embed.model == "text-embedding-3-small"
    _refused(
        path,
        "chunk: {size: 100, overlap: 100}\n",
        r"or RAGPIPE_CHUNK__SIZE or RAGPIPE_CHUNK__OVERLAP$",
    )


def test_a_golden_set_given_in_a_section_variable_is_named_as_its_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RAGPIPE_EVAL='{"golden": ...}' over a file's eval.golden: the missing set was said to
    come "(from ragpipe.yaml)", and "see eval/README.md", a file no init project has."""
    from ragpipe.evaluation.run import load_golden_from

    path = tmp_path / "ragpipe.yaml"
    path.write_text("eval: {golden: eval/golden/mine.yaml, depth: 20}\n")
    monkeypatch.setenv("RAGPIPE_EVAL", json.dumps({"golden": str(tmp_path / "nope.yaml")}))
    cfg = load_config(path)
    assert (cfg.origin("eval.golden"), cfg.origin("eval.depth")) == ("RAGPIPE_EVAL", str(path))
    with pytest.raises(ConfigError) as err:
        load_golden_from(cfg)
    assert str(err.value) == (
        f"golden set {tmp_path / 'nope.yaml'} not found (from RAGPIPE_EVAL): pass --golden "
        "(eval.golden) with your golden set; its format: docs/reference/golden-format.md"
    )


def test_a_yaml_boolean_is_no_number(tmp_path: Path) -> None:
    """`chunk: {size: true}` loaded as size 1 (pydantic reads a boolean as 1 or 0 for a
    number): one-character chunks, and not a word said."""
    path = tmp_path / "r.yaml"
    for text, field in [("chunk: {size: true}", "chunk.size"),
                        ("retrieve: {top_k: false}", "retrieve.top_k"),
                        ("index: {gate: {golden: [g.yaml], max_drop: true}}",
                         "index.gate.max_drop")]:  # fmt: skip
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=rf"{field}: write a number, not (true|false)"):
            load_config(path)
    path.write_text("chunk: {size: 500}\ndiscover: {follow_symlinks: true}\n")
    cfg = load_config(path)  # numbers and real booleans load as before
    assert (cfg.chunk.size, cfg.discover.follow_symlinks) == (500, True)
