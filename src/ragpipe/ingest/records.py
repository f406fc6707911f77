"""JSON and JSONL records as documents (``discover.records``).

A file that a rule matches is not one document but one per record: the record's text
fields, under its title as a heading, are written to ``records/bodies`` and handed to
convert like a file, indexed under ``FILE#ID``. So a change to one record re-indexes that
record only, and a record that left the file is deleted from the index like a file.

* The rendering is content-addressed: a record's hash covers its text, title and payload
  fields, so a change to a payload field alone updates its points too.
* A file whose hash is the one the last run expanded is not parsed again: its records come
  from the saved state (``records/records.parquet``).
* A line that is not JSON (or not readable: nested too deeply, a number of more than
  4300 digits), a record without its id, a duplicate id, a payload field holding NaN or
  Infinity (no point can store it) or nested more than ``MAX_PAYLOAD_DEPTH`` levels: a
  ``bad_records`` row for the file that names the lines, and the file's records that are
  gone are kept this run (the plan keeps ``FILE#…`` of any file with a failure row); the
  good records are indexed. A file with no records at all (empty, not JSON, not UTF-8) is
  ``unreadable_records``: everything indexed from it is kept.
* A payload integer outside 64 bits (a point stores a signed 64-bit integer, or turned it
  into an inexact float) is stored as its digits, a string.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig, RecordsRule, fingerprint
from ragpipe.ingest.discover import STAGE, IgnoreRules
from ragpipe.ingest.runner import WorkDir
from ragpipe.schemas import Failure, RecordState, Skip, SourceFile

logger = logging.getLogger(__name__)

KIND = "record"  # Markdown written by ragpipe: read as it is (no Docling), headings parsed
KIND_FILE = "records"  # a file a rule matches, before it is expanded
RECORDS_VERSION = "2"  # 2: integers beyond 64 bits are stored as digits (parsed again)
MAX_TITLE_CHARS = 300
MAX_REPORTED_LINES = 10
TOO_DEEP = "nested too deeply to read"
# Deeper payloads are refused: Qdrant's JSON and gRPC readers stop at 128 and 100 levels,
# and reading the stored payload back must not reach Python's recursion limit.
MAX_PAYLOAD_DEPTH = 64
_INT64 = range(-(2**63), 2**63)


@dataclass
class RecordsResult:
    """The files after expansion (records in place of their files), and what went wrong."""

    files: list[SourceFile] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    records: list[RecordState] = field(default_factory=list)
    parsed: int = 0
    reparse: set[str] = field(default_factory=set)  # files with rows to keep: parse again


def rule_for(rel_path: str, rules: Sequence[RecordsRule]) -> RecordsRule | None:
    """The first rule whose glob matches ``rel_path`` (root-relative, POSIX)."""
    for rule in rules:
        if IgnoreRules([rule.glob]).ignores(rel_path):
            return rule
    return None


def relative_path(file_path: str, root: str) -> str:
    """A discovered file's path below its root, as a ``discover.records`` glob reads it:
    the path itself below the root ``.`` (whose files carry no prefix), the name of a file
    given as the root. Discover and the records stage both ask here: a rule with a folder
    in its glob used to match in one and not the other below ``.``, so the file was read
    as one plain-text document."""
    if root in (".", ""):
        return file_path
    prefix = root.rstrip("/") + "/"
    if file_path.startswith(prefix):
        return file_path[len(prefix) :]
    return file_path.rpartition("/")[2]


def _get(record: Any, path: str) -> Any:
    """The value at a dotted path (``answer.body``), or None."""
    value = record
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _id_text(value: Any) -> str:
    """An id as written in JSON (``true``, ``1.5``), on one line."""
    text = value if isinstance(value, str) else json.dumps(value)
    return " ".join(text.split())


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return "\n".join(t for t in (_as_text(v) for v in value) if t)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_TITLE_CHARS]


def render(record: dict[str, Any], rule: RecordsRule) -> tuple[str, str | None]:
    """The record's Markdown (title as heading, text fields as paragraphs) and its title."""
    title = _one_line(_as_text(_get(record, rule.title))) if rule.title else ""
    parts = [t for t in (_as_text(_get(record, name)) for name in rule.text) if t]
    body = "\n\n".join(parts)
    if not body:
        return "", title or None
    return (f"# {title}\n\n{body}\n" if title else f"{body}\n"), title or None


