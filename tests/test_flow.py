"""The ingest flow and the CLI through a real Prefect test harness."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from ragpipe.config import RagpipeConfig
from ragpipe.store import published
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_ingest_flow_runs_and_skips_on_rerun(
    prefect_harness: None, small_corpus: Path, tmp_path: Path
) -> None:
    from flows.ingest import ingest_flow

    cfg = RagpipeConfig(
        discover={"roots": [small_corpus]},  # type: ignore[arg-type]
        embed={"provider": "onnx"},  # type: ignore[arg-type]
        store={"path": tmp_path / "store"},  # type: ignore[arg-type]
        paths={"work_dir": tmp_path / "work"},  # type: ignore[arg-type]
    )
    first = ingest_flow(config=cfg)
    assert (first.seen, first.converted, first.added, first.failed) == (3, 3, 3, 0)
    assert first.chunks > 10 and first.chunks_written == first.chunks == first.points_total
    assert set(first.seconds) == {
        "discover",
        "plan",
        "convert",
        "clean",
        "chunk",
        "embed",
        "upsert",
    }
    assert (tmp_path / "work" / "embed" / "embeddings.parquet").is_file()
    assert (tmp_path / "store" / "ragpipe-store.json").is_file()
    second = ingest_flow(config=cfg)
    assert (second.converted, second.skipped_unchanged, second.chunks_written) == (0, 3, 0)
    assert second.points_total == first.points_total

    # A run with failures publishes them as a table artifact a team reads in the UI.
    from prefect.artifacts import Artifact

    (small_corpus / "bad.pdf").write_bytes(b"%PDF-1.4 truncated")
    third = ingest_flow(config=cfg)
    assert third.failed == 1
    failures = Artifact.get("ingest-failures")
    assert failures is not None and failures.type == "table"
    (row,) = json.loads(str(failures.data))
    assert (row["stage"], row["category"], Path(row["file"]).name) == ("convert", "corrupt",
                                                                       "bad.pdf")  # fmt: skip
    assert row["reason"]
    summary = Artifact.get("ingest-summary")
    assert summary is not None and "table artifact `ingest-failures`" in str(summary.data)


def test_cli_ingest_exit_codes(prefect_harness: None, small_corpus: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["--work-dir", str(tmp_path / "work"), "--store-path", str(tmp_path / "store")]
    ok = runner.invoke(app, ["ingest", str(small_corpus), *args])  # default MiniLM embedder
    assert ok.exit_code == 0, ok.output
    assert "seen=3 added=3 changed=0 unchanged=0 removed=0 failed=0" in ok.output

    (small_corpus / "bad.pdf").write_bytes(b"%PDF-1.4 truncated")
    (small_corpus / "link.md").symlink_to(small_corpus / "amt.md")
    bad = runner.invoke(app, ["ingest", str(small_corpus), *args])
    assert bad.exit_code == 1, bad.output
    assert "seen=4 added=1 changed=0 unchanged=3 removed=0 failed=1 chunks-written=0" in bad.output
    assert "corrupt" in bad.output
    assert "skipped=1" in bad.output and "skipped.parquet" in bad.output

    (small_corpus / "bad.pdf").unlink()
    (small_corpus / "amt.md").unlink()  # 1 of 3 indexed files: above the 20 % guard
    held = runner.invoke(app, ["ingest", str(small_corpus), *args])
    assert held.exit_code == 3, held.output
    assert "1 of 3 indexed files vanished" in held.output and "--allow-mass-delete" in held.output
    assert "the parameter allow_mass_delete: true (a Prefect" in " ".join(held.output.split())
    allowed = runner.invoke(app, ["ingest", str(small_corpus), *args, "--allow-mass-delete"])
    assert allowed.exit_code == 0, allowed.output
    assert "removed=1" in allowed.output


def test_cli_config_error_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("chunk:\n  overlap: 5000\n")
    result = CliRunner().invoke(app, ["ingest", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "overlap (5000) must be smaller than size (1000)" in result.output


def test_cli_help_explains_options() -> None:
    result = CliRunner().invoke(app, ["ingest", "--help"])
    assert result.exit_code == 0
    for option in (
        "--config",
        "--work-dir",
        "--pdf-mode",
        "--chunker",
        "--embedder",
        "--store",
        "--store-path",
        "--allow-mass-delete",
        "SOURCES",
    ):
        assert option in result.output


# -- cached stages: an unchanged night -----------------------------------------------


def _task_states(flow_state: Any) -> dict[str, list[str]]:
    """stage/task name -> the state names of its task runs in that flow run, in order."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    flow_run = FlowRunFilter(id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id]))
    # Task-run states reach the server as events, recorded by a background service that
    # may still be flushing (under load it retries) when the flow has returned: wait for
    # every run's final state, a while.
    deadline = time.monotonic() + 60
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(
                flow_run_filter=flow_run, sort=TaskRunSort.EXPECTED_START_TIME_ASC
            )
        settled = all(r.state is not None and r.state.is_final() for r in runs)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    states: dict[str, list[str]] = {}
    for run in runs:
        assert run.state is not None, f"{run.name} has no state recorded after 60 s"
        states.setdefault(run.name.rsplit("-", 1)[0], []).append(run.state.name)
    return states


CACHEABLE = ("plan", "convert", "clean", "chunk", "embed", "upsert")


