"""`ragpipe init` (a project folder that loads and deploys) and `ragpipe inspect` (what the
index holds) on a real index, Qdrant Edge and qdrant-client local mode."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.config import RagpipeConfig, load_config
from ragpipe.errors import ConfigError
from ragpipe.evaluation.golden import load_golden

runner = CliRunner()


def test_init_writes_a_project_that_loads_deploys_and_is_never_overwritten(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "team"
    result = runner.invoke(app, ["init", str(folder), "--roots", "docs", "--roots", "/srv/wiki",
                                 "--name", "team-faq"])  # fmt: skip
    assert result.exit_code == 0, result.output
    written = ["ragpipe.yaml", "eval/golden/team-faq.yaml", "prefect.yaml"]
    assert [line.removeprefix("wrote ") for line in result.output.splitlines()[:3]] == [
        str(folder / name) for name in written
    ]
    assert "ragpipe ingest --config ragpipe.yaml" in result.output
    # The configuration loads as written, with the roots and paths it names.
    cfg = load_config(folder / "ragpipe.yaml")
    assert cfg.discover.roots == [Path("docs"), Path("/srv/wiki")]
    assert (cfg.store.path, cfg.paths.work_dir) == (Path("data/store"), Path("data/work"))
    assert cfg.eval.golden == Path("eval/golden/team-faq.yaml")
    # The golden template has no items until a person writes them ...
    with pytest.raises(ConfigError, match="has no items"):
        load_golden(folder / written[1])
    # ... and its commented examples are a valid set once uncommented.
    text = (folder / written[1]).read_text(encoding="utf-8")
    # (the examples only: the header's comment is no key, and the set refuses unknown keys)
    head, examples = text.replace("items: []\n", "").split("\n# items:\n")
    examples = ("\n" + examples).replace("\n# ", "\n").replace("\n#\n", "\n")
    example = f"{head}\nitems:{examples}"
    (tmp_path / "example.yaml").write_text(example, encoding="utf-8")
    golden = load_golden(tmp_path / "example.yaml")
    assert [(i.id, i.answerable, i.relevance) for i in golden.items] == [
        ("install-1", True, {"install.md": 3}),
        ("off-topic", False, {}),
    ]
    assert golden.items[0].chunks[0].heading == "Installing the client"
    # prefect.yaml: every deployment runs in this folder on this folder's ragpipe.yaml.
    from prefect.flows import load_flow_from_entrypoint

    spec = yaml.safe_load((folder / "prefect.yaml").read_text(encoding="utf-8"))
    (pull,) = spec["pull"]
    assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == str(folder)
    flows = {d["name"]: load_flow_from_entrypoint(d["entrypoint"]).name
             for d in spec["deployments"]}  # fmt: skip
    assert flows == {
        "team-nightly-reindex": "ingest",
        "team-reindex-now": "ingest",
        "team-eval-retrieval": "eval-retrieval",
        "team-promote-index": "promote-index",
        "team-eval-rag": "eval-rag",
    }
    assert {d["parameters"]["config_path"] for d in spec["deployments"]} == {
        str(folder / "ragpipe.yaml")
    }
    # The eval after a promotion listens to this project's index only (the resource the
    # ingest's events name: the store's real path, hashed).
    from flows.events import index_resource

    (trigger,) = next(d for d in spec["deployments"] if d["name"] == "team-eval-retrieval")[
        "triggers"
    ]
    runtime = RagpipeConfig(store={"path": folder / "data" / "store"})  # type: ignore[arg-type]
    assert trigger["match"]["prefect.resource.id"] == index_resource(runtime)["prefect.resource.id"]
    # No ignore glob for the project's own files: discovery skips them by path
    # (test_init_project_as_a_root_indexes_another_roots_data_and_eval_folders).
    inner = tmp_path / "inner"
    runner.invoke(app, ["init", str(inner), "--roots", ".."])
    assert load_config(inner / "ragpipe.yaml").discover.ignore == RagpipeConfig().discover.ignore
    # Never over a file: exit 2, the file named, nothing written or changed.
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    again = runner.invoke(app, ["init", str(folder), "--name", "other"])
    assert again.exit_code == 2
    assert "ragpipe.yaml" in again.output and "writes nothing over a file" in again.output
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    bad = runner.invoke(app, ["init", str(tmp_path / "x"), "--name", "../escape"])
    assert bad.exit_code == 2 and "--name" in bad.output
    assert not (tmp_path / "x").exists()


def test_init_project_as_a_root_indexes_another_roots_data_and_eval_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`init --roots . --roots OTHER` wrote discover.ignore ["data/**", "eval/**", ...]: a glob
    applies to every root, so OTHER's own data/ and eval/ folders were dropped, not even
    counted as skipped. The project's golden set and configuration files are still kept out,
    by their paths."""
    from ragpipe.ingest.discover import discover, own_paths

    folder, other = tmp_path / "team", tmp_path / "manuals"
    for rel in ("data/specs.md", "eval/results.md", "eval/golden/faq.yaml", "guide.md"):
        (other / rel).parent.mkdir(parents=True, exist_ok=True)
        (other / rel).write_text(f"# {rel}\n\ntext\n", encoding="utf-8")
    result = runner.invoke(app, ["init", str(folder), "--roots", ".", "--roots", str(other)])
    assert result.exit_code == 0, result.output
    (folder / "notes.md").write_text("# Notes\n\ntext\n", encoding="utf-8")
    # A draft and a held-out set beside the configured one: kept out too (the review).
    for name in ("draft.yaml", "my-docs-test.yaml"):
        (folder / "eval" / "golden" / name).write_text("name: x\nitems: []\n", encoding="utf-8")
    monkeypatch.chdir(folder)  # where the deployments run it
    cfg = load_config(Path("ragpipe.yaml"))
    found = discover(cfg.discover, own=own_paths(cfg))
    assert sorted(f.file_path for f in found.files) == [
        f"{other.as_posix()}/{rel}"
        for rel in ("data/specs.md", "eval/golden/faq.yaml", "eval/results.md", "guide.md")
    ] + ["notes.md"]
    assert sorted((s.file_path, s.reason) for s in found.skipped) == [
        ("eval/golden", "ragpipe_data"),  # the folder of golden sets, drafts with them
        ("prefect.yaml", "ragpipe_data"),
        ("ragpipe.yaml", "ragpipe_data"),
    ]