def _payload(record: dict[str, Any], rule: RecordsRule) -> dict[str, Any]:
    """The record's payload fields as a point can hold them.

    Raises:
        ValueError: A field is, or holds, NaN or an infinity (``1e400`` reads as one): no
            point can store it, and it sank the whole upsert.
    """
    payload = {}
    for name in rule.payload:
        value = _get(record, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"payload field {name!r} is not a finite number")
        problem = _payload_problem(value)
        if problem:
            raise ValueError(f"payload field {name!r} {problem}")
        payload[name] = _storable(value)
    return payload


def _payload_problem(value: Any) -> str | None:
    """Why a point cannot hold ``value``, or None. Walked without recursion: a record can
    be nested as deep as the JSON parser allows, deeper than Python's functions go."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return "holds a number that is not finite"
        if isinstance(item, (list, dict)):
            if depth >= MAX_PAYLOAD_DEPTH:
                return f"is nested more than {MAX_PAYLOAD_DEPTH} levels deep"
            items = item.values() if isinstance(item, dict) else item
            stack.extend((v, depth + 1) for v in items)
    return None


def _storable(value: Any) -> Any:
    """``value`` with each integer beyond 64 bits as its digits: a point stored it as a
    float, silently another number (123456789012345678901234567890 came back ...e+29)."""
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT64:
        return str(value)
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {k: _storable(v) for k, v in value.items()}
    return value


def _iter_records(path: Path, rule: RecordsRule) -> Iterator[tuple[str, Any, str | None]]:
    """(where, record, error) of each record: ``line N`` in JSON Lines, ``record N`` (its
    index) in a JSON array.

    Raises:
        ValueError: The file holds no records at all (empty, or not JSON).
    """
    text = path.read_text(encoding="utf-8-sig")  # a BOM is not part of the first record
    if not text.strip():
        raise ValueError("the file is empty")
    if not _SURROGATE_ESCAPE.search(text):
        yield from _records(text, path, rule)
        return
    for where, record, error in _records(text, path, rule):  # rare: only then is every
        try:  # record walked
            record = _mended(record)
        except RecursionError:  # parsed, but deeper than Python's own functions can walk
            record, error = None, TOO_DEEP
        yield where, record, error


# A JSON escape of a UTF-16 surrogate ("\ud83d"): a pair is one character, a lone one (text
# cut mid-emoji by a JavaScript exporter) no character at all, and could not be written:
# the whole discovery failed, every run.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _mended(value: Any) -> Any:
    """``value`` with each lone surrogate in its strings U+FFFD, as a decoder writes a
    broken character."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_mended(v) for v in value]
    if isinstance(value, dict):
        return {_mended(k): _mended(v) for k, v in value.items()}
    return value


def _records(text: str, path: Path, rule: RecordsRule) -> Iterator[tuple[str, Any, str | None]]:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        yield from _lines(text)
        return
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:  # a JSONDecodeError is a ValueError
        lines = [line for line in text.split("\n") if line.strip()]
        if rule.records is None and len(lines) > 1 and lines[-1].lstrip().startswith("{"):
            yield from _lines(text)  # JSON Lines in a .json file
            return
        if isinstance(exc, json.JSONDecodeError):
            raise ValueError(f"not JSON: {_message(exc)} at line {exc.lineno}") from exc
        raise ValueError(_unreadable(exc)) from exc
    records = _get(document, rule.records) if rule.records else document
    if isinstance(records, dict) and rule.records is None:
        records = [records]
    if not isinstance(records, list):
        where = f"at {rule.records!r}" if rule.records else "at the top level"
        raise ValueError(f"no array of records {where} (discover.records[].records)")
    for index, record in enumerate(records):
        yield f"record {index}", record, None


