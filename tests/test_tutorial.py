"""docs/tutorial.md, executed: every command in its ```bash blocks runs, in order, as a
newcomer would run it, from an empty folder to a report, an answer and a re-index run by
a deployed worker on a real Prefect server.

What a test cannot do as written is done the same way by the test: `git clone` and
`make setup` are what CI runs before the tests (this checkout, its .venv); `source
.venv/bin/activate` is the .venv's bin first on PATH; the server and the worker, started in
their own terminals in the tutorial, run in the background here, and the server's port
4200 is a free one. `~/` is a temporary folder; `~/my-docs` holds a few documents; the
golden set is the tutorial's own YAML block, as a person would type it. Generation uses the
98 MB SmolLM2 (RAGPIPE_LLM__MODEL) to keep the suite fast; the tutorial's commands are
unchanged.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.loopback import free_port, stop_group
from tests.support.paths import QUERY_CORPUS

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "tutorial.md"
BIN = Path(sys.executable).parent
INSTALL = """# Client guide

## Installing the client
Download the installer from the releases page, run it and sign in with your team account.
The installer needs about two hundred megabytes of disk space and no administrator rights.

## Updating
The client checks for updates every morning and installs them the next time it restarts.
"""
# Done by CI before any test (see the module docstring), not again here.
SETUP = ("git clone ", "cd ~/ragpipe", "make setup", "source ")


def commands(markdown: str) -> list[str]:
    """The command lines of the ```bash blocks, in order (continuations joined)."""
    out: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, re.M | re.S):
        joined = block.replace("\\\n", " ")
        out += [line.strip() for line in joined.splitlines() if line.strip()]
    return [c for c in out if not c.startswith("#")]


def test_the_tutorial_runs_from_an_empty_folder_to_a_deployed_nightly(tmp_path: Path) -> None:
    text = TUTORIAL.read_text(encoding="utf-8")
    home = tmp_path / "home"
    docs = home / "my-docs"
    for name, body in {**QUERY_CORPUS, "install.md": INSTALL}.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(body, encoding="utf-8")
    (golden_block,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S)
                       if b.startswith("name: my-docs")]  # fmt: skip
    port = str(free_port())
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "HF_HUB_OFFLINE": "1", "RAGPIPE_LLM__MODEL": "smollm2-135m"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    cwd = tmp_path
    background: list[subprocess.Popen[bytes]] = []
    ran: list[str] = []
    try:
        for command in commands(text):
            if command.startswith(SETUP):
                continue
            line = command.replace("~/", f"{home}/").replace("4200", port)
            ran.append(line)
            words = shlex.split(line, comments=True)
            if words[0] == "cd":
                cwd = Path(words[1])
                continue
            if words[0] == "export":
                key, _, value = words[1].partition("=")
                env[key] = value
                continue
            if words[:3] == ["prefect", "server", "start"]:
                background.append(subprocess.Popen(
                    [*words, "--host", "127.0.0.1", "--port", port], cwd=cwd, env=env,
                    stdout=(tmp_path / "server.log").open("wb"), stderr=subprocess.STDOUT,
                    start_new_session=True,
                ))  # fmt: skip
                for _ in range(120):
                    try:
                        if httpx.get(f"http://127.0.0.1:{port}/api/health").status_code == 200:
                            break
                    except httpx.HTTPError:
                        time.sleep(1)
                else:
                    pytest.fail("prefect server did not start: " + (tmp_path / "server.log")
                                .read_text()[-2000:])  # fmt: skip
                continue
            if words[:3] == ["prefect", "worker", "start"]:
                background.append(subprocess.Popen(
                    words, cwd=cwd, env=env, stdout=(tmp_path / "worker.log").open("wb"),
                    stderr=subprocess.STDOUT, start_new_session=True,
                ))  # fmt: skip
                continue
            done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=600)  # fmt: skip
            assert done.returncode == 0, f"$ {line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            if words[:2] == ["ragpipe", "init"]:
                # The person writes the golden set (the tutorial's YAML block).
                project = Path(words[2])
                golden = project / "eval" / "golden" / "my-docs.yaml"
                golden.write_text(golden_block, encoding="utf-8")
            if words[:2] == ["ragpipe", "ask"]:
                assert "install.md" in done.stdout, done.stdout
    finally:
        for process in reversed(background):
            stop_group(process)
    # Every step of the tutorial ran, the nightly's deployment included.
    assert any(c.startswith("ragpipe ingest") for c in ran)
    assert any(c.startswith("prefect deployment run 'ingest/my-project-reindex-now' --watch")
               for c in ran)  # fmt: skip
    project = home / "my-project"
    (report,) = (project / "eval" / "reports").glob("*-my-docs/report.html")
    summary = yaml.safe_load((report.parent / "summary.json").read_text(encoding="utf-8"))
    assert summary["metrics"]["default"]["recall@5"]["mean"] == 1.0  # install.md, 1 item
    draft = yaml.safe_load((project / "eval" / "golden" / "draft.yaml").read_text("utf-8"))
    assert all(item["draft"] is True for item in draft["items"])
