"""Cold wall time of each CLI command on the sample index, against two floors measured in
the same run: `ragpipe --version` (the CLI's own start) and `python -c "import
onnxruntime, tokenizers, qdrant_edge"` (what any search must load). Each command runs
with the query side on ONNX (the default, ``embed.query_runtime: auto``) and on torch
(``RAGPIPE_EMBED__QUERY_RUNTIME=torch``, the path every query took before).

Usage: python bench/cold_start.py [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RAGPIPE = str(Path(sys.executable).parent / "ragpipe")


def _timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "cold_start.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragpipe-bench-cold-") as name:
        tmp = Path(name)
        shutil.copytree(REPO / "data" / "sample", tmp / "corpus")
        config = tmp / "ragpipe.yaml"
        config.write_text(json.dumps({
            "discover": {"roots": [str(tmp / "corpus")]},
            "store": {"path": str(tmp / "store")},
            "paths": {"work_dir": str(tmp / "work")},
            "eval": {"golden": str(REPO / "eval" / "golden" / "r-faq-dev.yaml"),
                     "reports_dir": str(tmp / "reports")},
        }), encoding="utf-8")  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop("RAGPIPE_EMBED__QUERY_RUNTIME", None)
        subprocess.run([RAGPIPE, "ingest", "--config", str(config)], env=env, check=True,
                       capture_output=True)  # fmt: skip
        cfg = ["--config", str(config)]
        commands: dict[str, list[str]] = {
            "ragpipe --version (floor)": [RAGPIPE, "--version"],
            "import onnxruntime, tokenizers, qdrant_edge (floor)": [
                sys.executable, "-c", "import onnxruntime, tokenizers, qdrant_edge"],
            "ragpipe search --help": [RAGPIPE, "search", "--help"],
            "ragpipe search": [RAGPIPE, "search", "How should I cite R?", "-k", "3", *cfg],
            "ragpipe ask (not found: no model call)": [
                RAGPIPE, "ask", "What is the capital of France?", *cfg],
            "ragpipe eval retrieval": [RAGPIPE, "eval", "retrieval", *cfg],
        }  # fmt: skip
        runtimes = {"onnx": env, "torch": {**env, "RAGPIPE_EMBED__QUERY_RUNTIME": "torch"}}
        samples: dict[str, dict[str, list[float]]] = {
            r: {c: [] for c in commands} for r in runtimes
        }
        for _ in range(args.repeat):  # interleaved: the machine's noise hits both alike
            for command, argv in commands.items():
                for runtime, run_env in runtimes.items():
                    fixed = "(floor)" in command or "--help" in command  # no query side
                    if fixed and runtime == "torch":
                        continue
                    samples[runtime][command].append(_timed(argv, run_env))
    results: dict[str, Any] = {}
    floor = statistics.median(samples["onnx"]["ragpipe --version (floor)"])
    for command in commands:
        row: dict[str, Any] = {}
        for runtime in runtimes:
            if samples[runtime][command]:
                median = statistics.median(samples[runtime][command])
                row[runtime] = {"median_s": median, "x_version": median / floor}
        results[command] = row
        cells = "; ".join(f"{r} {v['median_s']:.2f}s ({v['x_version']:.1f}x --version)"
                          for r, v in row.items())  # fmt: skip
        print(f"{command}: {cells}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
