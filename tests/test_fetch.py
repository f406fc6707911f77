"""URL sources: robots.txt, the fetch policy, sitemaps, and web pages through the
whole ingest against a loopback site (tests/web_server.py)."""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ragpipe import checkpoint
from ragpipe.config import FetchConfig, RagpipeConfig, load_config, with_sources
from ragpipe.errors import ConfigError, MassDeletionHeld
from ragpipe.ingest.convert import DOC_NAMESPACE, doc_id_for
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.schemas import Failure, Skip, WebPage
from ragpipe.web.http import Disallowed, Fetcher, FetchError, normalise_url
from ragpipe.web.robots import RobotsRules
from ragpipe.web.sitemaps import parse_sitemap
from tests.support.corpora import stored
from tests.support.crash import crash, temp_files
from tests.support.crash_ingest import WEB_POINTS
from tests.support.paths import shared_pdf
from tests.support.web_server import Route, html_page, web_site

pytestmark = pytest.mark.integration

UA = FetchConfig().user_agent

# -- robots.txt (RFC 9309) -----------------------------------------------------------

# The tests' sites run on loopback: named, as a team names the hosts it lists.
LOOPBACK = ("127.0.0.1",)


def test_robots_longest_match_wins_and_allow_wins_ties() -> None:
    rules = RobotsRules.parse(
        "User-agent: *\nDisallow: /docs\nAllow: /docs/public\nAllow: /tie\nDisallow: /tie\n", UA
    )
    assert not rules.allowed("https://x.org/docs/secret")
    assert rules.allowed("https://x.org/docs/public/page")  # longer Allow beats Disallow
    assert rules.allowed("https://x.org/tie")  # equal length: Allow
    assert rules.allowed("https://x.org/other")
    # The standard library takes the first matching rule instead (not RFC 9309).
    from urllib.robotparser import RobotFileParser

    stdlib = RobotFileParser()
    stdlib.parse("User-agent: *\nDisallow: /docs\nAllow: /docs/public\n".splitlines())
    assert not stdlib.can_fetch("ragpipe", "https://x.org/docs/public/page")


def test_robots_wildcards_anchors_and_encoding() -> None:
    rules = RobotsRules.parse(
        "User-agent: *\nDisallow: /*.pdf$\nDisallow: /search?q=*\nDisallow: /a%3Cd.html\n"
        "Disallow:\n",
        UA,
    )
    assert not rules.allowed("https://x.org/files/report.pdf")
    assert rules.allowed("https://x.org/files/report.pdf?download=1")  # $ anchors the end
    assert not rules.allowed("https://x.org/search?q=widgets")
    assert rules.allowed("https://x.org/search")
    assert not rules.allowed("https://x.org/a<d.html")  # %3C and < are the same octet
    assert rules.allowed("https://x.org/robots.txt")


def test_robots_groups_by_product_token() -> None:
    text = (
        "Disallow: /before-any-group\n"  # ignored: no user-agent yet
        "User-agent: *\nDisallow: /\n\n"
        "User-agent: otherbot\nUser-Agent: RagPipe\nDisallow: /private/\nCrawl-delay: 2.5\n\n"
        "User-agent: ragpipe\nDisallow: /drafts/\n"
        "Sitemap: https://x.org/sitemap.xml\n"
    )
    mine = RobotsRules.parse(text, "ragpipe/0.1 (+https://example.org)")
    assert mine.allowed("https://x.org/guide")
    assert not mine.allowed("https://x.org/private/a")
    assert not mine.allowed("https://x.org/drafts/b")  # both ragpipe groups apply
    assert mine.crawl_delay == 2.5
    assert mine.sitemaps == ("https://x.org/sitemap.xml",)
    stranger = RobotsRules.parse(text, "somebot/1.0")
    assert not stranger.allowed("https://x.org/guide")  # falls to the * group
    assert RobotsRules.parse("", UA).allowed("https://x.org/anything")


# -- the fetcher ---------------------------------------------------------------------

ROBOTS = Route(b"User-agent: *\nDisallow: /private/\n", "text/plain")


def test_fetcher_redirects_robots_and_user_agent() -> None:
    routes = {
        "/robots.txt": ROBOTS,
        "/page": Route(html_page("Page", ("A", "text"))),
        "/r1": Route(status=301, location="/r2"),
        "/r2": Route(status=302, location="/page#frag"),
        "/loop1": Route(status=302, location="/loop2"),
        "/loop2": Route(status=302, location="/loop1"),
        "/to-ftp": Route(status=301, location="ftp://files.example.org/x"),
        "/to-private": Route(status=301, location="/private/doc"),
        "/private/doc": Route(html_page("Private", ("A", "text"))),
    }
    with (
        web_site(routes) as site,
        Fetcher(FetchConfig(max_redirects=3), listed_hosts=LOOPBACK) as fetcher,
    ):
        response = fetcher.get(f"{site.url}/r1")
        assert (response.status, response.url) == (200, f"{site.url}/page")
        with pytest.raises(FetchError) as loop:
            fetcher.get(f"{site.url}/loop1")
        assert loop.value.category == "too_many_redirects"
        assert len(site.hits("/loop1")) + len(site.hits("/loop2")) == 4  # 1 + max_redirects
        with pytest.raises(FetchError) as ftp:
            fetcher.get(f"{site.url}/to-ftp")
        assert ftp.value.category == "bad_redirect"
        with pytest.raises(Disallowed):
            fetcher.get(f"{site.url}/private/doc")
        with pytest.raises(Disallowed):  # a redirect hop is checked too
            fetcher.get(f"{site.url}/to-private")
        assert site.hits("/private/doc") == []
        assert len(site.hits("/robots.txt")) == 1  # once per origin and run
        assert {h["user-agent"] for _, h in site.requests} == {UA}


