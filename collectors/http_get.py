"""A metrics page, fetched: one GET over a kept-alive HTTP/1.1 connection,
within one deadline and a size cap. What the scrapers of serving engines
(serving_metrics.py) and of dcgm-exporter (dcgm_exporter.py) share.

Kept alive because a scrape runs every tick: a fresh connection costs the
agent a TCP handshake and the server a new handler each time. One deadline
for the whole answer, not a timeout per read, because a server that
trickles a byte a second never trips a per-read timeout. Every error is an
OSError whose message starts with the URL asked.

The GET is written here on a socket rather than with http.client: a GET of
dcgm-exporter's 80 KB page cost the agent ~150 us of CPU through
http.client (its request building and its email-parser headers) and ~65 us
so, on the same loopback server (docs/benchmarks.md, "dcgm-exporter
source"); at 8 GPUs a tick that is 10 us of every GPU-sample. What a
metrics server answers is a small part of HTTP/1.1: a status line, headers,
a body of Content-Length bytes, chunked (Go's net/http, dcgm-exporter), or
up to the connection's close (HTTP/1.0 servers, prometheus_client's own).
"""
from __future__ import annotations

import socket
import ssl
import time
import urllib.parse

MAX_HEAD = 64 << 10                  # status line and headers; a metrics server's are a few hundred bytes
_RECV = 256 << 10


class _Closed(Exception):
    """The server closed the connection before a byte of the answer."""