def test_init_keeps_nothing_when_it_cannot_finish_and_quotes_what_it_writes(
    tmp_path: Path,
) -> None:
    # "eval" is a file where the golden set's folder must go: refused, nothing left behind.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "eval").write_text("", encoding="utf-8")
    result = runner.invoke(app, ["init", str(blocked)])
    assert result.exit_code == 2 and "nothing was kept" in result.output
    assert sorted(p.name for p in blocked.iterdir()) == ["eval"]
    # A dangling link counts as a file that exists.
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "prefect.yaml").symlink_to(tmp_path / "nowhere")
    assert runner.invoke(app, ["init", str(linked)]).exit_code == 2
    assert sorted(p.name for p in linked.iterdir()) == ["prefect.yaml"]
    # Names and roots that YAML would read as something else stay text.
    odd = tmp_path / "007"
    made = runner.invoke(app, ["init", str(odd), "--name", "true", "--roots", "docs: x #y"])
    assert made.exit_code == 0, made.output
    golden = yaml.safe_load((odd / "eval" / "golden" / "true.yaml").read_text("utf-8"))
    assert golden["name"] == "true"
    assert golden["description"] == "Questions about the documents in docs: x #y."
    assert yaml.safe_load((odd / "prefect.yaml").read_text("utf-8"))["name"] == "007"
    assert load_config(odd / "ragpipe.yaml").discover.roots == [Path("docs: x #y")]
    # Characters past the BMP: json.dumps wrote "\\ud83d\\ude00", which YAML reads as two
    # lone surrogates, so the root and the deployments' folder never matched the real ones.
    emoji = tmp_path / "proj ü 😀"
    made = runner.invoke(app, ["init", str(emoji), "--roots", "😀 docs"])
    assert made.exit_code == 0, made.output
    assert load_config(emoji / "ragpipe.yaml").discover.roots == [Path("😀 docs")]
    deployed = yaml.safe_load((emoji / "prefect.yaml").read_text("utf-8"))
    (pulled,) = deployed["pull"][0].values()
    assert pulled["directory"] == str(emoji)
    config_path = deployed["deployments"][0]["parameters"]["config_path"]
    assert config_path == str(emoji / "ragpipe.yaml")