def _lines(text: str) -> Iterator[tuple[str, Any, str | None]]:
    # Split on newlines only: str.splitlines would also split on U+2028 and other separators
    # that JSON allows raw inside strings.
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield f"line {number}", None, f"not JSON ({_message(exc)}, column {exc.colno})"
        except (ValueError, RecursionError) as exc:  # one line's problem, not the file's
            yield f"line {number}", None, _unreadable(exc)
        else:
            yield f"line {number}", record, None


def _message(exc: json.JSONDecodeError) -> str:
    return exc.msg.removesuffix(" at")


def _unreadable(exc: ValueError | RecursionError) -> str:
    """Why JSON that parses could not be read: nested past the recursion limit, or an
    integer of more than 4300 digits (Python's limit on converting one)."""
    if isinstance(exc, RecursionError):
        return TOO_DEEP
    return f"not readable ({str(exc).partition(';')[0]})"  # its advice is for programmers


def _write_body(path: Path, data: bytes) -> None:
    """Write a body under a temporary name, fsync it, rename it; the directory is fsynced
    once for all bodies (``run_records``) before the state names them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.part")
    with temp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temp, path)


def _expand_file(
    source: SourceFile, rule: RecordsRule, rules_fp: str, bodies: Path, result: RecordsResult
) -> None:
    """Parse one file into its records (bodies written, states appended)."""
    problems: list[str] = []
    seen: set[str] = set()
    try:
        entries = list(_iter_records(Path(source.abs_path), rule))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        result.failures.append(
            Failure(
                source.file_path,
                STAGE,
                "unreadable_records",
                f"cannot read records: {exc}; its indexed records are kept until it parses",
                source.sha256,
            )
        )
        return
    for where, record, error in entries:
        if error:
            problems.append(f"{where}: {error}")
            continue
        if not isinstance(record, dict):
            problems.append(f"{where}: a {type(record).__name__}, not an object")
            continue
        if rule.id:
            raw_id = _get(record, rule.id)
            if raw_id is None or isinstance(raw_id, (dict, list)) or not str(raw_id).strip():
                problems.append(f"{where}: no usable {rule.id!r} (discover.records[].id)")
                continue
            record_id = _id_text(raw_id)
        else:
            record_id = where.split()[1]  # its line (JSON Lines) or index (JSON array)
        if record_id in seen:
            problems.append(f"{where}: id {record_id!r} again (ids must be unique in a file)")
            continue
        seen.add(record_id)
        try:
            markdown, title = render(record, rule)
            payload = json.dumps(
                _payload(record, rule), ensure_ascii=False, sort_keys=True, allow_nan=False
            )
        except RecursionError:  # parsed, but deeper than rendering can walk
            problems.append(f"{where}: {TOO_DEEP}")
            continue
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        file_path = f"{source.file_path}#{record_id}"
        if not markdown:
            result.skipped.append(Skip(file_path, "empty_record", "no text in the text fields"))
            result.reparse.add(source.file_path)
            continue
        data = markdown.encode()
        sha = hashlib.sha256(data + b"\x1e" + payload.encode()).hexdigest()
        body = bodies / f"{sha[:32]}.md"
        if not body.is_file():
            _write_body(body, data)
        result.records.append(
            RecordState(
                file_path, source.file_path, source.sha256, rules_fp, record_id, title,
                payload, str(body), source.root, len(data), sha, True,
            )
        )  # fmt: skip
    if problems:
        shown = "; ".join(problems[:MAX_REPORTED_LINES])
        extra = len(problems) - MAX_REPORTED_LINES
        more = f" (and {extra} more)" if extra > 0 else ""
        result.failures.append(
            Failure(
                source.file_path,
                STAGE,
                "bad_records",
                f"{len(problems)} records not indexed: {shown}{more}. The others are; records "
                "of this file that are gone are kept this run",
                source.sha256,
            )
        )


def expand(
    config: RagpipeConfig,
    files: list[SourceFile],
    previous: list[RecordState],
    bodies: Path,
) -> RecordsResult:
    """Replace each file a ``discover.records`` rule matches by its records."""
    result = RecordsResult()
    rules = config.discover.records
    rules_fp = fingerprint_rules(rules)
    saved: dict[tuple[str, str], list[RecordState]] = {}
    for state in previous:
        if state.rules_fingerprint == rules_fp:
            saved.setdefault((state.source_file, state.source_sha256), []).append(state)
    for source in files:
        rule = None
        if source.kind == KIND_FILE:
            rule = rule_for(relative_path(source.file_path, source.root), rules)
        if rule is None:
            result.files.append(source)
            continue
        reuse = saved.get((source.file_path, source.sha256))
        if reuse and all(r.file_clean and Path(r.body_path).is_file() for r in reuse):
            result.records.extend(reuse)  # the file is unchanged: no parsing
        else:
            result.parsed += 1
            _expand_file(source, rule, rules_fp, bodies, result)
    for state in result.records:
        result.files.append(
            SourceFile(
                state.file_path, state.body_path, state.root, KIND, state.size_bytes, state.sha256
            )
        )
    result.files.sort(key=lambda f: f.file_path)
    return result


def fingerprint_rules(rules: Sequence[RecordsRule]) -> str:
    """What shapes a record's rendering: the rules and this module's version."""
    return fingerprint_list([fingerprint(rule, RECORDS_VERSION) for rule in rules])


def fingerprint_list(parts: Sequence[str]) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def saved_records(config: RagpipeConfig) -> list[RecordState]:
    """The record state the last run saved ([] when none or unreadable)."""
    return checkpoint.read_state(
        WorkDir.of(config).records_state, RecordState, "parsing every records file"
    )


def run_records(config: RagpipeConfig, files: list[SourceFile]) -> RecordsResult:
    """Expand the records files among ``files``, save the state, prune unused bodies."""
    work = WorkDir.of(config)
    previous = saved_records(config)
    if not config.discover.records:
        if previous:  # the rules were removed: forget the records
            checkpoint.write_records(work.records_state, [], RecordState)
            _prune(work.records_bodies, [])
        return RecordsResult(files=files)
    result = expand(config, files, previous, work.records_bodies)
    # A file with bad or empty records is parsed again next run (so its rows are kept).
    failed = {f.file_path for f in result.failures} | result.reparse
    keep = [
        dataclasses.replace(r, file_clean=False) if r.source_file in failed else r
        for r in result.records
    ]
    if work.records_bodies.is_dir():
        checkpoint.fsync_dir(work.records_bodies)  # bodies are durable before the state
    checkpoint.write_records(work.records_state, keep, RecordState)
    _prune(work.records_bodies, result.records)
    if result.parsed:
        logger.info("records: %d files parsed, %d records", result.parsed, len(result.records))
    return result


def _prune(bodies: Path, keep: Sequence[RecordState]) -> None:
    if not bodies.is_dir():
        return
    wanted = {Path(r.body_path).name for r in keep}
    for entry in os.scandir(bodies):
        if entry.is_file() and entry.name not in wanted:
            Path(entry.path).unlink(missing_ok=True)


def payload_fields(states: Sequence[RecordState]) -> dict[str, dict[str, Any]]:
    """Per record (``FILE#ID``): what its points carry besides the chunk."""
    return {
        s.file_path: {
            "title": s.title,
            "record_id": s.record_id,
            "source_file": s.source_file,
            "fields": json.loads(s.payload_json),
        }
        for s in states
    }