def test_fetcher_timeouts_and_size_cap() -> None:
    body = b"<html><body>" + b"<p>words words words</p>" * 200 + b"</body></html>"
    routes = {
        "/slow": Route(body, delay_s=2.0),
        "/drip": Route(body, drip_s=0.1),  # steady bytes, never a 0.8 s gap
        "/big": Route(b"x" * 10_000, "text/plain"),
        "/big-no-length": Route(b"x" * 10_000, "text/plain", send_length=False),
        "/ok": Route(b"small enough", "text/plain"),
    }
    config = FetchConfig(timeout_s=0.8, max_bytes=8_000)
    with web_site(routes) as site, Fetcher(config, listed_hosts=LOOPBACK) as fetcher:
        categories = {}
        for path in ("/slow", "/drip", "/big", "/big-no-length"):
            with pytest.raises(FetchError) as err:
                fetcher.get(f"{site.url}{path}")
            categories[path] = (err.value.category, str(err.value).split(" ")[0])
        assert categories == {
            "/slow": ("timeout", "no"),
            "/drip": ("timeout", "body"),  # the whole request is bounded, not each read
            "/big": ("too_large", "Content-Length"),
            "/big-no-length": ("too_large", "body"),
        }
        assert fetcher.get(f"{site.url}/ok").body == b"small enough"


def test_robots_txt_errors() -> None:
    with web_site({"/robots.txt": Route(b"down", "text/plain", status=503)}) as site:
        with (
            Fetcher(FetchConfig(), listed_hosts=LOOPBACK) as fetcher,
            pytest.raises(FetchError) as err,
        ):
            fetcher.get(f"{site.url}/page")
        assert err.value.category == "robots_unreachable"
        assert site.hits("/page") == []  # RFC 9309: an unreachable robots.txt forbids all
    no_robots = {"/page": Route(b"hello there", "text/plain")}  # robots.txt: 404
    with web_site(no_robots) as site, Fetcher(FetchConfig(), listed_hosts=LOOPBACK) as fetcher:
        assert fetcher.get(f"{site.url}/page").status == 200


