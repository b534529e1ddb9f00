"""Where the sockets live. Everything binds to loopback unless the user says otherwise."""

from __future__ import annotations

import ipaddress
import os
import random
import socket
from urllib.parse import urlsplit

import msgspec

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PUBLISH_PORT = 5555
DEFAULT_RELAY_PORT = 5556
DEFAULT_CONTROL_PORT = 5557


class Endpoints(msgspec.Struct, frozen=True, kw_only=True):
    publish: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_PUBLISH_PORT}"
    """Rank 0's XPUB: the UI subscribes here."""
    relay: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_RELAY_PORT}"
    """Rank 0's XSUB: every rank's publisher connects here."""
    control: str = f"tcp://{DEFAULT_HOST}:{DEFAULT_CONTROL_PORT}"
    """Rank 0's ROUTER: the UI's DEALER connects here."""


class EndpointError(ValueError):
    pass


def parse_tcp(address: str) -> tuple[str, int]:
    """`tcp://HOST:PORT` -> (host, port), with a message that says what a good address looks like."""
    parts = urlsplit(address)
    try:
        port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise EndpointError(f"address {address!r} is not of the form tcp://HOST:PORT")
    return parts.hostname, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_safe(address: str, allow_remote: bool) -> None:
    """Refuse to expose the control and telemetry sockets beyond loopback by accident. (They
    authenticate whatever the address; --insecure, which turns that off, is the agent's to warn of.)"""
    host, _ = parse_tcp(address)
    if not allow_remote and not is_loopback(host):
        raise EndpointError(
            f"refusing to bind {address}: it is reachable from other machines. Keep the default 127.0.0.1 "
            "and use `ssh -L`, or pass --allow-remote (clients then need the run's connection file: "
            "`ringtop connect-info`)."
        )


def with_port(address: str, port: int) -> str:
    host, _ = parse_tcp(address)
    if ":" in host:  # IPv6 literal: keep its brackets
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


SPARE_PORTS_ENV = "RINGTOP_SPARE_PORTS"
"""LOW-HIGH: the range `spare_port_range` gives instead, for processes that pick ports side by side
(the test suite's workers each pick from a range of their own: one worker's pick, not yet bound,
is never another's)."""


def spare_port_range() -> tuple[int, int]:
    """[low, high) for ports ringtop picks itself: just below the kernel's ephemeral range, because
    outgoing connections (gloo, the rendezvous store) take ephemeral ports and would otherwise grab
    a port picked here before its owner binds it; $RINGTOP_SPARE_PORTS where it is set."""
    low_text, _, high_text = os.environ.get(SPARE_PORTS_ENV, "").partition("-")
    if low_text.isdigit() and high_text.isdigit() and 1024 <= int(low_text) < int(high_text) <= 65536:
        return int(low_text), int(high_text)
    low, _ = ephemeral_range()
    return max(1024, low - 12000), low


def free_tcp_port(host: str = DEFAULT_HOST) -> int:
    """A port free right now, from spare_port_range. A small race remains, as with any such pick."""
    low, high = spare_port_range()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


DEFAULT_PUBLISH_ADDRESS = Endpoints().publish
DEFAULT_RELAY_ADDRESS = Endpoints().relay
DEFAULT_CONTROL_ADDRESS = Endpoints().control


def free_tcp_ports(n: int, host: str = DEFAULT_HOST) -> list[int]:
    """`n` different ports free right now (a run's publish, relay and control must differ: two
    random picks may be the same port)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_tcp_port(host)
        if port not in ports:
            ports.append(port)
    return ports
