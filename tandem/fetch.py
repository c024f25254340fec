"""Fetching a client's remote image URL, only when an operator allow-listed its host.

Every guard a server-side fetch needs: http(s) only, no credentials in the URL, the host on the
allow-list, every address it resolves to public (never loopback, private, link-local, multicast or
reserved), the connection pinned to the checked address (no DNS rebinding between check and
connect), no redirects, a timeout, and a byte cap enforced while reading.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from typing import Callable
from urllib.parse import urlsplit

from tandem.chat_schema import short
from tandem.errors import BadRequest, PayloadTooLarge


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def resolve(host: str, port: int) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a fixed address, verifying the certificate against the original host name."""

    def __init__(self, address: str, host: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def fetch_image(url: str, *, allowed_hosts: tuple[str, ...], timeout_s: float, max_bytes: int,
                resolver: Callable[[str, int], list[str]] = resolve,
                address_allowed: Callable[[str], bool] = is_public_address) -> bytes:
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        raise BadRequest(f"image URL scheme {short(scheme)} is refused; only http(s) to allow-listed hosts")
    if parts.username or parts.password:
        raise BadRequest("image URLs with credentials are refused")
    if host not in allowed_hosts:
        raise BadRequest(f"image host {short(host)} is not on the allow-list")
    port = parts.port or (443 if scheme == "https" else 80)
    try:
        addresses = resolver(host, port)
    except OSError:
        raise BadRequest(f"image host {short(host)} does not resolve") from None
    if not addresses or not all(address_allowed(a) for a in addresses):
        raise BadRequest(f"image host {short(host)} resolves to a non-public address; refused")
    if scheme == "https":
        conn = _PinnedHTTPSConnection(addresses[0], host, port, timeout_s)
    else:
        conn = http.client.HTTPConnection(addresses[0], port, timeout=timeout_s)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("GET", path, headers={"Host": host, "User-Agent": "tandem-image-fetch",
                                           "Accept": "image/*"})
        response = conn.getresponse()
        if response.status != 200:
            raise BadRequest(f"image URL answered HTTP {response.status}; only 200 is accepted (no redirects)")
        declared = response.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise PayloadTooLarge(f"remote image is {declared} bytes; the limit is {max_bytes}")
        data = response.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"remote image is over the limit of {max_bytes} bytes")
        return data
    except (OSError, http.client.HTTPException) as err:
        raise BadRequest(f"image URL could not be fetched ({type(err).__name__})") from None
    finally:
        conn.close()
