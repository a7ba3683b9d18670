"""Webhook targets: URL rules, the SSRF guard, address pinning and URL redaction.

A webhook URL is operator input that the server POSTs to, so it must not become a way
to reach what only the server can reach (cloud metadata at ``169.254.169.254``, the
loopback admin ports, the private network):

* **at creation** (:func:`check_url`): ``http``/``https`` only, a host, a valid port,
  no credentials (``user:pass@``), no fragment; an IP literal (or ``localhost``) in a
  refused range is refused at once;
* **at every delivery** (:meth:`WebhookGuard.pin`): the host name is resolved, *every*
  address it resolves to must be allowed, and the request is sent to that address
  (:class:`PinnedTarget`: the URL carries the IP, the ``Host`` header and the TLS SNI /
  certificate check carry the name), so DNS cannot answer one address to the check and
  another to the connection (DNS rebinding).

Refused: loopback, private (RFC 1918, ULA), link-local, shared (CGNAT), multicast,
reserved, unspecified and every other non-global address, IPv4-mapped IPv6 included.
``FLEETSCOPE_WEBHOOK_ALLOW`` (:attr:`fleetscope.server.settings.Settings.webhook_allow`)
lists exceptions: IP addresses, CIDR networks or exact host names, comma-separated.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]
"""(host, port) -> IP address strings (blocking; run off the event loop)."""

MAX_URL_CHARS = 2000


class WebhookURLError(ValueError):
    """A webhook URL that is malformed or refused; the message says why (URL redacted).

    ``transient``: the host did not resolve (DNS may answer later); every other refusal
    fails the same way on every attempt.
    """

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def redact_url(url: str) -> str:
    """The URL as shown in API answers and logs: scheme, host and port only.

    Webhook URLs often carry their token in the path or query (Slack, PagerDuty, Teams),
    so nothing after the authority is shown, and credentials never are.
    """
    try:
        u = httpx.URL(url)
        host = u.host
    except Exception:  # unparsable: show only the scheme
        scheme = url.split(":", 1)[0] if ":" in url else ""
        return f"{scheme}://…" if scheme.isalpha() else "…"
    if not host:
        return f"{u.scheme}://…"
    shown = f"[{host}]" if ":" in host else host
    port = f":{u.port}" if u.port else ""
    rest = "/…" if (u.raw_path not in (b"", b"/") or u.query or u.fragment) else "/"
    return f"{u.scheme}://{shown}{port}{rest}"


def check_url(url: str) -> httpx.URL:
    """Syntactic rules of a webhook URL; returns the parsed URL.

    Raises:
        WebhookURLError: naming the rule broken (the URL itself redacted).
    """
    if len(url) > MAX_URL_CHARS:
        raise WebhookURLError(f"longer than {MAX_URL_CHARS} characters")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise WebhookURLError("is not valid UTF-8 text") from None
    try:
        u = httpx.URL(url)
        _ = u.port  # httpx validates the port lazily on some inputs
    except Exception as e:
        raise WebhookURLError(f"not a valid URL ({type(e).__name__}: {_first_line(e)})") from None
    if u.scheme not in ("http", "https"):
        raise WebhookURLError(f"scheme {u.scheme!r}: expected http or https")
    if not u.host:
        raise WebhookURLError("names no host")
    if u.userinfo:
        raise WebhookURLError("must not contain credentials (user:password@); use the webhook secret")
    if u.fragment:
        raise WebhookURLError("must not contain a #fragment")
    if any(c.isspace() for c in url):
        raise WebhookURLError("must not contain whitespace")
    return u


def refused_reason(ip: IPAddress) -> str | None:
    """Why an address may not be a webhook target (None: a global unicast address)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for attr, reason in (("is_loopback", "loopback"), ("is_link_local", "link-local"),
                         ("is_multicast", "multicast"), ("is_unspecified", "unspecified"),
                         ("is_private", "private"), ("is_reserved", "reserved")):  # fmt: skip
        if getattr(ip, attr):
            return reason
    if not ip.is_global:
        return "not globally routable"
    return None


