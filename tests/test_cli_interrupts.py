"""Ctrl-C and SIGTERM on the real command line: every command unwinds (exit 130, what it
holds given back), and a long one says in one line what it kept."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ragpipe.config import RagpipeConfig, load_config
from ragpipe.store import published
from tests.support.corpora import write_project
from tests.support.paths import REPO
from tests.support.readers import reader_copies
from tests.support.signal_at import MARK

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DOCS = {
    "oven.md": "# Oven\n\nBake bread at 230 degrees for forty minutes.\n",
    "dough.md": "# Dough\n\nThe dough rises for two hours in a warm place.\n",
    "flour.md": "# Flour\n\nStrong wheat flour has more protein.\n",
    "salt.md": "# Salt\n\nTwo percent salt by flour weight.\n",
    # A question heading: what golden draft drafts without a model (--sample 0).
    "cooling.md": "# How long should bread cool?\n\nLet the loaf cool for an hour before "
    "slicing it.\n",
}
GOLDEN = """
name: bread
items:
  - id: oven
    query: How hot should the oven be?
    relevance: {oven.md: 3}
  - id: dough
    query: How long does the dough rise?
    relevance: {dough.md: 3}
  - id: flour
    query: Which flour has more protein?
    relevance: {flour.md: 3}
  - id: salt
    query: How much salt goes in?
    relevance: {salt.md: 3}
"""
# eval tune holds out at least 6 queries (on fewer the sign-flip test cannot reach p < 0.05):
# twelve items, three a file.
TUNE_GOLDEN = "name: bread-tune\nitems:\n" + "".join(
    f"  - {{id: {name.removesuffix('.md')}{n}, query: {query!r}, relevance: {{{name}: 3}}}}\n"
    for name, queries in {
        "oven.md": ["How hot should the oven be?", "How long does bread bake?",
                    "At what temperature is bread baked?"],
        "dough.md": ["How long does the dough rise?", "Where should dough rise?",
                     "Does the dough need a warm place?"],
        "flour.md": ["Which flour has more protein?", "What is strong flour?",
                     "Is wheat flour high in protein?"],
        "salt.md": ["How much salt goes in?", "What percent of salt?",
                    "Salt by flour weight?"],
    }.items()
    for n, query in enumerate(queries)
)  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RagpipeConfig]:
    """A project folder with an ingested Edge index, a golden set and a BEIR dataset."""
    from ragpipe.ingest.pipeline import run_ingest

    root = tmp_path_factory.mktemp("interrupts")
    write_project(root, DOCS, GOLDEN, ", granularity: file")
    (root / "tune.yaml").write_text(TUNE_GOLDEN, encoding="utf-8")
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": f"d{i}", "title": f"Doc {i}", "text": "text"}) + "\n"
        for i in range(3)), encoding="utf-8")  # fmt: skip
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "a question"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    cwd = Path.cwd()
    os.chdir(root)  # the config's relative paths
    try:
        cfg = load_config(root / "ragpipe.yaml")
        assert run_ingest(cfg).failed == 0
    finally:
        os.chdir(cwd)
    return root, cfg


# (command line, the point where SIGTERM lands, the "interrupted:" line or None, what must
# be absent afterwards). A short command ends silently with 130, as typer ends any command
# a KeyboardInterrupt reaches.
CASES: dict[str, tuple[list[str], str, str | None, str | None]] = {
    "search": (["search", "oven"], "ragpipe.query.retrieve:Retriever.search", None, None),
    "ask": (["ask", "oven"], "ragpipe.query.retrieve:Retriever.search", None, None),
    "eval check": (["eval", "check"], "ragpipe.evaluation.check:golden_for_index", None, None),
    "eval retrieval --flow": (  # Prefect's "Crash detected!" records were printed first
        ["eval", "retrieval", "--flow"],
        # (the point is the library's: patching tasks.eval would import Prefect before the
        # CLI sets its log level)
        "ragpipe.evaluation.run:run_retrieval",
        "interrupted: the evaluation stopped; no report or history row was written",
        None,
    ),
    "golden draft": (
        ["golden", "draft", "--sample", "0", "--out", "draft.yaml"],
        "ragpipe.evaluation.draft:draft_golden",
        "interrupted: the draft stopped; draft.yaml was not written",
        "draft.yaml",
    ),
    "inspect files": (["inspect", "files"], "ragpipe.index_inspect:files", None, None),
    "index list": (["index", "list"], "ragpipe.store.versions:list_versions", None, None),
    "index promote": (
        ["index", "promote", "0"],
        "ragpipe.ingest.gatekeep:promote_by_hand",
        None,
        None,
    ),
    "index discard": (
        ["index", "discard", "0"],
        "ragpipe.ingest.gatekeep:discard_by_hand",
        None,
        None,
    ),
    "report": (["report"], "ragpipe.evaluation.run:read_history", None, None),
    # The second of its three files: the first is taken back, and the folder it made.
    "init": (["init", "project"], "ragpipe.scaffold:atomic_create_bytes@2", None, "project"),
    "eval import-beir": (
        ["eval", "import-beir", "beir", "--corpus-out", "beir-docs", "--golden-out", "beir.yaml"],
        "pathlib:Path.write_text@2",  # the second document
        "interrupted: the import stopped before writing beir.yaml; the documents it wrote to "
        "beir-docs (the last perhaps cut off) are written again by the next import",
        "beir.yaml",
    ),
    # While it loads (its warm-up search): from then on uvicorn handles SIGTERM itself
    # (tests/test_serve.py).
    "serve": (["serve", "--port", "0"], "ragpipe.serve.app:Service._warm_up", None, None),
    # After the index is open, while the app is built (its MCP route): the copy leaked.
    "serve, building": (["serve", "--port", "0"], "ragpipe.serve.app:_mcp_route", None, None),
}


@pytest.mark.parametrize("command", list(CASES))
def test_sigterm_unwinds_every_command(site: tuple[Path, RagpipeConfig], command: str) -> None:
    """A review found: SIGTERM (`timeout`, `systemctl stop`) ended eval check, import-beir,
    report, golden draft, search, ask, index and init on the spot (exit 143): no `finally`
    ran, and a reader's private copy of the index stayed behind for good."""
    root, cfg = site
    args, point, line, absent = CASES[command]
    readers = published.root(root / cfg.store.path) / published.READERS
    before = reader_copies(readers)
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.signal_at", point, *args],
        cwd=root, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
             "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert MARK + point in done.stderr, output  # the signal was sent where it was meant to
    assert done.returncode == 130, output
    assert "Traceback" not in output
    assert reader_copies(readers) == before  # the copy it read went with it
    if line is not None:
        lines = [x for x in done.stderr.splitlines() if x.strip() and not x.startswith(MARK)]
        assert lines == [line], output  # one line: no log record of Prefect's before it
    if absent is not None:
        assert not (root / absent).exists()


