"""gradio_client's ``Client`` for the app on loopback, as the tests make it.

The tests talk to the app over plain http on 127.0.0.1, where TLS never happens, yet for every request gradio_client
sends it builds an httpx client whose default TLS context loads the system's certificate bundle (24 ms each on the
CI machine, about 10 s of the fast tier): ``ssl_verify=False`` gives those clients an empty context instead.
"""
from __future__ import annotations

from gradio_client import Client


def loopback_client(url: str, **kwargs) -> Client:
    """A quiet ``Client`` for the app served on this machine (``url`` on 127.0.0.1 or localhost)."""
    if not url.startswith(("http://127.0.0.1", "http://localhost")):
        raise ValueError(f"loopback_client is for an app on this machine over http, not {url!r}.")
    kwargs.setdefault("verbose", False)
    return Client(url, ssl_verify=False, **kwargs)
