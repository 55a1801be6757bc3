"""Reading the parts of the Redis URLs that name several servers (``redis+sentinel://``,
``redis+cluster://``): the host list, the credentials, the known options; each problem
a :class:`ValueError` of one line."""

from __future__ import annotations

from urllib.parse import SplitResult, parse_qs, unquote

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


def is_sentinel_url(url: object) -> bool:
    """Whether ``url`` is a ``redis+sentinel://`` (or ``rediss+sentinel://``) URL."""
    return isinstance(url, str) and url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def host_ports(parts: SplitResult, url: str, what: str,
               default_port: int | None = None) -> list[tuple[str, int]]:
    """``host:port`` pairs of ``a:1,b:2`` (a host alone takes ``default_port`` if given)."""
    out = []
    for text in (h.strip() for h in parts.netloc.rpartition("@")[2].split(",")):
        if not text:
            continue
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
        if not port and default_port is not None:
            out.append((text, default_port))
        elif not host or not port.isdigit():
            raise ValueError(f"bad {what} address {text!r} in {url!r}: expected host:port")
        else:
            out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError(f"the URL names no {what} (host:port): {url!r}")
    return out


def credentials(parts: SplitResult) -> tuple[str | None, str | None]:
    """The user and password before ``@`` (percent-decoded), None where absent."""
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    user, _, password = userinfo.partition(":")
    return unquote(user) or None, unquote(password) or None


def known_options(parts: SplitResult, known: tuple[str, ...], what: str) -> dict[str, str]:
    """The URL's query options, each one of ``known``."""
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = sorted(set(query) - set(known))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} in the {what} URL (known: "
                         f"{', '.join(known)})")
    return query