def _signalled(root: Path, point: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.support.signal_at", point, *args],
        cwd=root, capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
             "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip


def test_sigterm_just_after_a_file_lands_counts_it_as_written(
    site: tuple[Path, RagpipeConfig],
) -> None:
    """A review found: a signal landing after a file was in place (here: before its folder
    is synced) read as if the write had failed: init kept the file (and refused to run
    again: 'already exist'), golden draft said its complete draft was not written, and an
    eval took back the report whose history row was written (history named a run with no
    report) while saying no history row was written."""
    from ragpipe.evaluation.run import read_history

    root, _ = site
    done = _signalled(root, "ragpipe.checkpoint:fsync_dir@1", "init", "landed")
    assert done.returncode == 130, done.stderr
    assert not (root / "landed").exists()  # the file that landed was taken back too

    done = _signalled(root, "ragpipe.checkpoint:fsync_dir@1", "golden", "draft", "--sample",
                      "0", "--out", "landed.yaml")  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "interrupted: the draft stopped after writing landed.yaml"
    )
    assert "items:" in (root / "landed.yaml").read_text(encoding="utf-8")

    # The fifth file of an eval retrieval run is history.parquet (per_query.parquet,
    # summary.json, report.md, report.html before it).
    runs = {r["run_id"] for r in read_history(root / "reports")}
    done = _signalled(root, "ragpipe.checkpoint:fsync_dir@5", "eval", "retrieval", "--name",
                      "landed")  # fmt: skip
    assert done.returncode == 130, done.stderr
    (new,) = {r["run_id"] for r in read_history(root / "reports")} - runs
    assert (root / "reports" / new / "report.html").is_file()
    assert done.stderr.splitlines()[-1] == (
        f"interrupted: the evaluation stopped after writing its report ({Path('reports') / new})"
    )


