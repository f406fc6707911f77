"""`ragpipe search` and `ragpipe ask` on a real index and the real model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.config import RagpipeConfig

pytestmark = pytest.mark.integration

runner = CliRunner()


def _index(cfg: RagpipeConfig) -> list[str]:
    return ["--store-path", str(cfg.store.path), "--embedder", "onnx"]


def test_search_formats_and_filters(indexed_edge: RagpipeConfig) -> None:
    args = ["search", "How do I restore the database?", *_index(indexed_edge), "-k", "2"]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert text.output.startswith("1. ") and "backups" in text.output.splitlines()[0]
    as_json = runner.invoke(app, [*args, "--format", "json", "--mode", "dense"])
    data = json.loads(as_json.output)
    assert len(data["hits"]) == 2 and data["trace"]["mode"] == "dense"
    assert set(data["hits"][0]["scores"]) >= {"dense", "retrieval"}
    xml = runner.invoke(app, [*args, "--format", "xml", "--filter", "file=backups-copy.md"])
    # The copy is one chunk (its title opens its one section's chunk): one source, no other file.
    assert xml.output.startswith("<retrieved_context>") and xml.output.count("<source ") == 1
    assert "backups-copy.md" in xml.output and "backups.md" not in xml.output


def test_search_errors_exit_2_with_a_message(indexed_edge: RagpipeConfig, tmp_path: Any) -> None:
    bad_filter = runner.invoke(app, ["search", "x", *_index(indexed_edge), "--filter", "page=3"])
    assert bad_filter.exit_code == 2 and "file=SUFFIX" in bad_filter.output
    no_index = runner.invoke(app, ["search", "x", "--store-path", str(tmp_path / "nothing")])
    assert no_index.exit_code == 2 and "ragpipe ingest" in no_index.output
    # A second value of one key replaced the first, and an empty one was ignored: results
    # the filters never allowed. Bytes that are no UTF-8 crashed the tokenizer (exit 1).
    for filters, said in (
        (["file=backups.md", "file=bread.md"], "given twice"),
        (["file="], "give a value"),
    ):
        args = [f"--filter={f}" for f in filters]
        result = runner.invoke(app, ["search", "x", *_index(indexed_edge), *args])
        assert result.exit_code == 2 and said in result.output, result.output
    for command in ("search", "ask"):
        result = runner.invoke(app, [command, "bread \udcff\udcfe oven", *_index(indexed_edge)])
        assert result.exit_code == 2 and "not UTF-8" in result.output, result.output


def test_ask_streams_an_answer_and_lists_sources(indexed_edge: RagpipeConfig) -> None:
    args = ["ask", "How long should bread bake?", *_index(indexed_edge), "-k", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "sources" in result.output and "bread.md" in result.output
    assert "SmolLM2-135M-Instruct.Q4_1:" in result.output
    as_json = runner.invoke(app, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["question"] == "How long should bread bake?"
    assert data["sources"][0]["file_path"].endswith("bread.md")
    assert data["retrieval"]["top_k"] == 2


def test_version_prints_the_installed_package_version() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"ragpipe {version('ragpipe')}"


def test_ask_reprints_the_checked_answer_when_it_differs_from_the_stream(
    indexed_edge: RagpipeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An invented [9] was streamed to the terminal and the checked answer (without it)
    never shown; the warning said the citation was removed from a text still showing it."""
    from ragpipe.models.llm import Completion
    from ragpipe.query.retrieve import Retriever

    class Inventing:
        name, takes_grammar = "inventing", False

        def chat(self, messages: Any, on_token: Any = None, **options: Any) -> Completion:
            text = "Bake it for 35 minutes [1] on a rack [9]."
            if on_token is not None:
                on_token(text)
            return Completion(text, 10, 10, self.name, 0.01, "stop")

        def count_tokens(self, text: str) -> int:
            return len(text) // 4

    monkeypatch.setattr(Retriever, "llm", property(lambda self: Inventing()))
    args = ["ask", "How long should bread bake?", *_index(indexed_edge), "-k", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    streamed, checked = result.output.split("the answer, as checked (it replaces the text above):")
    assert "[9]" in streamed and checked.strip().startswith("Bake it for 35 minutes [1] on a rack.")
    assert "[9]" not in checked.split("cited sources")[0]


def test_an_index_of_another_embedder_is_named_as_the_user_gave_it(
    indexed_edge: RagpipeConfig,
) -> None:
    """The error named the reader's private copy (.../readers/25157-…), a folder the user
    never gave and that is gone once the error is read."""
    from ragpipe.errors import ConfigError
    from ragpipe.store import open_reader

    with pytest.raises(ConfigError) as err:
        open_reader(indexed_edge.store, "some-other-model")
    message = str(err.value)
    assert f"the index at {indexed_edge.store.path} (published version " in message
    assert "readers" not in message and "some-other-model" in message
