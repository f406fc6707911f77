"""ragpipe's Prefect events (flows/events.py) and the checkout's trigger on them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragpipe.config import load_config
from ragpipe.locking import index_resource_id

REPO = Path(__file__).resolve().parents[1]


def test_the_checkouts_eval_trigger_listens_to_the_checkouts_index_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prefect.yaml's eval-retrieval trigger matched ``ragpipe.index.*``: every project's
    promotion on the same server ran the checkout's eval, on the project's config_path, in
    the checkout. It names one index now, the one `make prefect-deploy` computes the way a
    run with no config_path loads its configuration (ragpipe.yaml in its folder)."""
    from prefect.utilities.templating import apply_values

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))
    (trigger,) = next(d for d in spec["deployments"] if d["name"] == "eval-retrieval")["triggers"]
    assert trigger["match"] == {"prefect.resource.id": "{{ $RAGPIPE_INDEX_ID }}"}
    recipe = (REPO / "Makefile").read_text(encoding="utf-8").split("\nprefect-deploy:")[1]
    assert "index=$$(.venv/bin/python -m flows.events) && RAGPIPE_INDEX_ID=$$index" in recipe
    (tmp_path / "ragpipe.yaml").write_text("store: {path: shelf/index}\n", encoding="utf-8")
    printed = subprocess.run(
        [sys.executable, "-m", "flows.events"], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
        timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    monkeypatch.chdir(tmp_path)
    expected = index_resource_id(load_config(tmp_path / "ragpipe.yaml"))
    assert (
        expected
        == index_resource_id(load_config(None))
        != index_resource_id(load_config(REPO / "ragpipe.example.yaml"))
    )
    assert printed == expected
    # What `prefect deploy` registers once the variable is set: that index, no wildcard.
    # (Prefect's deploy applies os.environ to the deployment, triggers included.)
    monkeypatch.setenv("RAGPIPE_INDEX_ID", printed)
    registered = apply_values(trigger, dict(os.environ), remove_notset=False)
    assert registered["match"] == {"prefect.resource.id": expected}
