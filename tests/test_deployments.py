"""prefect.yaml on a real Prefect server and process worker: deploy everything, run
the nightly re-index and a retrieval eval through the API, check artifacts and files,
and that overlapping nightly runs are cancelled instead of piling up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.loopback import free_port, stop_group
from tests.support.paths import QUERY_CORPUS

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).parent / "prefect")
GOLDEN = """
name: deploy-check
items:
  - id: oven
    query: How hot should the oven be for bread?
    chunks: [{file: bread.md, heading: Oven, grade: 3}]
  - id: restore
    query: How do I restore the database from a backup?
    chunks: [{file: ops/backups.md, heading: Restore, grade: 3}]
  - id: calvin
    query: Where is carbon dioxide fixed into sugar?
    chunks: [{file: photosynthesis.md, heading: Calvin cycle, grade: 3}]
  - id: turing
    query: Who worked on the Enigma cipher?
    chunks: [{file: computing.md, heading: Alan Turing, grade: 3}]
"""
# eval-tune holds out at least 6 queries (on fewer the sign-flip test cannot reach p < 0.05):
# GOLDEN and 8 more, two a section.
TUNE_GOLDEN = GOLDEN + "".join(
    f"  - id: {key}{n}\n    query: {query}\n"
    f"    chunks: [{{file: {file}, heading: {heading}, grade: 3}}]\n"
    for n, (key, query, file, heading) in enumerate([
        ("light", "What do the light reactions release?", "photosynthesis.md", "Light reactions"),
        ("light", "Where is sunlight captured in a plant?", "photosynthesis.md",
         "Light reactions"),
        ("ada", "Who wrote the first published program?", "computing.md", "Ada Lovelace"),
        ("ada", "What could the Analytical Engine compute?", "computing.md", "Ada Lovelace"),
        ("dough", "How long do I knead the dough?", "bread.md", "Dough"),
        ("dough", "What goes into bread dough?", "bread.md", "Dough"),
        ("schedule", "How often are full backups taken?", "ops/backups.md", "Schedule"),
        ("schedule", "How many backup copies are kept?", "ops/backups.md", "Schedule"),
    ])
)  # fmt: skip


class Stack:
    def __init__(self, env: dict[str, str], api: str) -> None:
        self.env, self.api = env, api

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PREFECT, "--no-prompt", *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """A read of the server's API (filters), tried again when a loaded server (a flow
        running on the worker, the whole suite on 2 cores) takes over 30 s to answer."""
        for attempt in range(3):
            try:
                response = httpx.post(f"{self.api}{path}", json=body, timeout=30)
                break
            except httpx.TimeoutException:
                if attempt == 2:
                    raise
        response.raise_for_status()
        return response.json()

    def runs(self, deployment: str) -> list[dict[str, Any]]:
        name = deployment.split("/")[1]
        found = self.post("/deployments/filter", {"deployments": {"name": {"any_": [name]}}})
        ids = [d["id"] for d in found]
        return list(self.post("/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": ids}}}))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "RAGPIPE_HOME": str(REPO),
           "PREFECT_LOGGING_EXTRA_LOGGERS": "ragpipe", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    env.pop("PREFECT_API_KEY", None)
    # As `make prefect-deploy`: the eval-retrieval trigger listens to the checkout's index.
    env["RAGPIPE_INDEX_ID"] = subprocess.run(
        [sys.executable, "-m", "flows.events"], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    logs = home / "logs"
    logs.mkdir()
    server = subprocess.Popen(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=(logs / "server.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    worker: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (logs / "server.log").read_text()[-2000:]
            time.sleep(1)
        else:
            pytest.fail("prefect server did not become healthy in 120 s")
        s = Stack(env, api)
        pool = s.cli("work-pool", "create", "ragpipe-process", "--type", "process")
        assert pool.returncode == 0, pool.stdout + pool.stderr
        # As `make prefect-deploy`: no RAGPIPE_HOME while deploying (the worker has it).
        deploy_env = {k: v for k, v in env.items() if k != "RAGPIPE_HOME"}
        deployed = Stack(deploy_env, api).cli("deploy", "--all")
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", "ragpipe-process"],
            cwd=REPO, env=env, stdout=(logs / "worker.log").open("wb"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        yield s
    finally:
        if worker is not None:
            stop_group(worker)
        stop_group(server)


def _config(tmp: Path) -> dict[str, Any]:
    corpus = tmp / "corpus"
    for name, text in QUERY_CORPUS.items():
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_text(text, encoding="utf-8")
    (tmp / "golden.yaml").write_text(GOLDEN, encoding="utf-8")
    return {
        "discover": {"roots": [str(corpus)]},
        "chunk": {"size": 200, "overlap": 20},
        "embed": {"provider": "onnx"},
        "store": {"path": str(tmp / "store")},
        "paths": {"work_dir": str(tmp / "work")},
        "eval": {"golden": str(tmp / "golden.yaml"), "reports_dir": str(tmp / "reports"),
                 "resamples": 200},
    }  # fmt: skip


def test_deployments_run_on_a_real_server_and_worker(stack: Stack, tmp_path: Path) -> None:
    config = json.dumps(_config(tmp_path))
    config_file = tmp_path / "ragpipe-test.yaml"
    config_file.write_text(config, encoding="utf-8")  # JSON is YAML
    schedules = stack.post("/deployments/filter", {})
    nightly = next(d for d in schedules if d["name"] == "nightly-reindex")
    assert nightly["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert nightly["schedules"][0]["schedule"]["timezone"] == "UTC"
    assert nightly["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
    assert nightly["enforce_parameter_schema"] is True
    assert {d["name"] for d in schedules} == {"nightly-reindex", "reindex-now", "eval-retrieval",
                                              "eval-rag", "eval-compare", "eval-tune",
                                              "promote-index"}  # fmt: skip
    # The forms: a handful of typed, described fields, not the whole configuration.
    for d in schedules:
        fields = d["parameter_openapi_schema"]["properties"]
        assert len(fields) <= 12 and all(f.get("description") for f in fields.values())
        assert "config" not in fields and "config_path" in fields, d["name"]

    ingest = stack.cli("deployment", "run", "ingest/nightly-reindex", "--watch",
                       "--param", f"config_path={config_file}", timeout=600)  # fmt: skip
    assert "finished successfully in 'Completed'" in ingest.stdout, ingest.stdout + ingest.stderr
    assert (tmp_path / "store" / "segments").is_dir()
    assert json.loads((tmp_path / "work" / "summary.json").read_text())["added"] == 5

    evaluated = stack.cli("deployment", "run", "eval-retrieval/eval-retrieval", "--watch",
                          "--param", f"config_path={config_file}", timeout=600)  # fmt: skip
    assert "finished successfully" in evaluated.stdout, evaluated.stdout + evaluated.stderr
    (report,) = (tmp_path / "reports").glob("*-deploy-check")
    assert {p.name for p in report.iterdir()} == {"per_query.parquet", "summary.json",
                                                  "report.md", "report.html"}  # fmt: skip
    # Run logs: ragpipe's INFO lines (stage counts) reach the flow run's logs on the server.
    ran = [r["state_type"] for r in stack.runs("ingest/nightly-reindex")]
    assert [state for state in ran if state != "SCHEDULED"] == ["COMPLETED"]
    for line in ("discover: seen=5", "upsert: points_written=9", "ingest: seen=5 added=5"):
        _wait_for_log(stack, "ingest/nightly-reindex", line)  # logs arrive in batches

    _readers_while_the_nightly_writes(stack, tmp_path, report)

    (tmp_path / "tune.yaml").write_text(TUNE_GOLDEN, encoding="utf-8")
    tune_config = json.loads(config)
    tune_config["eval"]["golden"] = str(tmp_path / "tune.yaml")
    (tmp_path / "ragpipe-tune.yaml").write_text(json.dumps(tune_config), encoding="utf-8")
    tuned = stack.cli("deployment", "run", "eval-tune/eval-tune", "--watch",
                      "--param", f"config_path={tmp_path / 'ragpipe-tune.yaml'}",
                      timeout=600)  # fmt: skip
    assert "finished successfully" in tuned.stdout, tuned.stdout + tuned.stderr
    (tune_dir,) = (tmp_path / "reports").glob("*-deploy-check-tune")
    verdict = json.loads((tune_dir / "tune.json").read_text())
    assert verdict["decision"] in {"recommend", "recommend, not significant", "refused",
                                   "no change"}  # fmt: skip
    assert len(verdict["split"]["tuning"]) == len(verdict["split"]["confirmation"]) == 6

    # A failing gate ends the flow run Failed (what an automation can notify on).
    gated = stack.cli("deployment", "run", "eval-compare/eval-compare", "--watch", "--params",
                      json.dumps({"variants": [{"name": "same", "mode": "dense"}],
                                  "baseline": {"name": "dense", "mode": "dense"},
                                  "gate_metric": "mrr", "gate_threshold": 0.5,
                                  "config_path": str(config_file)}), timeout=600)  # fmt: skip
    (compare_run,) = stack.runs("eval-compare/eval-compare")
    assert compare_run["state_type"] == "FAILED", gated.stdout + gated.stderr
    assert (
        "same: mrr delta is +0.0000 on every one of the 4 paired queries (no CI"
        in (compare_run["state"]["message"])
    )
    (compare_dir,) = (tmp_path / "reports").glob("*-compare")
    assert json.loads((compare_dir / "summary.json").read_text())["gate"]["passed"] is False

    keys = {a["key"] for a in stack.post("/artifacts/filter", {}) if a["key"]}
    assert {"ingest-summary", "ingest-progress", "eval-retrieval-summary",
            "eval-retrieval-metrics", "eval-retrieval-report", "eval-tune-summary",
            "eval-compare-report"} <= keys  # fmt: skip

    for bad_param in ("depth=0", "mode=fuzzy", "granularity=page"):
        bad = stack.cli("deployment", "run", "eval-retrieval/eval-retrieval", "--param", bad_param)
        assert bad.returncode != 0, bad_param  # the typed schema rejects it before any run

    # Overlapping nightly runs: the one that would start while another runs is cancelled;
    # a manual re-index (another deployment) queues for the index's writer slot instead.
    # The first is kept running by holding the index's writer lock here (it waits for it).
    from ragpipe.config import RagpipeConfig
    from ragpipe.locking import ingest_lock

    slow = {**_config(tmp_path), "index": {"lock_timeout_s": 300}}
    slow_file = tmp_path / "slow.yaml"
    slow_file.write_text(json.dumps(slow), encoding="utf-8")
    before = {r["id"] for r in stack.runs("ingest/nightly-reindex")}

    def new_runs() -> list[dict[str, Any]]:
        return [r for r in stack.runs("ingest/nightly-reindex") if r["id"] not in before
                and r["state_type"] != "SCHEDULED"]  # fmt: skip

    def wait_for(predicate: Any, what: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            runs = new_runs()
            if predicate(runs):
                return runs
            time.sleep(1)
        pytest.fail(f"timed out waiting for {what}: {[r['state_type'] for r in new_runs()]}")

    with ingest_lock(RagpipeConfig.model_validate(slow), timeout_s=0):
        first = stack.cli("deployment", "run", "ingest/nightly-reindex",
                          "--param", f"config_path={slow_file}")  # fmt: skip
        assert first.returncode == 0, first.stdout + first.stderr
        wait_for(lambda runs: any(r["state_type"] == "RUNNING" for r in runs), "a running run")
        second = stack.cli("deployment", "run", "ingest/nightly-reindex",
                           "--param", f"config_path={slow_file}")  # fmt: skip
        assert second.returncode == 0, second.stdout + second.stderr
        wait_for(lambda runs: any(r["state_type"] == "CANCELLED" for r in runs), "a cancel")
        manual = stack.cli("deployment", "run", "ingest/reindex-now",
                           "--param", f"config_path={config_file}")  # fmt: skip
        assert manual.returncode == 0, manual.stdout + manual.stderr
        queued = _wait_for_log(stack, "ingest/reindex-now", "waiting for the writer slot")
        assert "another ingest of this index is running" in queued
    final = wait_for(
        lambda runs: sorted(r["state_type"] for r in runs) == ["CANCELLED", "COMPLETED"],
        "the first run to finish",
    )
    assert len(final) == 2
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        (manual_run,) = stack.runs("ingest/reindex-now")
        if manual_run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        time.sleep(1)
    assert manual_run["state_type"] == "COMPLETED"  # it waited, then re-indexed
    nightly_end = max(r["end_time"] for r in final if r["state_type"] == "COMPLETED")
    # Logs reach the server in batches, possibly after the run's final state.
    _wait_for_log(stack, "ingest/reindex-now", "got the writer slot")
    _wait_for_log(stack, "ingest/reindex-now", "discover: ")
    assert _writing_started(stack, manual_run["id"]) > nightly_end


def test_a_gated_nightly_triggers_the_eval_and_a_bad_one_is_held(
    stack: Stack, tmp_path: Path
) -> None:
    """index.gate on a real server and worker: the first version is promoted and its
    ragpipe.index.promoted event runs the eval-retrieval deployment (prefect.yaml's trigger);
    a nightly whose corpus lost the files of half the golden items is held: the run ends
    Failed, readers keep the old version, and ragpipe.index.held arrives."""
    from ragpipe.config import RagpipeConfig
    from ragpipe.store import published

    config = _config(tmp_path)
    config["index"] = {"gate": {"golden": [str(tmp_path / "golden.yaml")], "max_drop": 0.05}}
    config_file = (tmp_path / "gated.yaml").resolve()
    config_file.write_text(json.dumps(config), encoding="utf-8")
    cfg = RagpipeConfig.model_validate(config)
    # `ragpipe deploy` fills the forms from this file: the UI shows the values that run.
    filled = subprocess.run(
        [str(Path(sys.executable).parent / "ragpipe"), "deploy", "--no-register",
         "--config", str(config_file)],
        cwd=REPO, env=stack.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert filled.returncode == 0, filled.stdout + filled.stderr
    # A team's notification block (here a webhook on loopback); `ragpipe deploy --notify`
    # installs the automations that send through it.
    webhook = _Webhook()
    _webhook_block(stack, webhook.url)
    notify = subprocess.run(
        [str(Path(sys.executable).parent / "ragpipe"), "deploy", "--no-register",
         "--config", str(config_file), "--notify", "custom-webhook/ragpipe-test"],
        cwd=REPO, env=stack.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert notify.returncode == 0, notify.stdout + notify.stderr
    assert "ragpipe: index version held (ragpipe.index." in notify.stdout
    assert ") -> custom-webhook/ragpipe-test" in notify.stdout
    deployments = {d["name"]: d for d in stack.post("/deployments/filter", {})}
    form = deployments["eval-retrieval"]
    assert form["parameters"]["config_path"] == str(config_file)
    assert form["parameters"]["golden"] == str(tmp_path / "golden.yaml")
    assert (form["parameters"]["granularity"], form["parameters"]["depth"]) == ("chunk", 10)
    assert form["parameters"]["mode"] == "hybrid"
    choices = form["parameter_openapi_schema"]["properties"]["golden"]["anyOf"][0]["enum"]
    assert choices == [str(tmp_path / "golden.yaml"), "eval/golden/r-faq-dev.yaml"]
    nightly = deployments["nightly-reindex"]["parameters"]
    assert nightly == {"config_path": str(config_file), "allow_mass_delete": False}
    assert len(deployments["eval-compare"]["parameters"]["variants"]) == 2  # prefect.yaml's
    ingest = stack.cli("deployment", "run", "ingest/nightly-reindex", "--watch",
                       "--param", f"config_path={config_file}", timeout=600)  # fmt: skip
    assert "finished successfully in 'Completed'" in ingest.stdout, ingest.stdout + ingest.stderr
    live = published.current(cfg.store.path)
    assert live is not None

    def triggered() -> list[dict[str, Any]]:
        return [r for r in stack.runs("eval-retrieval/eval-retrieval")
                if r["parameters"].get("config_path") == str(config_file)]  # fmt: skip

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        runs = triggered()
        if runs and runs[0]["state_type"] in ("COMPLETED", "FAILED", "CRASHED"):
            break
        time.sleep(2)
    assert [r["state_type"] for r in triggered()] == ["COMPLETED"]
    assert list((tmp_path / "reports").glob("*-deploy-check"))  # the triggered eval's report

    for name in ("kitchen/bread.md", "science/photosynthesis.md"):  # 2 of the 4 items' files
        (tmp_path / "corpus" / name).unlink()
    held = stack.cli("deployment", "run", "ingest/nightly-reindex", "--watch",
                     "--param", f"config_path={config_file}",
                     "--param", "allow_mass_delete=true", timeout=600)  # fmt: skip
    # The cron's next runs carry this config_path too since `ragpipe deploy`: not those.
    runs = [r for r in stack.runs("ingest/nightly-reindex")
            if r["parameters"].get("config_path") == str(config_file)
            and r["state_type"] != "SCHEDULED"]  # fmt: skip
    latest = max(runs, key=lambda r: r["expected_start_time"])
    assert latest["state_type"] == "FAILED", held.stdout + held.stderr
    assert "was not promoted" in latest["state"]["message"]
    assert published.current(cfg.store.path) == live  # readers keep the old version
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held_filter = {"filter": {"event": {"name": ["ragpipe.index.held"]}}}
        events = stack.post("/events/filter", held_filter)["events"]
        if events:
            break
        time.sleep(1)
    (event,) = events
    assert event["payload"]["live_before"] == live
    assert event["payload"]["config_path"] == str(config_file)
    assert len(triggered()) == 1  # a held version triggers no eval
    # The shipped automation fired: the team's webhook got the message.
    message = webhook.wait(timeout=90)
    staged = event["payload"]["version"]
    assert message["subject"] == f"ragpipe held index version {staged[:12]}"
    assert f"Readers keep version {live[:12]}." in message["body"]
    assert f"ragpipe index promote {staged[:12]}" in message["body"]
    assert event["payload"]["reasons"][0] in message["body"]
    webhook.close()


def test_deploy_points_an_init_projects_trigger_at_the_index_it_configures_now(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ragpipe init` writes eval-retrieval's trigger with the index id of that day's store;
    after store.path changes, `ragpipe deploy` points the registered trigger at the new
    index (else the promotions' events, which carry the new id, never start the eval)."""
    from ragpipe.config import load_config
    from ragpipe.locking import index_resource_id

    folder = tmp_path / "team"
    ragpipe = str(Path(sys.executable).parent / "ragpipe")
    made = subprocess.run([ragpipe, "init", str(folder), "--roots", "docs"], env=stack.env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    config_file = folder / "ragpipe.yaml"
    text = config_file.read_text(encoding="utf-8")
    config_file.write_text(text.replace("path: data/store", "path: data/store-2"), "utf-8")
    before = yaml.safe_load((folder / "prefect.yaml").read_text(encoding="utf-8"))
    (trigger,) = next(d for d in before["deployments"]
                      if d["name"] == "team-eval-retrieval")["triggers"]  # fmt: skip
    old = trigger["match"]["prefect.resource.id"]
    monkeypatch.chdir(folder)  # the relative store path is the folder's, as in the deployments
    new = index_resource_id(load_config(config_file))
    assert new != old
    for _ in range(2):  # again: prefect deploy puts prefect.yaml's back, ragpipe's is fixed
        deployed = subprocess.run(
            [ragpipe, "deploy", "--config", "ragpipe.yaml"],
            cwd=folder, env=stack.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert f"eval-retrieval/team-eval-retrieval: {old} -> {new}" in deployed.stdout
        named = {"deployments": {"name": {"any_": ["team-eval-retrieval"]}}}
        (deployment,) = stack.post("/deployments/filter", named)
        (automation,) = [a for a in stack.post("/automations/filter", {})
                         if a["actions"][0].get("deployment_id") == deployment["id"]]  # fmt: skip
        assert automation["trigger"]["match"] == {"prefect.resource.id": new}
        assert automation["trigger"]["expect"] == ["ragpipe.index.promoted"]


class _Webhook:
    """A loopback HTTP endpoint that records the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        import http.server
        import queue
        import threading

        received: queue.Queue[dict[str, Any]] = queue.Queue()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                received.put(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._received = received
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def wait(self, timeout: float) -> dict[str, Any]:
        return self._received.get(timeout=timeout)

    def close(self) -> None:
        self._server.shutdown()


def _webhook_block(stack: Stack, url: str) -> None:
    """Save a custom-webhook notification block named ragpipe-test on the stack's server."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api}):
        CustomWebhookNotificationBlock(
            name="ragpipe-test", url=url, allow_private_urls=True,
            json_data={"subject": "{{subject}}", "body": "{{body}}"},
        ).save("ragpipe-test", overwrite=True)  # fmt: skip


def _logs(stack: Stack, run_id: str) -> str:
    entries = stack.post("/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}}})
    return "\n".join(entry["message"] for entry in entries)


def _writing_started(stack: Stack, run_id: str) -> str:
    """When the run's discover stage logged (it runs under the writer slot)."""
    entries = stack.post("/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}}})
    return min(e["timestamp"] for e in entries if e["message"].startswith("discover:"))


def _wait_for_log(stack: Stack, deployment: str, text: str) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for run in stack.runs(deployment):
            logs = _logs(stack, run["id"])
            if text in logs:
                return logs
        time.sleep(1)
    pytest.fail(f"no run of {deployment} logged {text!r}")


def _search(tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "search.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ragpipe"), "search", "--config", str(path),
         "--format", "json", "How hot should the oven be?"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def _readers_while_the_nightly_writes(stack: Stack, tmp_path: Path, first_report: Path) -> None:
    """A nightly ingest writes the index while an eval and a `ragpipe search` read it."""
    from ragpipe.config import RagpipeConfig
    from ragpipe.locking import ingest_lock
    from ragpipe.store import open_store, published

    config = {**_config(tmp_path), "index": {"lock_timeout_s": 300}}
    cfg = RagpipeConfig.model_validate(config)
    before = published.current(cfg.store.path)
    assert before is not None
    assert json.loads((first_report / "summary.json").read_text())["corpus"]["index_version"][
        "generation"
    ] == before  # fmt: skip
    (tmp_path / "corpus" / "kitchen.md").write_text("# Kitchen\n\nKnives go in the block.\n")
    known = {r["id"] for r in stack.runs("ingest/nightly-reindex")}
    # Hold the lock and the working shard, as the nightly itself does while it writes; the
    # nightly started now waits for them and then writes a new version.
    with ingest_lock(cfg, timeout_s=0):
        writer = open_store(cfg.store, "paraphrase-MiniLM-L3-v2", None)
        assert writer is not None
        try:
            during = tmp_path / "during.yaml"
            during.write_text(json.dumps(config), encoding="utf-8")
            started = stack.cli("deployment", "run", "ingest/nightly-reindex",
                                "--param", f"config_path={during}")  # fmt: skip
            assert started.returncode == 0, started.stdout + started.stderr
            evaluated = stack.cli("deployment", "run", "eval-retrieval/eval-retrieval",
                                  "--watch", "--param", f"config_path={during}",
                                  "--param", "name=during-ingest", timeout=600)  # fmt: skip
            assert "finished successfully" in evaluated.stdout, evaluated.stdout + evaluated.stderr
            assert _search(tmp_path, config)["trace"]["index_version"] == before
        finally:
            writer.close()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        runs = [r for r in stack.runs("ingest/nightly-reindex")
                if r["id"] not in known and r["state_type"] != "SCHEDULED"]  # fmt: skip
        if runs and all(r["state_type"] in ("COMPLETED", "FAILED", "CRASHED") for r in runs):
            break
        time.sleep(1)
    assert [r["state_type"] for r in runs] == ["COMPLETED"]
    (report,) = (tmp_path / "reports").glob("*-during-ingest")
    version = json.loads((report / "summary.json").read_text())["corpus"]["index_version"]
    assert version["generation"] == before and version["index_fingerprint"]
    assert "index version: `" in (report / "report.md").read_text()
    after = published.current(cfg.store.path)
    assert after is not None and after != before  # the nightly published a new version
    assert _search(tmp_path, config)["trace"]["index_version"] == after  # seen at next open


def test_ragpipe_deploy_from_the_checkout_points_its_trigger_at_the_configured_index(
    stack: Stack, tmp_path: Path
) -> None:
    """The checkout's eval-retrieval trigger names ``{{ $RAGPIPE_INDEX_ID }}``, which `make
    prefect-deploy` sets; `ragpipe deploy` from the checkout registered it unset, and the
    placeholder matched no event. (Last here: it registers the checkout's deployments again,
    their forms filled from this configuration.)"""
    from ragpipe.config import RagpipeConfig
    from ragpipe.locking import index_resource_id

    config = _config(tmp_path)
    config_file = tmp_path / "checkout.yaml"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    expected = index_resource_id(RagpipeConfig.model_validate(config))
    env = {k: v for k, v in stack.env.items() if k != "RAGPIPE_INDEX_ID"}

    def trigger() -> Any:
        named = {"deployments": {"name": {"any_": ["eval-retrieval"]}}}
        (deployment,) = stack.post("/deployments/filter", named)
        (automation,) = [a for a in stack.post("/automations/filter", {})
                         if a["actions"][0].get("deployment_id") == deployment["id"]]  # fmt: skip
        return automation["trigger"]["match"]["prefect.resource.id"]

    def ragpipe_deploy(*args: str) -> str:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "ragpipe"), "deploy", "--config",
             str(config_file), *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    pulled = [{"prefect.deployments.steps.set_working_directory":
               {"directory": "{{ $RAGPIPE_HOME }}"}}]  # fmt: skip
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))
    names = {d["name"] for d in spec["deployments"]}
    checkout = [d for d in stack.post("/deployments/filter", {}) if d["name"] in names]
    assert len(checkout) == len(names) == 7
    # The worker fills RAGPIPE_HOME (the deployments above ran there), not the deploy.
    assert all(d["pull_steps"] == pulled for d in checkout)
    # A plain `prefect deploy` without the variable: Prefect writes "", which matches
    # nothing; `ragpipe deploy --no-register` points that at the configured index ...
    plain = {k: v for k, v in env.items() if k != "RAGPIPE_HOME"}
    assert Stack(plain, stack.api).cli("deploy", "--all").returncode == 0
    assert trigger() == ""
    shown = ragpipe_deploy("--no-register")
    assert f'eval-retrieval/eval-retrieval: "" -> {expected}' in shown
    assert trigger() == expected
    # ... and `ragpipe deploy` registers it with that index's id at once, and leaves
    # RAGPIPE_HOME to the workers though it is set where it runs (env: REPO).
    assert env["RAGPIPE_HOME"] == str(REPO)
    shown = ragpipe_deploy()
    assert trigger() == expected
    assert "triggers now on" not in shown  # nothing left to move
    assert all(d["pull_steps"] == pulled
               for d in stack.post("/deployments/filter", {}) if d["name"] in names)  # fmt: skip
