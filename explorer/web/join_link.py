"""The join link's address: one a class's phones can open.

The link is built on the address the lecturer's page was opened at (on a Space, its public https address, which
works inside the Hub's iframe too). Only a loopback address (127.0.0.1, localhost) is changed, since no phone can
open it:

- the server listens on the network (``GRADIO_SERVER_NAME=0.0.0.0``, or one address of this machine): the link
  carries that address, or for 0.0.0.0 this machine's own IPv4 address (``network_ipv4``), with the page's port;
- Gradio made a share link (``GRADIO_SHARE=True``): the link is built on it;
- the server listens on loopback only (``python app.py``'s default): the link stays as it is, and the lecturer is
  told in a sentence that phones cannot reach it and how to start the server for a classroom.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit, urlunsplit

START_FOR_A_CLASS = ("stop it and start it with `GRADIO_SERVER_NAME=0.0.0.0 python app.py` (the phones on the "
                     "same network as this computer, and a network that lets them connect), or with "
                     "`GRADIO_SHARE=True python app.py` for a public share link through Gradio's servers where the "
                     "network lets it out; the link and QR code then carry an address phones can open")


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    host = (host or "").strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _usable(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.version == 4 and not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def network_ipv4() -> list[str]:
    """This machine's IPv4 addresses a phone could reach, the default route's first: the source address a UDP
    socket would use toward a documentation address (connecting a UDP socket sends nothing), then those the host
    name resolves to. Empty without a network."""
    found: list[str] = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        found.append(probe.getsockname()[0])
    except OSError:  # no route: no network right now
        pass
    finally:
        probe.close()
    try:
        found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    return list(dict.fromkeys(a for a in found if _usable(a)))


def join_base(page: str, server_name: str | None, *, share_url: str | None = None,
              addresses=None) -> tuple[str, str | None]:
    """(the address to build the join link on, a sentence for the lecturer or None). ``page``: the page's own
    address (``http(s)://host[:port]/path``); ``server_name``: where the server listens (None: not known);
    ``addresses``: a function giving this machine's IPv4 addresses (default ``network_ipv4``)."""
    parts = urlsplit(page)
    if not is_loopback(parts.hostname):
        return page, None  # a Space, a share link, or an address the lecturer typed: phones open it as it is
    if share_url:
        return share_url.rstrip("/") + (parts.path or "/"), None
    if server_name is None or is_loopback(server_name):
        where = f" on {server_name}" if server_name else ""
        return page, (f"⚠️ Phones cannot open this link: this server listens{where} for this computer only. For "
                      f"a class, {START_FOR_A_CLASS}.")
    host = server_name
    if server_name in ("0.0.0.0", "::", ""):
        found = (addresses or network_ipv4)()
        if not found:
            return page, ("⚠️ Phones cannot open this link: this server listens on the network, but this computer "
                          "has no network address right now. Join the classroom's network and press Ask again.")
        host = found[0]
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path or "/", "", "")), None
