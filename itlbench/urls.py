"""The one check of an http(s) URL a user types (`run --endpoint`, `--otlp-endpoint`), shared so both flags
refuse the same bad URLs in one line before anything is probed."""

from __future__ import annotations

import urllib.parse

from itlbench.errors import ConfigError


def check_http_url(url: str, flag: str, example: str) -> urllib.parse.SplitResult:
    """`url` split, or a ConfigError naming `flag` (with `example` as the fix) where it is not an http(s) URL
    with a host and, if given, a port in 1-65535. Port 99999 or an unclosed IPv6 bracket was probed, and
    failed as urllib's ValueError ("Port out of range", "Invalid IPv6 URL") with a traceback."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(flag, f"{url!r} is not an http(s) URL", example)
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ConfigError(flag, f"{url!r} holds a space or a control character", example)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed bracket
        raise ConfigError(flag, f"{url!r} is not a valid URL ({exc})", example) from None
    if not parts.hostname:
        raise ConfigError(flag, f"{url!r} names no host", example)
    try:
        port = parts.port
    except ValueError:  # past 65535, or not a number
        port = 0
    if port == 0:
        raise ConfigError(flag, f"{url!r}: the port must be a whole number from 1 to 65535, got "
                          f"{parts.netloc.rpartition(':')[2]}", example)
    return parts
