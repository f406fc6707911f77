"""HTTP for web sources: GETs under the fetch policy (robots.txt, per-host spacing,
timeouts, size and redirect caps), and the URL normal form pages are known by.

* Every request carries ``fetch.user_agent``; robots.txt (RFC 9309, see
  :mod:`ragpipe.web.robots`) is read once per origin and obeyed, for the page and
  every redirect hop.
* ``fetch.timeout_s`` bounds a whole request (connect, headers, body) by the wall
  clock: a watchdog closes the connection at the deadline, so a server that drips
  its headers a byte a second is cut off too (httpx's own timeouts restart on every
  byte). ``fetch.max_bytes`` bounds the body after decompression, which ragpipe
  does itself in bounded steps: gzip and deflate only, one coding; a 16 KB bomb
  never becomes 512 MiB in memory.
  ``fetch.max_redirects`` the hops. Requests to one host are spaced by
  ``fetch.delay_s`` or the robots.txt Crawl-delay.
* Only http and https; a redirect elsewhere is a failure.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpcore
import httpx

from ragpipe.config import FetchConfig, url_problem
from ragpipe.web.robots import RobotsRules, product_token

logger = logging.getLogger(__name__)

ROBOTS_MAX_BYTES = 512 * 1024  # RFC 9309: parse at least 500 KiB
ROBOTS_MIN_REDIRECTS = 5  # RFC 9309: follow at least five, whatever fetch.max_redirects says
_REDIRECTS = {301, 302, 303, 307, 308}
# What makes a robots.txt unavailable (as a 4xx), not unreachable (as a 5xx).
_ROBOTS_UNAVAILABLE = {"too_many_redirects", "bad_redirect"}


class FetchError(Exception):
    """One URL could not be fetched; ``category`` says why (a failure row)."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


class Disallowed(Exception):
    """robots.txt forbids the URL (the page or a redirect hop)."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(detail)
        self.url = url


@dataclass
class Response:
    """The final response of one fetch, after redirects."""

    url: str
    status: int
    headers: httpx.Headers
    body: bytes


def normalise_url(url: str) -> str:
    """Drop the fragment and default ports; lower-case scheme and host."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    netloc = (
        host
        if port is None or (scheme, port) in (("http", 80), ("https", 443))
        else (f"{host}:{port}")
    )
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


class _WatchedBackend(httpcore.SyncBackend):
    """httpcore's socket backend, remembering the sockets it opens so that a watchdog can
    shut them at a request's deadline (a blocked read then fails at once)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        stream = super().connect_tcp(*args, **kwargs)
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets = [s for s in self._sockets if s.fileno() != -1] + [sock]
        return stream

    def shut_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One thread per fetcher that calls ``expire`` when an armed deadline passes (a thread
    per request cost a 304 re-fetch 40 % more than a raw GET)."""

    def __init__(self, expire: Callable[[], None]) -> None:
        self._expire = expire
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._fired = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="ragpipe-fetch-deadline", daemon=True
                )
                self._thread.start()
            self._deadline, self._fired = time.monotonic() + seconds, False
            self._cond.notify()

    def disarm(self) -> bool:
        """Stop watching; whether the deadline fired."""
        with self._cond:
            self._deadline = None
            self._cond.notify()
            return self._fired

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (
                    self._deadline is None or self._deadline > time.monotonic()
                ):
                    wait = None if self._deadline is None else self._deadline - time.monotonic()
                    self._cond.wait(wait)
                if self._closed:
                    return
                self._deadline, self._fired = None, True
            self._expire()


def _zlib_or_gzip(head: bytes) -> bool:
    """Whether ``head`` opens a gzip stream or a zlib one (method 8, header check)."""
    return head[:2] == b"\x1f\x8b" or (head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0)