def test_init_stopped_midway_takes_back_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review found: init rolled back only on OSError, so a Ctrl-C (or SIGTERM, which
    every command turns into the same) between its files left ragpipe.yaml and the golden
    set behind, and running init again then failed "already exist"."""
    folder = tmp_path / "project"
    golden = folder / "eval" / "golden" / "my-docs.yaml"
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        if self == folder and golden.exists():  # prefect.yaml's turn: two files written
            raise KeyboardInterrupt  # Ctrl-C lands here
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    stopped = runner.invoke(app, ["init", str(folder)])
    assert stopped.exit_code == 130, stopped.output
    assert not folder.exists()  # its files and the folders it made: nothing left
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    again = runner.invoke(app, ["init", str(folder)])
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == [
        "my-docs.yaml", "prefect.yaml", "ragpipe.yaml"]  # fmt: skip


def _config_file(cfg: RagpipeConfig, tmp_path: Path) -> str:
    path = tmp_path / "ragpipe.yaml"
    path.write_text(json.dumps({
        "embed": {"provider": "onnx"},
        "store": {"backend": cfg.store.backend.value, "path": str(cfg.store.path)},
        "paths": {"work_dir": str(cfg.paths.work_dir)},
    }), encoding="utf-8")  # fmt: skip
    return str(path)


def _json(args: list[str]) -> Any:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["indexed_edge", "indexed_qdrant"])
def test_inspect_shows_files_chunks_neighbours_and_numbers(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    cfg: RagpipeConfig = request.getfixturevalue(backend)
    config = ["--config", _config_file(cfg, tmp_path), "--format", "json"]
    # Five files; each is a title chunk plus one chunk per "##" section (the copy has one).
    files = {Path(r["file_path"]).name: r for r in _json(["inspect", "files", *config])}
    assert {n: r["chunks"] for n, r in files.items()} == {
        "photosynthesis.md": 2, "computing.md": 2, "bread.md": 2, "backups.md": 2,
        "backups-copy.md": 1,
    }  # fmt: skip
    assert {r["converter"] for r in files.values()} == {"docling-simple-markdown"}
    assert all(re.fullmatch(r"[0-9a-f]{64}", r["source_sha"]) for r in files.values())
    # A file's chunks in order: the title opens the first section's chunk (it has nothing of
    # its own under it).
    bread = _json(["inspect", "file", "kitchen/bread.md", *config])
    assert bread["file_path"].endswith("/kitchen/bread.md")
    rows = bread["chunks"]
    assert [(r["chunk_index"], r["heading"]) for r in rows] == [
        (0, "Baking bread > Dough"),
        (1, "Baking bread > Oven"),
    ]
    assert rows[0]["first_words"].startswith("# Baking bread ## Dough Mix flour")
    assert rows[1]["first_words"].startswith("## Oven Bake the loaf at 230 degrees")
    # One chunk by a prefix of its id, with the chunks either side of it (none before).
    dough = _json(["inspect", "chunk", rows[0]["point_id"][:8], *config])
    assert dough["point_id"] == rows[0]["point_id"]
    assert dough["text"].startswith(
        "# Baking bread\n\n## Dough\n\nMix flour, water, salt and yeast."
    )
    assert _json(["inspect", "chunk", "kitchen/bread.md#0", *config]) == dough
    assert (dough["previous"], dough["next"]["heading"]) == (None, "Baking bread > Oven")
    numbers = _json(["inspect", "stats", *config])
    assert (numbers["points"], numbers["files"]) == (9, 5)
    assert numbers["embedder"] == "paraphrase-MiniLM-L3-v2"
    if backend == "indexed_edge":
        assert numbers["disk_bytes"] > 0
        (live,) = [v for v in numbers["versions"] if v["live"]]
        assert (live["points"], live["files"], numbers["version"]) == (9, 5, live["generation"])
    # Clear errors, exit 2.
    missing = runner.invoke(app, ["inspect", "file", "nope.md", *config])
    assert missing.exit_code == 2 and "ragpipe inspect files" in missing.output
    bad_id = runner.invoke(app, ["inspect", "chunk", "zz", *config])
    assert bad_id.exit_code == 2 and "point id" in bad_id.output
    text = runner.invoke(app, ["inspect", "files", *config[:2]])
    assert text.exit_code == 0 and "5 files, 9 chunks" in text.output


@pytest.mark.integration
def test_inspect_prints_no_escape_sequence_from_indexed_text(tmp_path: Path) -> None:
    from ragpipe.ingest.pipeline import run_ingest

    (tmp_path / "docs").mkdir()
    hostile = "# Title \x1b]0;PWNED\x07\n\nSome \x1b[31mred\x1b[0m text about the client.\n"
    (tmp_path / "docs" / "esc.md").write_text(hostile, encoding="utf-8")
    config = {"discover": {"roots": [str(tmp_path / "docs")]}, "embed": {"provider": "onnx"},
              "store": {"path": str(tmp_path / "store")},
              "paths": {"work_dir": str(tmp_path / "work")}}  # fmt: skip
    assert run_ingest(RagpipeConfig.model_validate(config)).failed == 0
    path = tmp_path / "ragpipe.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    shown = ""
    for args in (["file", "esc.md"], ["chunk", "esc.md#0"], ["files"]):
        result = runner.invoke(app, ["inspect", *args, "--config", str(path)])
        assert result.exit_code == 0, result.output
        shown += result.output
    assert "\x1b" not in shown and "\x07" not in shown
    assert "red" in shown and "PWNED" in shown  # the text itself is shown


@pytest.mark.integration
def test_inspect_files_keeps_converters_and_pages_after_a_run_that_changed_nothing(
    tmp_path: Path,
) -> None:
    """The converter and pages came from the last run's convert checkpoint alone: after a
    run that changed nothing (the tutorial's second run), every file showed neither."""
    from ragpipe.index_inspect import files
    from ragpipe.ingest.pipeline import run_ingest
    from ragpipe.store import open_reader
    from tests.support.corpora import make_config, write_topics

    cfg = make_config(write_topics(tmp_path / "corpus", 2, ".md"), tmp_path)
    run_ingest(cfg)
    assert run_ingest(cfg).stages["plan"]["unchanged"] == 2
    store = open_reader(cfg.store, "paraphrase-MiniLM-L3-v2")
    assert store is not None
    try:
        rows = files(store, cfg.paths.work_dir)
    finally:
        store.close()
    assert [(r.converter, r.chunks > 0) for r in rows] == [("docling-simple-markdown", True)] * 2


def test_a_relative_store_path_run_from_another_folder_names_where_it_looked(
    indexed_edge: RagpipeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative paths are taken from the working directory. `index list --config "other
    dir/ragpipe.yaml"` run elsewhere printed "no published version of data/store yet: run
    `ragpipe ingest`" and exited 0 while the index existed; inspect named "data/store"."""
    import os

    project, elsewhere = tmp_path / "other dir", tmp_path / "a" / "elsewhere"
    project.mkdir()
    elsewhere.mkdir(parents=True)
    store = os.path.relpath(indexed_edge.store.path, project)
    (project / "ragpipe.yaml").write_text(json.dumps({
        "embed": {"provider": "onnx"}, "store": {"path": store},
        "paths": {"work_dir": os.path.relpath(indexed_edge.paths.work_dir, project)},
    }), encoding="utf-8")  # fmt: skip
    monkeypatch.chdir(project)  # where it is meant to run: the index is found
    listed = runner.invoke(app, ["index", "list", "--config", "ragpipe.yaml", "--json"])
    assert listed.exit_code == 0 and len(json.loads(listed.stdout)) == 1, listed.output
    monkeypatch.chdir(elsewhere)
    config = ["--config", "../../other dir/ragpipe.yaml"]
    for args in (["index", "list", *config], ["inspect", "stats", *config]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        flat = " ".join(result.output.split())
        assert (
            f"no index at {os.path.normpath(elsewhere / store)}: run `ragpipe ingest` first" in flat
        )
        assert f"store.path {store} is relative, so it is taken from the working directory " \
               f"{elsewhere}, not from the folder of ../../other dir/ragpipe.yaml: run ragpipe " \
               f"in {project} (as its deployments do)" in flat  # fmt: skip
    # A --store-path given here is no path of the config's folder: no advice to run there.
    given = runner.invoke(app, ["index", "list", *config, "--store-path", "nothere"])
    flat = " ".join(given.output.split())
    assert given.exit_code == 2 and "taken from the working directory" in flat
    assert "folder of" not in flat, flat
    # In the project folder with no index at all: exit 2 too, with no advice to move.
    monkeypatch.chdir(project)
    (project / "ragpipe.yaml").write_text('{"store": {"path": "data/store"}}', encoding="utf-8")
    none = runner.invoke(app, ["index", "list", "--config", "ragpipe.yaml"])
    assert none.exit_code == 2, none.output
    flat = " ".join(none.output.split())
    assert f"no index at {project / 'data' / 'store'}" in flat and "folder of" not in flat
