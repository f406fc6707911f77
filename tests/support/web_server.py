"""A loopback web site for the URL-source tests: pages, robots.txt, redirects,
conditional requests, slow and oversize responses.

``web_site()`` yields a :class:`Site`; tests edit ``site.routes`` between runs
(a page changes, disappears, becomes disallowed) and read ``site.requests``
(path, headers) to see what the fetcher asked for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.support.loopback import serve


@dataclass
class Route:
    """What one path answers."""

    body: bytes = b""
    content_type: str | None = "text/html; charset=utf-8"
    status: int = 200
    etag: str | None = None
    last_modified: str | None = None
    location: str | None = None  # a redirect target (status 301/302/...)
    delay_s: float = 0.0  # before the status line
    drip_s: float = 0.0  # between body chunks of 64 bytes
    send_length: bool = True  # False: a body delimited by closing the connection
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Site:
    """The running site."""

    url: str
    routes: dict[str, Route]
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def hits(self, path: str) -> list[dict[str, str]]:
        """Headers of every request for ``path``."""
        return [h for p, h in self.requests if p == path]


def html_page(title: str, *sections: tuple[str, str], lang: str = "en") -> bytes:
    """A small HTML page: a title, a nav bar, then (heading, paragraph) sections."""
    body = "".join(f"<h2>{h}</h2>\n<p>{p}</p>\n" for h, p in sections)
    return (
        f'<!doctype html>\n<html lang="{lang}"><head><meta charset="utf-8">'
        f"<title>{title}</title></head>\n<body><nav><a href='/'>Home</a></nav>\n"
        f"<h1>{title}</h1>\n{body}</body></html>\n"
    ).encode()


class _Handler(BaseHTTPRequestHandler):
    site: Site

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        site = self.site
        site.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        route = site.routes.get(self.path)
        if route is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if route.delay_s:
            time.sleep(route.delay_s)
        if route.status == 200 and (
            (route.etag and self.headers.get("If-None-Match") == route.etag)
            or (
                route.last_modified and self.headers.get("If-Modified-Since") == route.last_modified
            )
        ):
            self.send_response(304)
            self.end_headers()
            return
        self.send_response(route.status)
        if route.content_type:
            self.send_header("Content-Type", route.content_type)
        if route.etag:
            self.send_header("ETag", route.etag)
        if route.last_modified:
            self.send_header("Last-Modified", route.last_modified)
        if route.location:
            self.send_header("Location", route.location)
        for key, value in route.headers.items():
            self.send_header(key, value)
        if route.send_length:
            self.send_header("Content-Length", str(len(route.body)))
        self.end_headers()
        try:
            if route.drip_s:
                for start in range(0, len(route.body), 64):
                    self.wfile.write(route.body[start : start + 64])
                    self.wfile.flush()
                    time.sleep(route.drip_s)
            else:
                self.wfile.write(route.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout, size cap): expected


@contextmanager
def web_site(routes: dict[str, Route] | None = None) -> Iterator[Site]:
    """Serve ``routes`` on 127.0.0.1 (a free port) for the duration of the block."""
    site = Site("", dict(routes or {}))
    with serve(type("Handler", (_Handler,), {"site": site})) as site.url:
        yield site
