"""One HTTP(S) request to a server on loopback, with the status, the headers (lower-cased) and the body back."""

from __future__ import annotations

import http.client
import ssl


def request(port: int, path: str = "/-/healthy", method: str = "GET", headers: dict[str, str] | None = None,
            context: ssl.SSLContext | None = None, host: str = "127.0.0.1",
            timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()