class _Decoder:
    """Content-Encoding undone in steps that never produce more than the room left."""

    def __init__(self, encoding: str) -> None:
        codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise FetchError(
                "unsupported_encoding",
                f"Content-Encoding {encoding!r}: only gzip or deflate, once, were asked for",
            )
        wbits = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS}.get(
            codings[0] if codings else "", 32 + zlib.MAX_WBITS
        )
        self._zlib = zlib.decompressobj(wbits) if codings else None
        self._deflate = codings == ["deflate"]
        self._wbits = wbits
        self._fed = False
        self._pending = b""  # a first chunk too short to tell zlib from raw deflate
        self._over = False  # the stream ended; what follows is no member: never fed
        self._carry = b""  # a next member's first byte, its second in the next chunk

    def feed(self, data: bytes, room: int) -> bytes:
        """``data`` decoded, stopping once the output is larger than ``room``: memory stays
        bounded by the cap, whatever the compression ratio."""
        if self._zlib is None:
            return data
        if self._over:
            return b""
        if not self._fed and self._deflate:
            data, self._pending = self._pending + data, b""
            if len(data) < 2:
                self._pending = data
                return b""
            if not _zlib_or_gzip(data):
                # "deflate" sent raw, without its zlib header, as some servers do (browsers
                # read it too)
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
        self._fed = True
        data, self._carry = self._carry + data, b""
        out = bytearray()
        try:
            while len(out) <= room:  # so the limit is never 0 (zlib: "no limit") or less
                if self._zlib.eof:
                    data = self._zlib.unused_data + data
                    if data == b"\x1f":  # split between two chunks: wait for the next
                        self._carry = data
                        self._zlib = zlib.decompressobj(self._wbits)
                        break
                    if data[:2] != b"\x1f\x8b":
                        # bytes after the stream's end: ignored, as browsers do, and never
                        # fed again (zlib kept them all, a copy each time)
                        self._over = bool(data) or self._over
                        break
                    # another gzip member follows (RFC 1952): read it too, not only the first
                    self._zlib = zlib.decompressobj(self._wbits)
                if not data:
                    break
                out += self._zlib.decompress(data, room + 1 - len(out))
                data = self._zlib.unconsumed_tail
            return bytes(out)
        except (zlib.error, ValueError) as exc:
            raise FetchError("corrupt", f"undecodable response body: {exc}") from exc

    def finish(self) -> None:
        """Raises ``corrupt`` when the compressed stream stopped before its end: a body
        cut short (a dropped connection with no length to miss) is not a whole page."""
        if self._carry:  # one byte after the stream's end and nothing more: ignored
            return
        if self._zlib is not None and (self._pending or (self._fed and not self._zlib.eof)):
            raise FetchError(
                "corrupt", "the compressed response body ended before its end (cut short)"
            )


def site_host(url: str) -> str:
    """The host a URL is on, lower case, without a leading ``www.``."""
    return (urlsplit(url).hostname or "").lower().removeprefix("www.")


