"""External endpoints: the root URL of an endpoint llm_bench measures, checked before anything
runs (bench_base_url, an external profile's base_url)."""
from __future__ import annotations

from typing import Any, Optional
from urllib.parse import urlsplit


def _shown_url(parts) -> str:
    """The URL without what may be a secret (user:password@, ?query, #fragment)."""
    host = parts.hostname or ""
    if ":" in host:
        host = "[%s]" % host
    try:
        port = parts.port
    except ValueError:
        port = None
    return "%s://%s%s%s" % (parts.scheme, host, ":%d" % port if port else "", parts.path)


def base_url_problem(url: Any) -> Optional[str]:
    """Why `url` is not the root of an endpoint llm_bench can measure (None: it is). Only
    http(s)://host[:port][/path]: credentials belong in bench_api_key (a secret, never recorded),
    and the URL is recorded in the manifest and the report. Never echoes a credential."""
    example = "e.g. https://llm.example.com or http://10.0.0.5:8000/v1"
    if not isinstance(url, str) or not url.strip():
        return "empty; give the endpoint's root URL (%s)" % example
    if any(c.isspace() for c in url):
        return "%r has white space in it; give the endpoint's root URL (%s)" % (url.strip(), example)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return "not a URL (%s); give http(s)://host[:port][/path], %s" % (exc, example)
    if parts.username is not None or parts.password is not None:
        return ("%s carries credentials (user:password@ in the URL, not shown here): remove them "
                "and give the key in bench_api_key (sent as a bearer token, masked, never "
                "recorded)" % _shown_url(parts))
    if parts.query or parts.fragment:
        return ("%s has a query or fragment (not shown here): give the endpoint's root only (the "
                "API paths /v1/... are added to it); a key goes in bench_api_key"
                % _shown_url(parts))
    if parts.scheme not in ("http", "https"):
        return "%r: expected http:// or https:// (%s)" % (url, example)
    if not parts.hostname:
        return "%r names no host (%s)" % (url, example)
    if port is not None and not 1 <= port <= 65535:
        return "%r: port %d is not a TCP port (1-65535)" % (url, port)
    return None