def test_an_unchanged_night_shows_its_stage_tasks_cached_and_a_setting_reruns_its_stage_only(
    prefect_harness: None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import flows.logs
    from flows.ingest import ingest_flow
    from tests.support.corpora import make_config, stored, write_topics

    cfg = make_config(write_topics(tmp_path / "corpus", 3), tmp_path)
    first = ingest_flow(cfg)
    assert first.added == 3
    points = stored(cfg)

    # The first unchanged night reads the store its predecessor wrote: every stage runs
    # (reusing its checkpoints); from the next one on, the stages after discover are Cached.
    night = ingest_flow(cfg, return_state=True)
    assert _task_states(night)["plan"] == ["Completed"]
    # A reader killed meanwhile left its copy; a night whose upsert is Cached publishes
    # nothing, and removed nothing until the flow's own uncached tidy step.
    readers = published.root(cfg.store.path) / published.READERS
    readers.mkdir(exist_ok=True)
    dead = subprocess.run(  # its own identity, start time included: a reused pid differs
        [sys.executable, "-c", "import json; from ragpipe.locking import process_identity; "
         "print(json.dumps(process_identity()))"],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout.strip()  # fmt: skip
    left = readers / f"{json.loads(dead)['pid']}-0000dead"
    left.mkdir()
    (left.with_name(left.name + published.OWNER)).write_text(dead, "utf-8")
    night = ingest_flow(cfg, return_state=True)
    states = _task_states(night)
    assert states["discover"] == ["Completed"]  # the walk and the hashing always run
    assert {stage: states[stage] for stage in CACHEABLE} == {s: ["Cached"] for s in CACHEABLE}
    assert states["tidy-store"] == ["Completed"] and not left.exists()
    assert not left.with_name(left.name + published.OWNER).exists()
    # The night's summary as written (summary.json, last): the state Prefect returned came
    # back once without its data in the full suite (MissingResult from night.result()).
    summary = json.loads((cfg.paths.work_dir / "summary.json").read_text(encoding="utf-8"))
    assert (summary["seen"], summary["skipped_unchanged"], summary["converted"]) == (3, 3, 0)
    assert (summary["chunks_written"], summary["points_total"]) == (0, first.points_total)
    assert set(summary["seconds"]) == {"discover", *CACHEABLE}
    assert all(summary["seconds"][stage] == 0.0 for stage in CACHEABLE)

    # A setting that only the embed stage reads re-runs that stage alone (twice: the first
    # run caches it under the new setting).
    batch = cfg.model_copy(update={"embed": cfg.embed.model_copy(update={"batch_size": 4})})
    states = _task_states(ingest_flow(batch, return_state=True))
    assert [s for s in CACHEABLE if states[s] != ["Cached"]] == ["embed"]
    assert _task_states(ingest_flow(batch, return_state=True))["embed"] == ["Cached"]
    # ... one only the upsert stage reads, upsert alone.
    index = batch.index.model_copy(update={"max_delete_share": 0.5})
    guard = batch.model_copy(update={"index": index})
    states = _task_states(ingest_flow(guard, return_state=True))
    assert [s for s in CACHEABLE if states[s] != ["Cached"]] == ["upsert"]

    # Another index's run writes into the same work dir: each cached result is checked
    # against the work dir, found stale, and its stage runs again; nothing is mixed up.
    other = make_config(
        write_topics(tmp_path / "other", 2, ".md"),
        tmp_path / "o",
        paths={"work_dir": cfg.paths.work_dir},
    )
    assert ingest_flow(other).added == 2
    library = logging.getLogger("ragpipe")  # Prefect's logging keeps it from the root
    library.addHandler(caplog.handler)
    level = library.level
    # The flow's own level (INFO, as on a worker): a CLI test earlier in this process may
    # have asked for WARNING (flows.logs._level), which the flow sets as it starts.
    monkeypatch.setattr(flows.logs, "_level", logging.INFO)
    try:
        night = ingest_flow(guard, return_state=True)
    finally:
        library.removeHandler(caplog.handler)
        library.setLevel(level)
    states = _task_states(night)
    assert states["plan"] == ["Cached", "Completed"]
    stale = [r for r in caplog.records if "cached result no longer matches" in r.getMessage()]
    assert stale and stale[0].getMessage().startswith("plan: the cached result no longer")
    assert {r.levelno for r in stale} == {logging.INFO}  # the ordinary course, no warning
    summary = night.result()
    assert (summary.seen, summary.skipped_unchanged, summary.added, summary.removed) == (3, 3, 0, 0)
    assert stored(cfg) == points


LOG_CHECK = """
import asyncio, logging
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.runtime import flow_run
from flows.logs import library_logs

@flow(name="log-check")
def run() -> str:
    library_logs()
    logging.getLogger("ragpipe.ingest.runner").info("discover: seen=5 (the line to find)")
    return flow_run.id

async def lines(run_id: str) -> list[str]:
    async with get_client() as client:
        found = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        return [log.message for log in found]

run_id = run()
for _ in range(50):  # logs are shipped in the background
    if any("(the line to find)" in line for line in asyncio.run(lines(run_id))):
        print("FOUND")
        break
    __import__("time").sleep(0.2)
"""


def test_ragpipe_lines_reach_the_run_logs_without_prefects_extra_loggers(tmp_path: Path) -> None:
    """A worker started as the docs say (`prefect worker start`) has no
    PREFECT_LOGGING_EXTRA_LOGGERS=ragpipe, which only the CLI and the Makefile set: not
    one stage count reached a deployment run's logs."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_LOGGING_EXTRA_LOGGERS"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL="", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", LOG_CHECK], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "FOUND" in done.stdout, done.stderr[-2000:]