class KeptAliveGet:
    def __init__(self, base_url: str, timeout_s: float, max_bytes: int,
                 status_hints: dict[int, str] | None = None) -> None:
        """base_url: scheme, host, port and an optional path that every GET's
        path is put after. status_hints: words added to the error of an HTTP
        status, e.g. what a 404 usually means for this kind of server."""
        self.base_url = base_url.rstrip("/")
        u = urllib.parse.urlsplit(base_url)
        self._tls = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._tls else 80)
        self._prefix = u.path.rstrip("/")
        self._host_header = u.netloc.rpartition("@")[2]
        self.timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._hints = status_hints or {}
        self._sock: socket.socket | None = None
        self._requests: dict[str, bytes] = {}

    def get(self, path: str) -> str:
        """The answer's text (UTF-8, undecodable bytes replaced). Raises
        OSError: unreachable, an HTTP status other than 200, too slow, too
        large, cut short."""
        url = self.base_url + path
        deadline = time.monotonic() + self.timeout_s
        request = self._requests.get(path) or self._request(path)
        for attempt in (0, 1):            # a kept-alive connection the server closed: once more, fresh
            reused = self._sock is not None
            try:
                sock = self._sock or self._connect(deadline)
                sock.settimeout(_left(deadline))
                sock.sendall(request)
                status, headers, body = self._answer(sock, url, deadline)
            except (_Closed, BrokenPipeError, ConnectionResetError):
                self.close()
                if reused and not attempt:
                    continue
                raise OSError(f"{url}: the server closed the connection") from None
            except TimeoutError:
                self.close()
                raise OSError(f"{url}: no whole answer within {self.timeout_s:g} s") from None
            except OSError as exc:
                self.close()
                raise OSError(str(exc) if str(exc).startswith(url) else f"{url}: {exc}") from None
            if status != 200:
                self.close()
                hint = (self._hints.get(status, "")
                        or (f" (to {headers.get('location')})" if 300 <= status < 400 else ""))
                raise OSError(f"{url} answered HTTP {status}{hint}")
            return body.decode("utf-8", "replace")
        raise OSError(f"{url}: connection closed")

    def _request(self, path: str) -> bytes:
        req = (f"GET {self._prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\nAccept: text/plain\r\n"
               "Accept-Encoding: identity\r\nUser-Agent: gpuscope\r\n\r\n").encode("ascii")
        self._requests[path] = req
        return req

    def _connect(self, deadline: float) -> socket.socket:
        sock = socket.create_connection((self._host, self._port), timeout=_left(deadline))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # a request is one small write
        if self._tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self._host)
        self._sock = sock
        return sock

    def _answer(self, sock: socket.socket, url: str, deadline: float) -> tuple[int, dict[str, str], bytes]:
        buf = bytearray()
        end = -1
        while end < 0:
            chunk = _recv(sock, deadline)
            if not chunk:
                if not buf:
                    raise _Closed
                raise OSError(f"{url}: the server closed the connection in the middle of its headers")
            buf += chunk
            end = buf.find(b"\r\n\r\n")
            if end < 0 and len(buf) > MAX_HEAD:
                raise OSError(f"{url}: headers past {MAX_HEAD >> 10} KiB: not a metrics server")
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        del buf[:end + 4]
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/") or not code.isdigit():
            raise OSError(f"{url}: not an HTTP answer ({lines[0][:60]!r})")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if code[0] == "1" or code in ("204", "304"):
            body = b""                    # no body, whatever the headers say (RFC 9112, 6.3)
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._chunked(sock, buf, url, deadline)
        elif "content-length" in headers:
            body = self._sized(sock, buf, headers["content-length"], url, deadline)
        else:
            body, keep = self._to_close(sock, buf, url, deadline), False
        if not keep:
            self.close()
        return int(code), headers, body

    def _sized(self, sock, buf: bytearray, length: str, url: str, deadline: float) -> bytes:
        try:
            n = int(length)
        except ValueError:
            raise OSError(f"{url}: Content-Length {length[:20]!r} is not a number") from None
        if n > self._max_bytes:
            raise OSError(f"{url}: more than {self._max_bytes >> 20} MiB")
        while len(buf) < n:
            chunk = _recv(sock, deadline)
            if not chunk:
                raise OSError(f"{url}: the answer ended {n - len(buf)} bytes short")
            buf += chunk
        if len(buf) > n:                  # more than it said: the next answer could not be told from it
            self.close()
        return bytes(buf[:n])

    def _to_close(self, sock, buf: bytearray, url: str, deadline: float) -> bytes:
        while True:
            chunk = _recv(sock, deadline)
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > self._max_bytes:
                raise OSError(f"{url}: more than {self._max_bytes >> 20} MiB")

    def _chunked(self, sock, buf: bytearray, url: str, deadline: float) -> bytes:
        out = bytearray()
        pos = 0

        def line() -> bytes:
            nonlocal pos
            nl = buf.find(b"\r\n", pos)
            while nl < 0:
                if len(buf) - pos > MAX_HEAD:
                    raise OSError(f"{url}: a chunk's size line past {MAX_HEAD >> 10} KiB")
                _more(sock, buf, url, deadline)
                nl = buf.find(b"\r\n", pos)
            text, pos = bytes(buf[pos:nl]), nl + 2
            return text
        while True:
            size_text = line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise OSError(f"{url}: chunk size {size_text[:20]!r} is not a number") from None
            if size == 0:
                while line():             # trailers, up to the empty line
                    pass
                if pos < len(buf):
                    self.close()
                return bytes(out)
            if len(out) + size > self._max_bytes:
                raise OSError(f"{url}: more than {self._max_bytes >> 20} MiB")
            while len(buf) < pos + size + 2:
                _more(sock, buf, url, deadline)
            out += buf[pos:pos + size]
            pos += size + 2
            if pos > _RECV:               # what was read already is not kept twice
                del buf[:pos]
                pos = 0

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _recv(sock: socket.socket, deadline: float) -> bytes:
    sock.settimeout(_left(deadline))
    return sock.recv(_RECV)


def _more(sock, buf: bytearray, url: str, deadline: float) -> None:
    chunk = _recv(sock, deadline)
    if not chunk:
        raise OSError(f"{url}: the server closed the connection in the middle of a chunked answer")
    buf += chunk