@dataclass(frozen=True)
class AllowList:
    """Exceptions to the guard: networks (an IP is a /32 or /128) and exact host names."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def parse(cls, spec: str | Iterable[str]) -> AllowList:
        """``"127.0.0.1, 10.0.0.0/8, alertmanager.internal"`` -> an allow list.

        Raises:
            ValueError: an entry that is neither an address, a network nor a host name.
        """
        items = spec.replace(",", " ").split() if isinstance(spec, str) else list(spec)
        nets: list[IPNetwork] = []
        hosts: set[str] = set()
        for item in items:
            try:
                nets.append(ipaddress.ip_network(item.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = item.lower().rstrip(".")
            labels = name.split(".")
            if not name or len(name) > 253 or not all(
                    lab and len(lab) <= 63 and lab.replace("-", "").isalnum() for lab in labels):  # fmt: skip
                raise ValueError(f"webhook_allow entry {item!r}: expected an IP address, a CIDR network or a host name")
            hosts.add(name)
        return cls(tuple(nets), frozenset(hosts))

    def allows_host(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def allows_ip(self, ip: IPAddress) -> bool:
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return any(ip in n or (mapped is not None and mapped in n) for n in self.networks)

    def __str__(self) -> str:
        return ",".join([*(str(n) for n in self.networks), *sorted(self.hosts)]) or "(none)"


def _literal(host: str) -> IPAddress | None:
    """The address an IP literal names, legacy IPv4 forms included (``2130706433``,
    ``0x7f.1``, ``0177.0.0.1``: the C resolver reads them as 127.0.0.1)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefxABCDEFX." for c in host) and host[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def check_target(url: str, allow: AllowList) -> httpx.URL:
    """:func:`check_url` plus the guard for what needs no DNS (IP literals, localhost).

    Raises:
        WebhookURLError: the URL is malformed or names a refused address.
    """
    u = check_url(url)
    if allow.allows_host(u.host):
        return u
    ip = _literal(u.host)
    if ip is not None:
        reason = refused_reason(ip)
        if reason and not allow.allows_ip(ip):
            raise WebhookURLError(f"targets {ip} ({reason} address); allow it in FLEETSCOPE_WEBHOOK_ALLOW")
    elif u.host == "localhost" or u.host.endswith(".localhost"):
        raise WebhookURLError("targets localhost (loopback); allow it in FLEETSCOPE_WEBHOOK_ALLOW")
    return u


@dataclass(frozen=True)
class PinnedTarget:
    """Where one delivery goes: the URL with the checked IP in place of the host name."""

    url: httpx.URL
    """Request URL, host replaced by the resolved address."""
    headers: dict[str, str]
    """``Host`` (the original name and port)."""
    extensions: dict[str, str]
    """``sni_hostname`` for https: TLS SNI and certificate name stay the original host."""
    address: str


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (A and AAAA), in resolver order, no duplicates."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[str] = []
    for *_, sockaddr in infos:
        addr = str(sockaddr[0]).split("%", 1)[0]
        if addr not in out:
            out.append(addr)
    return out


class WebhookGuard:
    """The allow list and the resolver; :meth:`pin` is run before every delivery."""

    def __init__(self, allow: AllowList | str = "", resolver: Resolver = system_resolver) -> None:
        self.allow = allow if isinstance(allow, AllowList) else AllowList.parse(allow)
        self.resolver = resolver

    def pin(self, url: str) -> PinnedTarget:
        """Check ``url`` and resolve it once; blocking (call it in a worker thread).

        Raises:
            WebhookURLError: malformed, unresolvable, or any resolved address refused.
        """
        u = check_target(url, self.allow)
        port = u.port or (443 if u.scheme == "https" else 80)
        literal = _literal(u.host)
        if literal is not None:
            addrs = [str(literal)]
        else:
            try:
                addrs = self.resolver(u.host, port)
            except (OSError, UnicodeError) as e:
                raise WebhookURLError(f"host {u.host!r} does not resolve ({type(e).__name__})", transient=True) from None
            if not addrs:
                raise WebhookURLError(f"host {u.host!r} resolves to no address", transient=True)
        by_name = self.allow.allows_host(u.host)
        ips = [ipaddress.ip_address(a) for a in addrs]
        for ip in ips:
            reason = refused_reason(ip)
            if reason and not by_name and not self.allow.allows_ip(ip):
                raise WebhookURLError(
                    f"host {u.host!r} resolves to {ip} ({reason} address); "
                    "allow it in FLEETSCOPE_WEBHOOK_ALLOW"
                )
        ip = ips[0]
        host_header = u.host if u.port is None else f"{_bracket(u.host)}:{u.port}"
        ext = {"sni_hostname": u.host} if u.scheme == "https" and literal is None else {}
        return PinnedTarget(url=u.copy_with(host=str(ip)), headers={"Host": host_header},
                            extensions=ext, address=str(ip))


class RedactRequestURLs(logging.Filter):
    """Redacts the URL in httpx's per-request log line (``HTTP Request: POST <url> ...``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) >= 2 and isinstance(record.args[1], httpx.URL):
            record.args = (record.args[0], redact_url(str(record.args[1])), *record.args[2:])
        return True


def install_log_redaction() -> None:
    """Make the ``httpx`` logger of this process show webhook URLs redacted (idempotent)."""
    logger = logging.getLogger("httpx")
    if not any(isinstance(f, RedactRequestURLs) for f in logger.filters):
        logger.addFilter(RedactRequestURLs())


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:120]