def test_crawl_delay_spaces_requests_to_a_host() -> None:
    robots = Route(b"User-agent: *\nCrawl-delay: 100\n", "text/plain")
    routes = {
        "/robots.txt": robots,
        "/a": Route(b"a", "text/plain"),
        "/b": Route(b"b", "text/plain"),
    }
    now = [1000.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    config = FetchConfig(max_delay_s=5.0, delay_s=1.0)
    with (
        web_site(routes) as site,
        Fetcher(config, clock=lambda: now[0], sleep=sleep, listed_hosts=LOOPBACK) as fetcher,
    ):
        fetcher.get(f"{site.url}/a")
        fetcher.get(f"{site.url}/b")
    # robots.txt, then /a and /b each after the Crawl-delay, capped at max_delay_s.
    assert slept == [5.0, 5.0]
    config = FetchConfig(delay_s=1.0)
    with web_site({"/a": routes["/a"], "/b": routes["/b"]}) as site:
        slept.clear()
        with Fetcher(config, clock=lambda: now[0], sleep=sleep, listed_hosts=LOOPBACK) as fetcher:
            fetcher.get(f"{site.url}/a")
            fetcher.get(f"{site.url}/b")
    assert slept == [1.0, 1.0]  # no robots.txt: fetch.delay_s alone


# -- sitemaps ------------------------------------------------------------------------

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def test_parse_sitemap_forms() -> None:
    urlset = f"<?xml version='1.0'?><urlset {NS}><url><loc> https://x.org/a?x=1&amp;y=2 </loc>"
    urlset += "<lastmod>2026-01-01</lastmod></url><url><loc>https://x.org/b</loc></url></urlset>"
    assert parse_sitemap(urlset.encode(), 10_000) == (
        ["https://x.org/a?x=1&y=2", "https://x.org/b"],
        [],
    )
    index = f"<sitemapindex {NS}><sitemap><loc>https://x.org/s1.xml</loc></sitemap></sitemapindex>"
    assert parse_sitemap(index.encode(), 10_000) == ([], ["https://x.org/s1.xml"])
    assert parse_sitemap(gzip.compress(urlset.encode()), 10_000)[0][1] == "https://x.org/b"
    assert parse_sitemap(b"https://x.org/a\n\nhttps://x.org/c\n", 100) == (
        ["https://x.org/a", "https://x.org/c"],
        [],
    )
    bad = {
        b"<html><body>not a sitemap</body></html>": "corrupt",
        b"<urlset><url>": "corrupt",
        b"just words": "corrupt",
        b'<!DOCTYPE x [<!ENTITY a "aaaa">]><urlset/>': "corrupt",
        gzip.compress(b"https://x.org/" + b"a" * 5000): "too_large",
    }
    for body, category in bad.items():
        with pytest.raises(FetchError) as err:
            parse_sitemap(body, 1000)
        assert err.value.category == category, body[:30]


def test_normalise_url() -> None:
    assert normalise_url("HTTPS://Example.ORG:443/a/b?q=1#part") == "https://example.org/a/b?q=1"
    assert normalise_url("http://example.org") == "http://example.org/"
    assert normalise_url("http://example.org:8080/x") == "http://example.org:8080/x"


# -- config --------------------------------------------------------------------------


def test_config_rejects_non_http_urls(tmp_path: Path) -> None:
    path = tmp_path / "ragpipe.yaml"
    path.write_text("discover:\n  urls: [ftp://files.example.org/x, 'https://ok.example.org/']\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "discover.urls" in str(err.value) and "only http and https" in str(err.value)
    path.write_text("discover:\n  roots: []\n")
    with pytest.raises(ConfigError, match="no sources"):
        load_config(path)
    path.write_text("discover:\n  roots: []\n  sitemaps: ['https://x.org/sitemap.xml']\n")
    assert load_config(path).discover.sitemaps == ["https://x.org/sitemap.xml"]
    cfg = with_sources(load_config(path), ["docs", "https://x.org/page"])
    assert (cfg.discover.roots, cfg.discover.urls, cfg.discover.sitemaps) == (
        [Path("docs")],
        ["https://x.org/page"],
        [],
    )
    with pytest.raises(ConfigError, match=r"discover\.urls"):
        with_sources(cfg, ["file:///etc/passwd"])
    with pytest.raises(ConfigError) as secret:
        with_sources(cfg, ["https://bob:hunter2@x.org/page"])
    assert "carries credentials" in str(secret.value)
    assert "hunter2" not in str(secret.value) and "bob:***@x.org" in str(secret.value)
    # `ragpipe ingest ""` (or a blank root in the Prefect form) was Path("") = ".": the
    # whole working directory was indexed.
    for blank in ("", "  "):
        with pytest.raises(ConfigError, match=r"discover\.roots\.0: is empty"):
            with_sources(cfg, [blank])


# -- through the whole ingest --------------------------------------------------------

GUIDE = html_page(
    "Install Guide",
    ("Requirements", "Python 3.11 or newer is needed to run the widget installer on Linux."),
    ("Steps", "Run pip install widget, then widget init inside the project folder."),
)
GERMAN = html_page(
    "Anleitung",
    (
        "Voraussetzungen",
        "Für die Installation wird Python benötigt, und der Rechner muss mit dem Internet "
        "verbunden sein, damit alle Pakete geladen werden können.",
    ),
    lang="de",
)
LATIN1 = (
    "<html><head><title>Caf\xe9 M\xfcller</title></head><body><h1>Caf\xe9 M\xfcller</h1>"
    "<p>Das Caf\xe9 M\xfcller \xf6ffnet um acht Uhr und schlie\xdft um sechs.</p></body></html>"
).encode("latin-1")
PLAIN = b"Plain notes. The widget counts apples and pears in a basket."
LAST_MODIFIED = "Wed, 21 Oct 2026 07:28:00 GMT"


def _site_routes(pdf: bytes) -> dict[str, Route]:
    return {
        "/robots.txt": ROBOTS,
        "/guide": Route(GUIDE, etag='"guide-v1"'),
        "/de": Route(GERMAN, last_modified=LAST_MODIFIED),
        "/plain": Route(
            b"Plain notes. The widget counts apples and pears in a basket.", "text/plain"
        ),
        "/manual.pdf": Route(pdf, "application/pdf", etag='"pdf-v1"'),
        "/cafe": Route(LATIN1, "text/html; charset=iso-8859-1"),
        "/old-guide": Route(status=301, location="/guide"),
        "/private/notes": Route(html_page("Private", ("Notes", "Not for robots."))),
        "/logo.png": Route(b"\x89PNG\r\n\x1a\n....", "image/png"),
        "/slow": Route(GUIDE, delay_s=2.0),
        "/empty": Route(b"", "text/html"),
        "/broken.pdf": Route(b"%PDF-1.4\n this is not really a PDF \n%%EOF", "application/pdf"),
        "/huge": Route(b"y" * 300_000, "text/plain"),
        "/sitemap.xml": Route(
            f"<sitemapindex {NS}><sitemap><loc>SITE/pages.xml</loc></sitemap>"
            "</sitemapindex>".encode(),
            "application/xml",
        ),
        "/pages.xml": Route(
            (
                f"<urlset {NS}><url><loc>SITE/guide</loc></url><url><loc>SITE/plain</loc></url>"
                "<url><loc>SITE/gone</loc></url><url><loc>ftp://files.example.org/x</loc></url>"
                "</urlset>"
            ).encode(),
            "application/xml",
        ),
    }


def _config(site_url: str, tmp_path: Path, **discover: Any) -> RagpipeConfig:
    urls = ["/de", "/manual.pdf", "/cafe", "/old-guide", "/private/notes", "/logo.png"]
    urls += ["/slow", "/huge", "/empty", "/broken.pdf"]
    return RagpipeConfig(
        discover={
            "roots": [],
            "urls": [site_url + u for u in urls],
            "sitemaps": [f"{site_url}/sitemap.xml"],
            **discover,
        },
        fetch={"timeout_s": 1.0, "max_bytes": 200_000},
        chunk={"size": 400, "overlap": 50},
        embed={"provider": "onnx", "batch_size": 16},
        store={"path": tmp_path / "store"},
        paths={"work_dir": tmp_path / "work"},
    )


def _by_url(points: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for payload in points.values():
        out.setdefault(payload["file_path"], []).append(payload)
    return out


def _failures(cfg: RagpipeConfig) -> dict[str, str]:
    rows = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    return {f.file_path: f.category for f in rows}


def _skips(cfg: RagpipeConfig) -> dict[str, str]:
    rows = checkpoint.read_records(cfg.paths.work_dir / "discover" / "skipped.parquet", Skip)
    return {s.file_path: s.reason for s in rows}


def _serve_sitemaps(site: Any) -> None:
    for path in ("/sitemap.xml", "/pages.xml"):
        route = site.routes[path]
        route.body = route.body.replace(b"SITE", site.url.encode())


def test_web_pages_ingest_and_nightly_refetch(tmp_path: Path) -> None:
    pdf = shared_pdf("multi_page.pdf").read_bytes()
    with web_site(_site_routes(pdf)) as site:
        _serve_sitemaps(site)
        u = site.url
        cfg = _config(u, tmp_path)
        first = run_ingest(cfg)

        # Every outcome is a row: pages indexed, failures and skips with their reason.
        assert _failures(cfg) == {
            f"{u}/slow": "timeout",
            f"{u}/huge": "too_large",
            f"{u}/gone": "not_found",
            f"{u}/empty": "empty",
            f"{u}/broken.pdf": "corrupt",  # fetched fine; Docling cannot read it
        }
        assert _skips(cfg) == {
            f"{u}/private/notes": "robots_disallowed",
            f"{u}/logo.png": "unsupported_content_type",
            "ftp://files.example.org/x": "unsupported_scheme",
            f"{u}/old-guide": "duplicate_content",  # redirected to /guide, listed too
        }
        pages = _by_url(stored(cfg))
        indexed = [f"{u}{p}" for p in ("/cafe", "/de", "/guide", "/manual.pdf", "/plain")]
        assert sorted(pages) == indexed
        assert (first.seen, first.added, first.failed) == (6, 6, 5)
        for url, payloads in pages.items():
            for p in payloads:
                assert p["doc_id"] == str(uuid.uuid5(DOC_NAMESPACE, url)) == doc_id_for(url)
                assert p["source_url"] == url
                datetime.fromisoformat(p["fetched_at"])
        guide = pages[f"{u}/guide"]
        assert {p["title"] for p in guide} == {"Install Guide"}
        assert {p["language"] for p in guide} == {"en"}
        assert ["Install Guide", "Requirements"] in [p["heading_path"] for p in guide]
        assert {p["language"] for p in pages[f"{u}/de"]} == {"de"}
        cafe = " ".join(p["text"] for p in pages[f"{u}/cafe"])
        assert "Café Müller öffnet" in cafe  # decoded by the HTTP charset
        assert {p["title"] for p in pages[f"{u}/cafe"]} == {"Café Müller"}
        assert {p["content_type"] for p in pages[f"{u}/manual.pdf"]} == {"application/pdf"}
        assert len(site.hits("/robots.txt")) == 1
        assert {h["user-agent"] for _, h in site.requests} == {UA}
        assert site.hits("/private/notes") == []
        before = stored(cfg)

        # Nightly, nothing changed: one request per page, answered 304 where the
        # server has validators, and nothing re-embedded or re-written.
        site.requests.clear()
        second = run_ingest(cfg)
        # broken.pdf is retried (and fails) every run: a source that failed is not indexed.
        assert (second.added, second.changed, second.skipped_unchanged) == (1, 0, 5)
        assert (second.chunks_written, second.chunks_deleted) == (0, 0)
        assert second.stages["embed"]["embedded"] == 0
        assert stored(cfg) == before
        assert site.hits("/guide")[0]["if-none-match"] == '"guide-v1"'
        assert site.hits("/de")[0]["if-modified-since"] == LAST_MODIFIED
        assert site.hits("/manual.pdf")[0]["if-none-match"] == '"pdf-v1"'
        for path in ("/de", "/manual.pdf", "/cafe", "/plain"):
            assert len(site.hits(path)) == 1, path
        assert second.stages["discover"]["pages_not_modified"] == 4  # guide twice: via /old-guide

        # The guide changes, /plain is re-served with the same bytes, /de is gone, the PDF
        # becomes disallowed: 2 of 5 indexed pages would go, over the 20 % guard.
        site.routes["/guide"] = Route(
            GUIDE.replace(b"Linux", b"Linux and macOS"), etag='"guide-v2"'
        )
        del site.routes["/de"]
        site.routes["/robots.txt"] = Route(
            b"User-agent: *\nDisallow: /private/\nDisallow: /*.pdf$\n", "text/plain"
        )
        with pytest.raises(MassDeletionHeld):
            run_ingest(cfg)
        held = _by_url(stored(cfg))
        assert f"{u}/de" in held and f"{u}/manual.pdf" in held
        assert {p["source_sha"] for p in held[f"{u}/guide"]} != {
            p["source_sha"] for p in pages[f"{u}/guide"]
        }  # the change was applied; only deletions wait

        third = run_ingest(cfg, allow_mass_delete=True)
        assert third.removed == 2
        assert third.changed == 0 and third.stages["embed"]["embedded"] == 0
        after = _by_url(stored(cfg))
        assert sorted(after) == [f"{u}/cafe", f"{u}/guide", f"{u}/plain"]
        assert after[f"{u}/plain"] == pages[f"{u}/plain"]  # same bytes: same points
        assert _skips(cfg)[f"{u}/manual.pdf"] == "robots_disallowed"
        assert _failures(cfg)[f"{u}/de"] == "not_found"

        # A page that times out keeps its indexed version (it is not gone).
        site.routes["/plain"].delay_s = 2.0
        fourth = run_ingest(cfg)
        assert _failures(cfg)[f"{u}/plain"] == "timeout"
        assert fourth.removed == 0
        assert f"{u}/plain" in _by_url(stored(cfg))


def test_sitemap_outage_keeps_its_pages(tmp_path: Path) -> None:
    routes = {
        "/a": Route(html_page("Alpha", ("One", "The first page of the site talks about apples."))),
        "/b": Route(html_page("Beta", ("Two", "The second page of the site talks about bees."))),
        "/sitemap.xml": Route(
            f"<urlset {NS}><url><loc>SITE/a</loc></url><url><loc>SITE/b</loc></url>"
            "</urlset>".encode(),
            "application/xml",
        ),
    }
    with web_site(routes) as site:
        sitemap = site.routes["/sitemap.xml"]
        sitemap.body = sitemap.body.replace(b"SITE", site.url.encode())
        cfg = RagpipeConfig(
            discover={"roots": [], "sitemaps": [f"{site.url}/sitemap.xml"]},
            embed={"provider": "onnx"},
            store={"path": tmp_path / "store"},
            paths={"work_dir": tmp_path / "work"},
        )
        run_ingest(cfg)
        before = stored(cfg)
        assert sorted(_by_url(before)) == [f"{site.url}/a", f"{site.url}/b"]
        sitemap.status = 500
        site.requests.clear()
        outage = run_ingest(cfg)
        assert _failures(cfg) == {f"{site.url}/sitemap.xml": "sitemap_http_error"}
        assert (outage.removed, outage.skipped_unchanged) == (0, 2)
        assert len(site.hits("/a")) == 1  # the pages it listed last time are still checked
        assert stored(cfg) == before

        # URL sources dropped from the config: their pages leave the index, the state empties.
        files = tmp_path / "files"
        files.mkdir()
        (files / "note.md").write_text("# Note\n\nA local note about the garden.\n")
        local = cfg.model_copy(
            update={"discover": cfg.discover.model_copy(update={"roots": [files], "sitemaps": []})}
        )
        dropped = run_ingest(local, allow_mass_delete=True)
        assert dropped.removed == 2
        assert sorted(_by_url(stored(local))) == [f"{files}/note.md"]
        state = tmp_path / "work" / "fetch"
        assert checkpoint.read_records(state / "pages.parquet", WebPage) == []
        assert list((state / "bodies").iterdir()) == []


def test_cli_ingests_a_url_argument(tmp_path: Path, prefect_harness: None) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    routes = {"/guide": Route(GUIDE, etag='"v1"')}
    config = tmp_path / "ragpipe.yaml"
    config.write_text(
        f"embed: {{provider: onnx}}\nstore: {{path: {tmp_path / 'store'}}}\n"
        f"paths: {{work_dir: {tmp_path / 'work'}}}\n"
    )
    with web_site(routes) as site:
        result = CliRunner().invoke(app, ["ingest", "-c", str(config), f"{site.url}/guide"])
        assert result.exit_code == 0, result.output
        assert "seen=1 added=1" in result.output
        cfg = load_config(config)
        assert sorted(_by_url(stored(cfg))) == [f"{site.url}/guide"]
        bad = CliRunner().invoke(app, ["ingest", "-c", str(config), "ftp://files.example.org/x"])
        assert bad.exit_code == 2
        said = " ".join(bad.output.split())  # the console wraps long lines
        assert "discover.urls: 'ftp://files.example.org/x' is not an http(s) URL" in said


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("point", WEB_POINTS)
def test_sigkill_mid_fetch_then_rerun_equals_a_clean_run(tmp_path: Path, point: str) -> None:
    # Plain-text pages: the child does not spend seconds importing Docling.
    def page(name: str, version: int) -> Route:
        text = f"{name} notes, version {version}. " + f"The {name} page talks about {name}. " * 8
        return Route(text.encode(), "text/plain; charset=utf-8", etag=f'"{name}-{version}"')

    routes = {f"/{name}": page(name, 1) for name in ("alpha", "beta", "gamma", "delta")}
    with web_site(routes) as site:
        urls = [f"{site.url}/{name}" for name in ("alpha", "beta", "gamma", "delta")]

        def config(base: Path) -> RagpipeConfig:
            return RagpipeConfig(
                discover={"roots": [], "urls": urls},
                embed={"provider": "onnx"},
                index={"max_delete_share": 1.0},
                store={"path": base / "store"},
                paths={"work_dir": base / "work"},
            )

        cfg = config(tmp_path / "crashed")
        run_ingest(cfg)
        site.routes["/beta"] = page("beta", 2)  # two pages change overnight
        site.routes["/delta"] = page("delta", 2)
        discover_before = checkpoint.read_manifest(cfg.paths.work_dir / "discover")
        state_before = checkpoint.read_records(
            cfg.paths.work_dir / "fetch" / "pages.parquet", WebPage
        )
        crash(cfg, point)
        # Nothing claims the interrupted fetch finished.
        assert checkpoint.read_manifest(cfg.paths.work_dir / "discover") == discover_before
        state = checkpoint.read_records(cfg.paths.work_dir / "fetch" / "pages.parquet", WebPage)
        assert state == state_before
        assert all(Path(p.body_path).is_file() for p in state)  # the state's bodies are intact

        summary = run_ingest(cfg)
        assert summary.ok and (summary.changed, summary.skipped_unchanged) == (2, 2)
        clean = config(tmp_path / "clean")
        run_ingest(clean)
        assert _timeless(stored(cfg)) == _timeless(stored(clean))
        assert temp_files(cfg) == []
        again = run_ingest(cfg)
        assert (again.chunks_written, again.chunks_deleted, again.skipped_unchanged) == (0, 0, 4)


def _timeless(points: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        pid: {k: v for k, v in p.items() if k not in ("ingested_at", "fetched_at")}
        for pid, p in points.items()
    }


# -- found by attack (a review of the fetcher against hostile sites) --------------------


def test_an_empty_disallow_ends_a_group_and_versioned_agent_names_match() -> None:
    """ "User-agent: ragpipe / Disallow: (nothing)" then "User-agent: * / Disallow: /" (the
    classic "only this bot may crawl") merged into one group: ragpipe was refused every
    page, and the next run removed them all from the index."""
    only_us = "User-agent: ragpipe\nDisallow:\n\nUser-agent: *\nDisallow: /\n"
    assert RobotsRules.parse(only_us, UA).allowed("https://x.org/docs/page")
    assert not RobotsRules.parse(only_us, "otherbot/2").allowed("https://x.org/docs/page")
    odd_delay = "User-agent: ragpipe\nCrawl-delay: soon\n\nUser-agent: *\nDisallow: /\n"
    assert RobotsRules.parse(odd_delay, UA).allowed("https://x.org/a")
    versioned = "User-agent: RagPipe/1.0\nDisallow: /drafts/\n\nUser-agent: *\nDisallow: /\n"
    rules = RobotsRules.parse(versioned, UA)
    assert rules.allowed("https://x.org/a") and not rules.allowed("https://x.org/drafts/b")


@contextmanager
def _robots_on_localhost(status: int, page: str) -> Iterator[str]:
    """A site (its URL) whose robots.txt redirects to ROBOTS on another host, localhost."""
    with web_site({"/robots.txt": ROBOTS}) as other:
        port = other.url.rsplit(":", 1)[1]
        routes = {
            "/robots.txt": Route(status=status, location=f"http://localhost:{port}/robots.txt"),
            page: Route(b"p", "text/plain"),
        }
        with web_site(routes) as site:
            yield site.url


def test_robots_txt_past_the_cap_is_read_to_it_and_redirect_trouble_is_no_robots_txt() -> None:
    """A robots.txt over 512 KiB was "unreachable" (so the site was never crawled, blamed on
    a fetch.max_bytes the user never set); one that redirected to another host, or in a
    loop, was too. RFC 9309: parse at least 500 KiB; follow redirects across hosts; past
    five, take robots.txt as unavailable (as a 4xx)."""
    padding = b"# " + b"x" * 98 + b"\n"
    big = b"User-agent: *\nDisallow: /private/\n" + padding * 6_000 + b"Disallow: /late/\n"
    routes = {
        "/robots.txt": Route(big, "text/plain"),
        "/late/a": Route(b"a", "text/plain"),
        "/private/a": Route(b"p", "text/plain"),
    }
    with web_site(routes) as site, Fetcher(FetchConfig(), listed_hosts=LOOPBACK) as fetcher:
        assert fetcher.get(f"{site.url}/late/a").body == b"a"  # past the cap: unread
        with pytest.raises(Disallowed):
            fetcher.get(f"{site.url}/private/a")
    with (
        _robots_on_localhost(301, "/private/a") as url,
        Fetcher(FetchConfig(), listed_hosts=(*LOOPBACK, "localhost")) as fetcher,
        pytest.raises(Disallowed),  # the other host's robots.txt applies
    ):
        fetcher.get(f"{url}/private/a")
    loop = {
        "/robots.txt": Route(status=302, location="/robots2.txt"),
        "/robots2.txt": Route(status=302, location="/robots.txt"),
        "/page": Route(b"page", "text/plain"),
    }
    with web_site(loop) as site, Fetcher(FetchConfig(), listed_hosts=LOOPBACK) as fetcher:
        assert fetcher.get(f"{site.url}/page").body == b"page"


def test_a_compressed_body_cut_short_is_corrupt_and_raw_deflate_is_read() -> None:
    import zlib

    page = b"<html><body>" + b"".join(b"<p>paragraph %d</p>" % i for i in range(2000)) + b"</body>"
    cut = gzip.compress(page)[: len(gzip.compress(page)) // 3]
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    deflated = raw.compress(page) + raw.flush()
    routes = {
        "/cut": Route(cut, headers={"Content-Encoding": "gzip"}),
        "/cut-closed": Route(cut, headers={"Content-Encoding": "gzip"}, send_length=False),
        "/raw": Route(deflated, headers={"Content-Encoding": "deflate"}),
        "/zlib": Route(zlib.compress(page), headers={"Content-Encoding": "deflate"}),
    }
    with web_site(routes) as site, Fetcher(FetchConfig(), listed_hosts=LOOPBACK) as fetcher:
        for path in ("/cut", "/cut-closed"):  # before: a third of the page, stored as new
            with pytest.raises(FetchError) as err:
                fetcher.get(f"{site.url}{path}")
            assert err.value.category == "corrupt" and "cut short" in str(err.value)
        assert fetcher.get(f"{site.url}/raw").body == page  # before: "incorrect header check"
        assert fetcher.get(f"{site.url}/zlib").body == page


def test_sitemap_urls_keep_their_query_and_a_bom_list_is_read() -> None:
    """html.unescape after the XML parser read "&section=2" as "§ion=2" (HTML's legacy
    entities need no ";"): the page was never fetched."""
    urlset = (
        f"<urlset {NS}><url><loc>https://x.org/view?id=1&amp;section=2&amp;region=eu</loc></url>"
        "<url><loc>https://x.org/twice?a=1&amp;amp;b=2</loc></url></urlset>"
    )
    assert parse_sitemap(urlset.encode(), 10_000)[0] == [
        "https://x.org/view?id=1&section=2&region=eu",
        "https://x.org/twice?a=1&b=2",  # escaped twice by the site: mended
    ]
    assert parse_sitemap(b"\xef\xbb\xbfhttps://x.org/a\nhttps://x.org/b\n", 1000)[0] == [
        "https://x.org/a",
        "https://x.org/b",
    ]


def test_a_utf8_page_with_a_stale_meta_charset_is_stored_as_read(tmp_path: Path) -> None:
    """The HTTP charset decoded the page, but the stored copy kept its own
    <meta charset="windows-1252">, which Docling obeyed: "CafÃ© MÃ¼ller" in every chunk."""
    from ragpipe.config import ConvertConfig
    from ragpipe.ingest.convert import Converter
    from ragpipe.schemas import SourceFile
    from ragpipe.web.pages import _stored_body

    body = (
        '<html><head><meta charset="windows-1252"><title>Café Müller</title></head>'
        "<body><h1>Café Müller</h1><p>Das Café Müller öffnet um acht Uhr.</p></body></html>"
    ).encode()
    path, title = _stored_body(tmp_path, body, "https://x.org/cafe", "ab" * 32, "html", "utf-8")
    assert title == "Café Müller"
    source = SourceFile("https://x.org/cafe", str(path), "https://x.org", "html",
                        path.stat().st_size, "ab" * 32)  # fmt: skip
    doc = Converter(ConvertConfig()).convert(source, "fp")
    assert "Das Café Müller öffnet um acht Uhr." in doc.markdown and "Ã" not in doc.markdown


def test_robots_redirects_past_max_redirects_cr_lines_gzip_members_and_kept_bodies(
    tmp_path: Path,
) -> None:
    """The review of the fixes above: a redirected robots.txt under max_redirects 0 was read
    as none (its Disallow ignored); a long CR-only robots.txt was cut to nothing; a gzip
    body of two members kept the first; a page kept by a 304 from before the UTF-8
    declaration never got it."""
    from ragpipe.web.pages import UTF8_DECLARATION, _declare_utf8

    routes = {
        "/robots.txt": Route(status=301, location="/robots-real.txt"),
        "/robots-real.txt": Route(b"User-agent: *\nDisallow: /private/\n", "text/plain"),
        "/private/c": Route(b"secret", "text/plain"),
    }
    with (
        web_site(routes) as site,
        Fetcher(FetchConfig(max_redirects=0), listed_hosts=LOOPBACK) as fetcher,
        pytest.raises(Disallowed),  # RFC 9309's five hops, whatever fetch.max_redirects says
    ):
        fetcher.get(f"{site.url}/private/c")
    cr = b"User-agent: *\rDisallow: /private/\r" + (b"# " + b"x" * 98 + b"\r") * 6_000
    page = b"<p>" + b"words " * 200 + b"</p>"
    members = gzip.compress(page[:300]) + gzip.compress(page[300:])
    routes = {
        "/robots.txt": Route(cr, "text/plain"),
        "/private/a": Route(b"p", "text/plain"),
        "/two": Route(members, headers={"Content-Encoding": "gzip"}),
    }
    with web_site(routes) as site, Fetcher(FetchConfig(), listed_hosts=LOOPBACK) as fetcher:
        with pytest.raises(Disallowed):
            fetcher.get(f"{site.url}/private/a")
        assert fetcher.get(f"{site.url}/two").body == page
    body = tmp_path / "old.html"
    old = '<html><head><meta charset="windows-1252"></head><body>Café</body></html>'
    body.write_text(old, encoding="utf-8")
    kept = WebPage("https://x.org/", "https://x.org/", "urls", "html", "text/html", None, None,
                   "ab" * 32, 10, "t", "t", None, str(body))  # fmt: skip
    _declare_utf8(kept)
    _declare_utf8(kept)  # once
    assert body.read_text(encoding="utf-8") == UTF8_DECLARATION + old


def test_gzip_members_stay_under_the_cap_and_robots_quirks() -> None:
    """The third review: a first member of exactly the cap and two more crashed the fetch
    (ValueError: max_length must be non-negative) and a second one was read without any
    limit (60 MB for a 1,000-byte cap); bytes after the stream were all kept; a robots.txt
    redirected to a refused private address allowed everything; a BOM hid its first group."""
    from ragpipe.web.http import _Decoder

    bomb = gzip.compress(b"A" * 1001) + gzip.compress(bytes(5_000_000)) + gzip.compress(b"C")
    out = _Decoder("gzip").feed(bomb, 1000)
    assert 1000 < len(out) <= 1001  # over the cap by a byte: too_large, nothing more read
    decoder = _Decoder("gzip")
    assert decoder.feed(gzip.compress(b"tiny") + bytes(65_536), 10_000) == b"tiny"
    assert decoder.feed(bytes(65_536), 10_000) == b"" and decoder._zlib is not None
    assert len(decoder._zlib.unused_data) <= 65_536  # not every chunk kept
    decoder.finish()  # whole: the stream ended
    bom = b"\xef\xbb\xbfUser-agent: *\nDisallow: /private/\n"
    routes = {"/robots.txt": Route(bom, "text/plain"), "/private/a": Route(b"p", "text/plain")}
    with (
        web_site(routes) as site,
        Fetcher(FetchConfig(), listed_hosts=LOOPBACK) as fetcher,
        pytest.raises(Disallowed),
    ):
        fetcher.get(f"{site.url}/private/a")
    with (
        _robots_on_localhost(302, "/secret") as url,
        Fetcher(FetchConfig(), listed_hosts=LOOPBACK) as fetcher,
        pytest.raises(FetchError) as err,  # localhost is not listed: refused
    ):
        fetcher.get(f"{url}/secret")
    assert err.value.category == "robots_unreachable"


def test_a_gzip_member_split_after_its_first_byte_is_still_read() -> None:
    """The fourth review: a second member whose header was split after its first byte by
    the network was dropped as trailing bytes (1,000 of 2,000 bytes, no error)."""
    from ragpipe.web.http import _Decoder

    first = gzip.compress(b"A" * 1000)
    body = first + gzip.compress(b"B" * 1000)
    for cut in range(len(first) - 2, len(first) + 3):
        decoder = _Decoder("gzip")
        out = decoder.feed(body[:cut], 10**6) + decoder.feed(body[cut:], 10**6)
        decoder.finish()
        assert out == b"A" * 1000 + b"B" * 1000, cut
    one_by_one = _Decoder("gzip")
    assert b"".join(one_by_one.feed(body[i : i + 1], 10**6) for i in range(len(body))) == (
        b"A" * 1000 + b"B" * 1000
    )


def test_a_host_name_that_is_no_dns_name_is_a_row_never_a_crash(tmp_path: Path) -> None:
    """A host "a..b" or one with a 64-character label fails the resolver's IDNA encoding with
    a UnicodeError, which nothing caught: a robots.txt or page redirecting there, a sitemap
    listing it, or a typo in discover.urls killed the whole discover stage (rc 1)."""
    from ragpipe.web.pages import fetch_pages

    long_label = "http://" + "x" * 64 + ".example.org/"
    with web_site({"/robots.txt": Route(status=301, location="http://a..b/robots.txt")}) as site:
        site.routes.update({
            "/page": Route(b"a page", "text/plain"),
            "/moved": Route(status=302, location=long_label),
            "/sitemap.xml": Route(
                f"<urlset {NS}><url><loc>{site.url}/page</loc></url>"
                "<url><loc>http://c..d/listed</loc></url></urlset>".encode(),
                "application/xml",
            ),
        })  # fmt: skip
        result = fetch_pages(
            FetchConfig(cross_host_redirects=True),
            [f"{site.url}/moved", "http://a..b/typo"],
            [f"{site.url}/sitemap.xml"],
            tmp_path / "bodies",
            [],
        )
    # robots.txt redirected to no host at all: read as none (a bad redirect), the page is in.
    assert [f.file_path for f in result.files] == [f"{site.url}/page"]
    assert [(f.file_path, f.category) for f in result.failures] == [
        (f"{site.url}/moved", "bad_redirect")
    ]
    assert "no DNS name" in result.failures[0].message
    assert sorted((s.file_path, s.reason) for s in result.skipped) == [
        ("http://a..b/typo", "unsupported_scheme"),
        ("http://c..d/listed", "unsupported_scheme"),
    ]
    # In the config, the typo is refused at load, naming the setting and the host.
    path = tmp_path / "ragpipe.yaml"
    path.write_text("discover:\n  urls: ['http://docs..example.org/guide']\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "discover.urls: 'http://docs..example.org/guide' has a host name that is no DNS " in (
        str(err.value)
    )


# -- found by the source review (loopback pages through the whole ingest) ---------------


def _pages_config(tmp_path: Path, urls: list[str]) -> RagpipeConfig:
    return RagpipeConfig(
        discover={"roots": [], "urls": urls},
        fetch={"timeout_s": 2.0},
        chunk={"size": 400, "overlap": 50},
        embed={"provider": "onnx", "batch_size": 16},
        index={"max_delete_share": 1.0},
        store={"path": tmp_path / "store"},
        paths={"work_dir": tmp_path / "work"},
    )


def _skip_details(cfg: RagpipeConfig) -> dict[str, tuple[str, str]]:
    rows = checkpoint.read_records(cfg.paths.work_dir / "discover" / "skipped.parquet", Skip)
    return {s.file_path: (s.reason, s.detail) for s in rows}


def _texts(points: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {url: sorted(p["text"] for p in ps) for url, ps in _by_url(points).items()}


def test_a_redirecting_alias_never_takes_the_place_of_the_page_it_redirects_to(
    tmp_path: Path,
) -> None:
    """/a-old-guide (301 to /guide) sorts before /guide: /guide was the duplicate_content
    skip row, and its text was indexed under the alias (citations pointed at the redirect).
    Listed in either order, the page is indexed under its own URL."""
    with web_site(
        {"/guide": Route(GUIDE), "/a-old-guide": Route(status=301, location="/guide")}
    ) as site:
        u = site.url
        cfg = _pages_config(tmp_path, [f"{u}/a-old-guide", f"{u}/guide"])
        summary = run_ingest(cfg)
        assert (summary.seen, summary.added, summary.failed) == (1, 1, 0)
        assert _skip_details(cfg) == {
            f"{u}/a-old-guide": ("duplicate_content", f"same bytes as {u}/guide")
        }
        points = stored(cfg)
        assert {(p["file_path"], p["source_url"], p["final_url"]) for p in points.values()} == {
            (f"{u}/guide", f"{u}/guide", f"{u}/guide")
        }
        assert _texts(points) == {
            f"{u}/guide": [
                "# Install Guide\n\n## Requirements\n\nPython 3.11 or newer is needed to run the "
                "widget installer on Linux.",
                "## Steps\n\nRun pip install widget, then widget init inside the project folder.",
            ]
        }


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("Content-Type", "text/html"), ("Content-Type", "text/html; charset=utf-8")],
         ("text/html", "utf-8")),
        ([("Content-Type", "text/html, text/html; charset=utf-8")], ("text/html", "utf-8")),
        ([("Content-Type", "text/html; charset=iso-8859-1, text/html")],
         ("text/html", "iso-8859-1")),  # the same type again keeps its charset
        ([("Content-Type", "text/plain; charset=utf-8, text/html")], ("text/html", None)),
        ([("Content-Type", "text/html, */*")], ("text/html", None)),
        ([("Content-Type", "html")], ("", None)),
        ([("Content-Type", "pdf")], ("", None)),
        ([("Content-Type", "TEXT/HTML; Charset=UTF-8")], ("text/html", "UTF-8")),
        ([], ("", None)),
    ],
)  # fmt: skip
def test_the_content_type_is_the_last_valid_one(
    headers: list[tuple[str, str]], expected: tuple[str, str | None]
) -> None:
    """The email parser read a doubled or invalid Content-Type as text/plain (its default):
    an HTML page was indexed as its markup, a PDF served as 'pdf' as its raw bytes."""
    import httpx

    from ragpipe.web.pages import _content_type

    assert _content_type(httpx.Headers(headers)) == expected


FRENCH = (
    "Le café est très apprécié à Paris; les élèves préfèrent la crème brûlée après le "
    "dîner. Señor Muñoz habló con el niño."
)


def test_a_page_that_declares_no_charset_is_read_as_browsers_read_it(tmp_path: Path) -> None:
    """Not UTF-8 and no charset: statistics guessed windows-1250 for a French Latin-1 text
    ("trčs apprécié ŕ Paris"), in silence. Now windows-1252, the web's default for an
    undeclared page; bytes it has no character for are a failure row (encoding)."""
    routes = {
        "/fr.txt": Route(FRENCH.encode("latin-1"), "text/plain"),
        "/fr.html": Route(
            f"<html><body><h1>Café</h1><p>{FRENCH}</p></body></html>".encode("latin-1"),
            "text/html",
        ),
        "/quotes.txt": Route("“Quoted” prices: €5 – or less.".encode("cp1252"), "text/plain"),
        "/bom.txt": Route("\ufeffUTF-8 with its mark: é".encode(), "text/plain"),
        "/meta.html": Route(
            '<html><head><meta charset="iso-8859-2"></head><body><p>Łódź i Kraków.</p></body>'
            "</html>".encode("iso-8859-2"),
            "text/html",
        ),  # no HTTP charset: its own declaration
        "/bad.txt": Route(b"caf\xe9 \x81 bytes", "text/plain"),
    }
    with web_site(routes) as site:
        u = site.url
        cfg = _pages_config(tmp_path, [f"{u}{path}" for path in routes])
        summary = run_ingest(cfg)
        assert (summary.seen, summary.added, summary.failed) == (5, 5, 1)
        assert _failure_messages(cfg) == {
            f"{u}/bad.txt": "the text is not in UTF-8, and byte 0x81 at 5 is no character of "
            "windows-1252, what a page that declares no charset is read as (as browsers do): "
            "its server should declare the charset it is written in (Content-Type: ...; "
            "charset=...)"
        }
        assert _failures(cfg) == {f"{u}/bad.txt": "encoding"}
        assert _texts(stored(cfg)) == {
            f"{u}/bom.txt": ["UTF-8 with its mark: é"],
            f"{u}/fr.html": [f"# Café\n\n{FRENCH}"],
            f"{u}/fr.txt": [FRENCH],
            f"{u}/meta.html": ["Łódź i Kraków."],
            f"{u}/quotes.txt": ["“Quoted” prices: €5 – or less."],
        }


def _failure_messages(cfg: RagpipeConfig) -> dict[str, str]:
    rows = checkpoint.read_records(cfg.paths.work_dir / "failures.parquet", Failure)
    return {f.file_path: f.message for f in rows}


def test_an_octet_stream_is_sniffed_and_a_page_turned_image_is_removed(tmp_path: Path) -> None:
    """application/octet-stream was never sniffed: an HTML page or a PDF a server sent so
    was skipped (unsupported_content_type), and a page indexed before was removed."""
    pdf = shared_pdf("multi_page.pdf").read_bytes()
    with web_site({"/guide": Route(GUIDE), "/other": Route(GERMAN)}) as site:
        u = site.url
        cfg = _pages_config(tmp_path, [f"{u}/guide", f"{u}/other"])
        first = run_ingest(cfg)
        assert (first.added, first.failed) == (2, 0)
        before = _texts(stored(cfg))

        site.routes["/guide"] = Route(GUIDE, "application/octet-stream")
        second = run_ingest(cfg)
        assert (second.skipped_unchanged, second.removed) == (2, 0)
        assert _skips(cfg) == {} and _texts(stored(cfg)) == before

        # A page that is now an image (a type not ingested) is a skip row, and it leaves
        # the index, as a page robots.txt now disallows does (under index.max_delete_share).
        site.routes["/guide"] = Route(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "image/png")
        third = run_ingest(cfg)
        assert third.removed == 1
        assert _skip_details(cfg) == {
            f"{u}/guide": (
                "unsupported_content_type",
                "image/png: only HTML, text and PDF are ingested",
            )
        }
        assert sorted(_texts(stored(cfg))) == [f"{u}/other"]

        from ragpipe.web.pages import fetch_pages

        site.routes["/manual"] = Route(pdf, "binary/octet-stream")  # S3's "no type"
        site.routes["/blob"] = Route(b"\x00\x01 no known start", "application/octet-stream")
        fetched = fetch_pages(
            FetchConfig(), [f"{u}/manual", f"{u}/blob"], [], tmp_path / "bodies", []
        )
        assert [(p.url, p.kind, p.content_type) for p in fetched.pages] == [
            (f"{u}/manual", "pdf", "application/pdf")
        ]
        assert [(s.file_path, s.reason, s.detail) for s in fetched.skipped] == [
            (
                f"{u}/blob",
                "unsupported_content_type",
                "application/octet-stream: only HTML, text and PDF are ingested",
            )
        ]