def _invoke_signalled(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, args: list[str]
) -> tuple[Any, bool]:
    """``ragpipe ARGS`` in this process with a real SIGTERM sent on the first call of
    ``module.name``; (result, whether it was sent)."""
    from flows.cli import app

    real = getattr(module, name)
    sent: list[bool] = []

    def signalled(*a: object, **k: object) -> object:
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(module, name, signalled)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(app, args, terminal_width=400)
    finally:
        signal.signal(signal.SIGTERM, handler)
        monkeypatch.setattr(module, name, real)
    return result, bool(sent)


def _printed(output: str) -> str:
    # In the full suite, Prefect's console handler may hold a stream an earlier CliRunner
    # closed: each of its records then prints logging's own "--- Logging error ---" block.
    return re.sub(r"--- Logging error ---\n.*?\nArguments: [^\n]*\n?", "", output,
                  flags=re.DOTALL)  # fmt: skip


EVALS = {
    "retrieval --flow": ["eval", "retrieval", "--flow"],
    "rag": ["eval", "rag", "--sample", "1"],
    "compare": ["eval", "compare", "--variant", "a:mode=dense", "--variant", "b:mode=sparse"],
    "tune": ["eval", "tune", "--golden", "tune.yaml"],
}


@pytest.mark.parametrize("command", list(EVALS))
def test_sigterm_while_prefect_creates_an_eval_task_run_is_one_line(
    prefect_harness: None,
    site: tuple[Path, RagpipeConfig],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """A review found: the Prefect eval commands caught only ragpipe's errors, so SIGTERM
    landing while Prefect's engine created a task run (its crash handling then fails:
    ValueError 'Task run is not set') ended in that traceback, exit 1."""
    import prefect.task_engine as task_engine

    root, _ = site
    monkeypatch.chdir(root)
    reports = root / "reports"
    before = set(reports.iterdir()) if reports.exists() else set()
    result, sent = _invoke_signalled(
        monkeypatch, task_engine, "_create_task_run_locally", EVALS[command]
    )
    assert sent, "the signal was never sent: Prefect no longer creates task runs there"
    assert result.exit_code == 130, result.output
    printed = _printed(result.output)
    assert "Traceback" not in printed, printed
    what = "tune" if command == "tune" else "evaluation"
    unwritten = "no report or tuned config" if command == "tune" else "no report or history row"
    assert f"interrupted: the {what} stopped; {unwritten} was written" in printed, printed
    assert (set(reports.iterdir()) if reports.exists() else set()) == before


def test_sigterm_after_an_evals_report_is_written_names_it(
    prefect_harness: None, site: tuple[Path, RagpipeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report and its history row are written before the flow publishes them as
    Prefect artifacts: a signal then keeps them, and the line says where they are."""
    import flows.eval
    from ragpipe.evaluation.run import read_history

    root, _ = site
    monkeypatch.chdir(root)
    runs = len({r["run_id"] for r in read_history(root / "reports")})
    result, sent = _invoke_signalled(
        monkeypatch, flows.eval, "publish_eval_task", ["eval", "retrieval", "--flow",
                                                       "--name", "published"]
    )  # fmt: skip
    assert sent and result.exit_code == 130, result.output
    printed = _printed(result.output)
    assert "Traceback" not in printed, printed
    (report,) = (root / "reports").glob("*-published")
    said = Path("reports") / report.name  # eval.reports_dir as configured: relative
    assert f"interrupted: the evaluation stopped after writing its report ({said})" in printed
    assert (report / "summary.json").is_file() and (report / "report.html").is_file()
    assert len({r["run_id"] for r in read_history(root / "reports")}) == runs + 1


def test_sigterm_while_an_evals_report_is_written_takes_it_back(
    site: tuple[Path, RagpipeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run directory half written (its history row not yet appended) would pass for a
    finished run in the reports folder, and the line says no report was written."""
    import ragpipe.evaluation.run as run

    root, _ = site
    monkeypatch.chdir(root)
    reports = root / "reports"
    before = set(reports.iterdir()) if reports.exists() else set()
    result, sent = _invoke_signalled(monkeypatch, run, "append_history", ["eval", "retrieval"])
    assert sent and result.exit_code == 130, result.output
    assert result.output.splitlines()[-1] == (
        "interrupted: the evaluation stopped; no report or history row was written"
    )
    assert set(reports.iterdir()) == before  # the run directory made for it is gone