def same_site(a: str, b: str) -> bool:
    return site_host(a) == site_host(b)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class Fetcher:
    """HTTP GETs under the fetch policy: robots.txt, per-host spacing, caps.

    Args:
        config: Fetch settings.
        clock, sleep: Injected for tests of the per-host spacing.
    """

    def __init__(
        self,
        config: FetchConfig,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        listed_hosts: Collection[str] = (),
    ) -> None:
        self.config = config
        # Hosts the team named itself (discover.urls, discover.sitemaps): reachable even on a
        # private address, which a page, sitemap or redirect cannot make any other host.
        self.listed_hosts = {h.lower() for h in listed_hosts}
        self._clock = clock
        self._sleep = sleep
        transport = httpx.HTTPTransport()
        self._backend = _WatchedBackend()
        transport._pool._network_backend = self._backend  # httpx offers no other hook
        self._client = httpx.Client(
            headers={"User-Agent": config.user_agent, "Accept-Encoding": "gzip, deflate"},
            timeout=httpx.Timeout(config.timeout_s),
            follow_redirects=False,
            transport=transport,
        )
        self._watchdog = _Watchdog(self._backend.shut_all)
        self._robots: dict[str, RobotsRules | FetchError] = {}
        self._last_request: dict[str, float] = {}
        self.requests = 0

    def close(self) -> None:
        self._watchdog.close()
        self._client.close()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- robots.txt ------------------------------------------------------------------

    def robots(self, url: str) -> RobotsRules:
        """The robots.txt rules of ``url``'s origin (fetched once per run).

        Raises:
            FetchError: ``robots_unreachable`` when robots.txt answers 5xx or
                not at all: RFC 9309 then forbids crawling the origin, so its
                pages are not fetched (and not removed) this run.
        """
        origin = _origin(url)
        if origin not in self._robots:
            self._robots[origin] = self._load_robots(origin)
        rules = self._robots[origin]
        if isinstance(rules, FetchError):
            raise FetchError(rules.category, str(rules))
        return rules

    def _load_robots(self, origin: str) -> RobotsRules | FetchError:
        robots_url = f"{origin}/robots.txt"
        try:
            response = self._follow(robots_url, {}, check_robots=False,
                                    cap=ROBOTS_MAX_BYTES + 1, robots=True)  # fmt: skip
        except FetchError as exc:
            if exc.category in _ROBOTS_UNAVAILABLE:
                # RFC 9309 2.3.1.2: past five redirects a crawler may take robots.txt as
                # unavailable, which is as a 4xx: no rule applies
                logger.warning("%s: %s; read as no robots.txt", robots_url, exc)
                return RobotsRules.allow_all()
            return FetchError(
                "robots_unreachable",
                f"{robots_url} could not be read ({exc}); RFC 9309 forbids crawling the site "
                "until it can, so its pages are kept as indexed and retried next run",
            )
        if response.status >= 500:
            return FetchError(
                "robots_unreachable",
                f"{robots_url} answered HTTP {response.status}; RFC 9309 forbids crawling the "
                "site until it can be read, so its pages are kept as indexed and retried next run",
            )
        if response.status != 200:  # 4xx (no robots.txt): nothing is disallowed
            return RobotsRules.allow_all()
        body = response.body
        if len(body) > ROBOTS_MAX_BYTES:  # read this far (RFC 9309): its last line is cut
            body = body[:ROBOTS_MAX_BYTES]
            body = body[: max(body.rfind(b"\n"), body.rfind(b"\r")) + 1]
        text = body.decode("utf-8-sig", errors="replace")  # a BOM hid the first group
        return RobotsRules.parse(text, self.config.user_agent)

    def _check_robots(self, url: str) -> None:
        rules = self.robots(url)
        if not rules.allowed(url):
            rule = rules.rule_for(url)
            pattern = f" (rule 'Disallow: {rule.pattern}')" if rule is not None else ""
            raise Disallowed(
                url,
                f"{_origin(url)}/robots.txt disallows {url} for "
                f"'{product_token(self.config.user_agent)}'{pattern}",
            )

    def _refuse_private(self, url: str) -> None:
        """``private_address`` for a host that resolves to a non-public address, unless the
        team listed that host (resolution and connection are separate lookups: a host that
        answers differently the second time is not caught here)."""
        if not self.config.deny_private_networks:
            return
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if host in self.listed_hosts:
            return
        try:
            infos = socket.getaddrinfo(host, parts.port or 443, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):  # UnicodeError: no DNS name (url_problem says so)
            return  # unresolvable: the request itself fails as unreachable
        for *_, address in infos:
            ip = ipaddress.ip_address(str(address[0]).split("%")[0])
            if not ip.is_global:
                raise FetchError(
                    "private_address",
                    f"{host} resolves to {ip}, a non-public address; fetch.deny_private_networks "
                    "refuses it for hosts not named in discover.urls or discover.sitemaps",
                )

    def _wait_turn(self, url: str) -> None:
        host = urlsplit(url).netloc
        delay = self.config.delay_s
        cached = self._robots.get(_origin(url))
        if isinstance(cached, RobotsRules) and cached.crawl_delay is not None:
            delay = max(delay, min(cached.crawl_delay, self.config.max_delay_s))
        last = self._last_request.get(host)
        if last is not None and delay > 0:
            wait = last + delay - self._clock()
            if wait > 0:
                self._sleep(wait)
        self._last_request[host] = self._clock()

    # -- requests --------------------------------------------------------------------

    def get(self, url: str, headers: dict[str, str] | None = None) -> Response:
        """GET ``url`` following redirects; every hop is checked against robots.txt.

        Raises:
            Disallowed: robots.txt forbids the URL or a redirect target.
            FetchError: timeout, unreachable, too large, too many or bad redirects,
                or robots.txt unreachable.
        """
        return self._follow(url, headers or {}, check_robots=True, cap=self.config.max_bytes)

    def _follow(
        self, url: str, headers: dict[str, str], check_robots: bool, cap: int, robots: bool = False
    ) -> Response:
        """GET ``url`` and its redirects. ``robots``: the fetch of a robots.txt, which
        follows redirects to any host (RFC 9309) and reads up to ``cap`` bytes of a longer
        file instead of refusing it."""
        current = url
        hops = max(self.config.max_redirects, ROBOTS_MIN_REDIRECTS if robots else 0)
        for _ in range(hops + 1):
            problem = url_problem(current)
            if problem:
                raise FetchError("bad_redirect", f"redirected to {current!r}, which {problem}")
            self._refuse_private(current)  # before its robots.txt is asked for, too
            if check_robots:
                self._check_robots(current)
            status, response_headers, body = self._request(current, headers, cap, robots)
            if status in _REDIRECTS and "location" in response_headers:
                target = urljoin(current, response_headers["location"])
                problem = url_problem(target)  # a bad port would break normalise_url
                if problem:
                    raise FetchError("bad_redirect", f"redirected to {target!r}, which {problem}")
                cross = not same_site(current, target)
                if cross and not (robots or self.config.cross_host_redirects):
                    raise FetchError(
                        "cross_host_redirect",
                        f"redirected from {urlsplit(current).hostname} to {target}; "
                        "fetch.cross_host_redirects is off (list the target itself, or turn it "
                        "on for sites you trust)",
                    )
                current = normalise_url(target)
                continue
            return Response(current, status, response_headers, body)
        raise FetchError(
            "too_many_redirects",
            f"more than fetch.max_redirects={self.config.max_redirects} redirects (last: "
            f"{current})",
        )

    def _request(
        self, url: str, headers: dict[str, str], cap: int, truncate: bool = False
    ) -> tuple[int, httpx.Headers, bytes]:
        """One GET. Past ``cap`` bytes: ``too_large``, or with ``truncate`` the first
        ``cap`` bytes (a robots.txt, of which RFC 9309 asks for at least 500 KiB)."""
        self._refuse_private(url)
        self._wait_turn(url)
        self.requests += 1
        timeout = self.config.timeout_s
        deadline = self._clock() + timeout
        headers_in = False
        self._watchdog.arm(timeout)
        try:
            with self._client.stream("GET", url, headers=headers) as response:
                headers_in = True
                length = response.headers.get("content-length", "")
                if (
                    length.isdigit()
                    and int(length) > cap
                    and response.status_code == 200
                    and not truncate
                ):
                    raise FetchError(
                        "too_large",
                        f"Content-Length {length} bytes exceeds fetch.max_bytes={cap}",
                    )
                body = bytearray()
                if response.status_code not in _REDIRECTS:
                    decoder = _Decoder(response.headers.get("content-encoding", ""))
                    for raw in response.iter_raw():
                        body += decoder.feed(raw, cap - len(body))
                        if len(body) > cap and truncate:
                            del body[cap:]
                            break
                        if len(body) > cap:
                            raise FetchError(
                                "too_large",
                                f"body exceeds fetch.max_bytes={cap} bytes (after "
                                "decompression); stopped reading",
                            )
                        if self._clock() > deadline:
                            raise FetchError(
                                "timeout",
                                f"body not complete within fetch.timeout_s={timeout:g}s",
                            )
                    else:
                        decoder.finish()
                return response.status_code, response.headers, bytes(body)
        except (httpx.TransportError, httpx.StreamError) as exc:
            if self._watchdog.disarm():
                what = "body not complete" if headers_in else "no response"
                raise FetchError(
                    "timeout",
                    f"{what} within fetch.timeout_s={timeout:g}s (the connection was closed at "
                    "the deadline)",
                ) from exc
            if isinstance(exc, httpx.TimeoutException):
                raise FetchError(
                    "timeout",
                    f"no response within fetch.timeout_s={timeout:g}s ({type(exc).__name__})",
                ) from exc
            raise FetchError("unreachable", f"{type(exc).__name__}: {exc}") from exc
        except (httpx.InvalidURL, UnicodeError) as exc:  # a host the IDNA codec refuses
            raise FetchError("unreachable", f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._watchdog.disarm()
