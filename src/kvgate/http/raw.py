"""One HTTP/1.1 request sent byte for byte as written: the request target, the ``Host`` header and
every other header go out exactly as given, which httpx does not allow (it normalises ``//v1``,
``/./v1``, ``/v1/../v1`` and ``%2e%2e`` away, rebuilds ``Host`` from the URL and sends no
absolute-form target). The security gate's auth-surface case spells its routes with it.

:func:`raw_request` opens one connection (TLS for ``https://``), writes ``METHOD TARGET HTTP/1.1``,
the headers and the body, reads the answer with the standard library's HTTP/1.1 response parser
(status, headers, Content-Length or chunked body), keeps at most ``max_body`` bytes of the body and
closes the connection (``Connection: close`` is sent). Returns a :class:`~kvgate.http.client.Reply`;
raises :class:`~kvgate.http.client.EndpointUnreachable` only when no connection (or no TLS session)
can be opened. An
answer that never came is a ``Reply`` with status 0 whose text starts with :data:`TIMED_OUT` (no
answer within ``timeout_s``) or :data:`DROPPED` (the server closed the connection, or sent bytes
that are not an HTTP response). ``connect`` and ``clock`` are injectable (tests: a socketpair).

Slow and simple by design (a blocking socket, one request per connection): it sends tens of
requests per gate, never load; timing-accurate load is :mod:`kvgate.load.raw_http`'s.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from typing import Callable, Mapping
from urllib.parse import urlsplit

from kvgate.http.client import Endpoint, EndpointUnreachable, Reply
from kvgate.report.redact import redact_url

#: Text a :class:`Reply` of status 0 starts with when no answer came within the deadline.
TIMED_OUT = "timeout: no answer within"
#: Text a :class:`Reply` of status 0 starts with when the server closed the connection (or answered
#: bytes that are not HTTP) instead of answering.
DROPPED = "dropped:"
#: Body bytes kept by default (the rest is read past, never stored).
MAX_BODY = 64 * 1024

Connect = Callable[[str, int, float], socket.socket]


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    return socket.create_connection((host, port), timeout=timeout_s)


def origin(endpoint: Endpoint) -> tuple[str, str, int, str, str]:
    """``(scheme, host, port, base path, Host header value)`` of an endpoint: ``base path`` is the
    base URL's own path without a trailing ``/`` (``""`` for a server root); the Host value is the
    endpoint's ``host_header`` when set, else the URL's ``host[:port]``."""
    u = urlsplit(endpoint.base_url)
    scheme = u.scheme or "http"
    port = u.port or (443 if scheme == "https" else 80)
    netloc = u.netloc.rsplit("@", 1)[-1]
    return scheme, u.hostname or "127.0.0.1", port, u.path.rstrip("/"), endpoint.host_header or netloc


def raw_request(endpoint: Endpoint, method: str, target: str, *, headers: Mapping[str, str] | None = None,
                body: bytes | None = None, timeout_s: float = 10.0, max_body: int = MAX_BODY,
                connect: Connect = _connect, clock: Callable[[], float] = time.monotonic) -> Reply:
    """Send ``METHOD TARGET HTTP/1.1`` to ``endpoint``'s host and port, ``target`` as given (it is not
    joined to the base URL's path: the caller writes the whole target). Headers sent, in order:
    ``Host`` (:func:`origin`'s value unless ``headers`` names one), ``Authorization: Bearer <key>``
    when the endpoint carries a key, ``Content-Type: application/json`` and ``Content-Length`` with
    a ``body``, ``Connection: close``, then ``headers`` (a ``Host`` in it replaces the default,
    whatever it holds). ``timeout_s`` bounds the connect and every read (seconds); ``max_body``:
    body bytes kept. Raises :class:`EndpointUnreachable` when the connection (or its TLS session)
cannot be opened."""
    scheme, host, port, _, host_value = origin(endpoint)
    extra = dict(headers or {})
    host_value = next((v for k, v in extra.items() if k.lower() == "host"), host_value)
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_value}"]
    if endpoint.api_key:
        lines.append(f"Authorization: Bearer {endpoint.api_key}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in extra.items() if k.lower() != "host"]
    wire = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    t0 = clock()
    try:
        sock = connect(host, port, timeout_s)
    except OSError as exc:
        raise EndpointUnreachable(f"endpoint {redact_url(endpoint.base_url)} is unreachable "
                                  f"({type(exc).__name__}: {exc}) on {method} {target[:80]}") from None
    try:
        sock.settimeout(timeout_s)
        if scheme == "https":  # verified as httpx verifies (SSL_CERT_FILE: kvgate's --ca-bundle)
            try:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            except (ssl.SSLError, ssl.CertificateError) as exc:
                raise EndpointUnreachable(f"endpoint {redact_url(endpoint.base_url)} is unreachable (TLS: {exc}) "
                                          f"on {method} {target[:80]}") from None
        sock.sendall(wire)
        resp = http.client.HTTPResponse(sock, method=method)
        resp.begin()
        data = resp.read(max_body)
        return Reply(resp.status, data.decode("utf-8", "replace"), clock() - t0,
                     {k.lower(): v for k, v in resp.getheaders()}, len(body) if body is not None else 0, len(data))
    except (socket.timeout, TimeoutError):
        return Reply(0, f"{TIMED_OUT} {timeout_s:g} s", clock() - t0, sent_bytes=len(body or b""))
    except (http.client.HTTPException, OSError) as exc:
        return Reply(0, f"{DROPPED} {type(exc).__name__}: {str(exc)[:120]}".rstrip(": "), clock() - t0)
    finally:
        sock.close()


__all__ = ["DROPPED", "MAX_BODY", "TIMED_OUT", "origin", "raw_request"]
