"""The metrics GET (collectors/http_get.py) against servers that answer the
ways metrics servers do: Go's chunked answers (dcgm-exporter), HTTP/1.0
answers that end at the close (prometheus_client's own server), kept-alive
connections the server drops, and answers that are not what they claim."""
import socket
import threading

import pytest

from gpuscope.collectors.http_get import KeptAliveGet


class RawServer:
    """A server on 127.0.0.1 that answers each request on a connection with
    the next of `answers` (raw bytes); a None after an answer closes the
    connection once it is sent."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.connections = 0
        self.requests: list[bytes] = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn):
        with conn:
            while self.answers:
                req = b""
                while b"\r\n\r\n" not in req:
                    part = conn.recv(4096)
                    if not part:
                        return
                    req += part
                self.requests.append(req)
                conn.sendall(self.answers.pop(0))
                if self.answers and self.answers[0] is None:
                    self.answers.pop(0)
                    return

    def close(self):
        self._listener.close()


def chunked(body: bytes, size: int = 4096, trailer: bytes = b"") -> bytes:
    parts = [b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"".join(parts) + b"0\r\n" + trailer + b"\r\n")


BODY = b"".join(b'DCGM_FI_DEV_GPU_UTIL{gpu="%d"} %d\n' % (i % 8, i) for i in range(3000))


def test_go_style_chunked_answers_on_one_kept_alive_connection():
    srv = RawServer([chunked(BODY), chunked(BODY, 1000, trailer=b"X-Trailer: 1\r\n"), chunked(b"")])
    get = KeptAliveGet(srv.url, 2.0, 1 << 20)
    try:
        assert get.get("/metrics") == BODY.decode()
        assert get.get("/metrics") == BODY.decode()
        assert get.get("/metrics") == ""
        assert srv.connections == 1
        assert srv.requests[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
    finally:
        get.close()
        srv.close()


def test_an_http_1_0_answer_ends_at_the_close_and_the_next_get_connects_again():
    srv = RawServer([b"HTTP/1.0 200 OK\r\n\r\n" + BODY, None])
    get = KeptAliveGet(srv.url, 2.0, 1 << 20)
    try:
        assert get.get("/metrics") == BODY.decode()
        srv.answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"]
        assert get.get("/metrics") == "abc" and srv.connections == 2
    finally:
        get.close()
        srv.close()


def test_a_kept_alive_connection_the_server_dropped_is_asked_again_once():
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    srv = RawServer([ok, None, ok])              # the second request finds the first connection closed
    get = KeptAliveGet(srv.url, 2.0, 1 << 20)
    try:
        assert get.get("/metrics") == "ok"
        assert get.get("/metrics") == "ok" and srv.connections == 2
    finally:
        get.close()
        srv.close()


@pytest.mark.parametrize("answer,words", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "the answer ended 95 bytes short"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", "more than 1 MiB"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size b'zz' is not a number"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc", "in the middle of a chunked answer"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP answer ('SSH-2.0-OpenSSH_9.6')"),
    (b"HTTP/1.1 301 Moved\r\nLocation: /login\r\nContent-Length: 0\r\n\r\n", "answered HTTP 301 (to /login)"),
    (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "answered HTTP 404 (try /metrics)"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000, "headers past 64 KiB"),
])
def test_what_is_not_a_whole_answer_is_an_error_naming_the_url(answer, words):
    srv = RawServer([answer, None])
    get = KeptAliveGet(srv.url, 2.0, 1 << 20, {404: " (try /metrics)"})
    try:
        with pytest.raises(OSError) as e:
            get.get("/x")
        assert str(e.value).startswith(srv.url + "/x") and words in str(e.value), str(e.value)
    finally:
        get.close()
        srv.close()
