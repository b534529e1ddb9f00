"""The Prometheus endpoint's HTTP server, bounded by a peer: whoever reaches `--metrics` (it has no
keys: Prometheus scrapes it) holds at most MAX_CONNECTIONS threads and descriptors of rank 0, each
for at most IDLE_TIMEOUT_S of silence. prometheus_client's own server starts a thread per connection
and waits on it for ever, so idle connections held rank 0's threads and files without limit."""

from __future__ import annotations

import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from ringtop.protocol.guard import LoopFaults

MAX_CONNECTIONS = 16
"""Connections served at once; one more is closed as soon as it is accepted (a scraper retries)."""
IDLE_TIMEOUT_S = 5.0
"""A connection that sends nothing for this long is closed (a scrape takes milliseconds)."""
BACKLOG = 64


class _QuietHandler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class BoundedWSGIServer(ThreadingWSGIServer):
    request_queue_size = BACKLOG

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0
        self.faults = LoopFaults("metrics endpoint")
        super().__init__(*args, **kwargs)

    def get_request(self):
        try:
            return super().get_request()
        except OSError as exc:  # EMFILE on accept: back off instead of spinning on the ready socket
            self.faults.record(exc)
            raise

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        pass  # a peer that hung up or went silent: nothing to report


def serve_metrics(host: str, port: int, registry: CollectorRegistry) -> tuple[BoundedWSGIServer, threading.Thread]:
    """Listen on host:port (IPv4 or IPv6) and serve `registry` from a daemon thread; raises OSError."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("MetricsServer", (BoundedWSGIServer,), {"address_family": family})
    server = make_server(host, port, make_wsgi_app(registry), server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="ringtop-metrics")
    thread.start()
    return server, thread
