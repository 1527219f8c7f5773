"""The proxy's HTTP server on loopback: idle keep-alive connections outlive the clients' own."""

from __future__ import annotations

import socket
import time

from gyre_proxy.api import KEEP_ALIVE_S, build_app, proxy_server
from gyre_proxy.chat.testing import FakeAnswerer, StaticKeys, text_reply

REQUEST = b"GET /health HTTP/1.1\r\nhost: proxy\r\nconnection: keep-alive\r\n\r\n"


def exchange(sock: socket.socket) -> bytes:
    sock.sendall(REQUEST)
    data = b""
    while not data.endswith(b'{"status":"ok"}'):
        chunk = sock.recv(4096)
        if not chunk:
            return data  # closed by the server
        data += chunk
    return data


def test_an_idle_connection_is_kept_longer_than_clients_keep_theirs() -> None:
    # httpx (the Anthropic and OpenAI SDKs) drops idle connections after 5 s; a server that
    # closes at the same moment loses requests sent in between.
    assert KEEP_ALIVE_S > 5
    app = build_app(FakeAnswerer([text_reply("hi")]), StaticKeys(), model_name="m")
    with (
        proxy_server(app) as server,
        socket.create_connection((server.host, server.port), timeout=10) as sock,
    ):
        assert exchange(sock).startswith(b"HTTP/1.1 200")
        time.sleep(5.5)  # past uvicorn's default keep-alive of 5 s
        assert exchange(sock).startswith(b"HTTP/1.1 200")
