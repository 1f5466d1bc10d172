"""A metrics page, fetched: one GET over a kept-alive HTTP connection,
within one deadline and a size cap. What the scrapers of serving engines
(serving_metrics.py) and of dcgm-exporter (dcgm_exporter.py) share.

Kept alive because a scrape runs every tick: a fresh connection costs the
agent a TCP handshake and the server a new handler each time. One deadline
for the whole answer, not a timeout per read, because a server that
trickles a byte a second never trips a per-read timeout. Every error is an
OSError whose message starts with the URL asked.
"""
from __future__ import annotations

import http.client
import time
import urllib.parse


class KeptAliveGet:
    def __init__(self, base_url: str, timeout_s: float, max_bytes: int,
                 status_hints: dict[int, str] | None = None) -> None:
        """base_url: scheme, host, port and an optional path that every GET's
        path is put after. status_hints: words added to the error of an HTTP
        status, e.g. what a 404 usually means for this kind of server."""
        self.base_url = base_url.rstrip("/")
        self._u = urllib.parse.urlsplit(base_url)
        self._timeout = timeout_s
        self._max_bytes = max_bytes
        self._hints = status_hints or {}
        self._conn: http.client.HTTPConnection | None = None

    def get(self, path: str) -> str:
        """The answer's text (UTF-8, undecodable bytes replaced). Raises
        OSError: unreachable, an HTTP status other than 200, too slow, too
        large, cut short."""
        url = self.base_url + path
        deadline = time.monotonic() + self._timeout
        for attempt in (0, 1):            # a kept-alive connection the server closed: once more, fresh
            conn = self._conn or self._connect()
            try:
                conn.request("GET", (self._u.path.rstrip("/") or "") + path,
                             headers={"Accept": "text/plain", "Accept-Encoding": "identity"})
                conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))     # the headers, within the deadline
                resp = conn.getresponse()
                body = self._body(resp, url, deadline)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise OSError(f"{url}: the server closed the connection") from None
                continue
            except TimeoutError:
                self.close()
                raise OSError(f"{url}: no whole answer within {self._timeout:g} s") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise OSError(str(exc) if str(exc).startswith(url) else f"{url}: {exc}") from None
            if resp.status != 200:
                self.close()
                hint = (self._hints.get(resp.status, "")
                        or (f" (to {resp.getheader('Location')})" if 300 <= resp.status < 400 else ""))
                raise OSError(f"{url} answered HTTP {resp.status}{hint}")
            return body.decode("utf-8", "replace")
        raise OSError(f"{url}: connection closed")

    def _body(self, resp, url: str, deadline: float) -> bytes:
        """The answer, read against the deadline and the size cap."""
        parts, size = [], 0
        while resp.length is None or resp.length > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(f"{url}: no whole answer within {self._timeout:g} s")
            if resp.fp is not None and resp.fp.raw is not None and hasattr(resp.fp.raw, "_sock"):
                resp.fp.raw._sock.settimeout(left)
            try:
                chunk = resp.read1(65536)
            except TimeoutError:
                raise OSError(f"{url}: no whole answer within {self._timeout:g} s") from None
            if not chunk:
                break
            size += len(chunk)
            if size > self._max_bytes:
                raise OSError(f"{url}: more than {self._max_bytes >> 20} MiB")
            parts.append(chunk)
        if resp.length not in (None, 0):
            raise OSError(f"{url}: the answer ended {resp.length} bytes short")
        resp.read()                 # marks the answer whole, so the kept-alive connection can ask again
        return b"".join(parts)

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._u.scheme == "https" else http.client.HTTPConnection
        self._conn = cls(self._u.hostname, self._u.port, timeout=self._timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
