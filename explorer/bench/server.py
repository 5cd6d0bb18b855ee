"""``python app.py`` in a subprocess on a free loopback port, and what it costs (resident memory, CPU time), for the
load benchmark and tests (``explorer.bench.load``). A subprocess, so that the clients' threads do not share the
server's interpreter (and its GIL).

    with served_app({"EXPLORER_SESSION_IDLE_MINUTES": "0.1"}) as server:
        server.url, server.rss_bytes(), server.cpu_seconds()
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (VmRSS from /proc), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process ``pid`` has used so far (from /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path
    answered_seconds: float | None = None  # from the process's start to the first page config served
    computed_seconds: float | None = None  # ... to the first one whose opening tab shows every figure computed
    ready_seconds: float | None = None  # ... to the first one with every tab's opening example in it

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _first_tab_ids(config: dict) -> set[int]:
    """The ids of the components inside the page's first tab (the one a page opens on), from its layout."""
    kinds = {c["id"]: c.get("type") for c in config.get("components", [])}

    def find(node):
        if kinds.get(node.get("id")) == "tabitem":
            return node
        for child in node.get("children", []) or []:
            found = find(child)
            if found is not None:
                return found
        return None

    def ids(node):
        yield node["id"]
        for child in node.get("children", []) or []:
            yield from ids(child)

    tab = find(config.get("layout") or {})
    return set(ids(tab)) if tab is not None else set()


def computed_page(config: dict) -> bool:
    """Whether a page config shows computed figures where a visitor lands: a Plot inside its first tab carries a
    value (the first tab's opening example draws its figures in one event; its class-vote tally stays empty
    until a vote)."""
    inside = _first_tab_ids(config)
    return any(c.get("type") == "plot" and c["id"] in inside and (c.get("props") or {}).get("value")
               for c in config.get("components", []))


def openings_pending(config: dict) -> bool:
    """Whether a page config says some tab's opening example is still being computed (``python app.py``
    computes them after the server answers: explorer.web.serving.start_openings); RuntimeError when it says one
    failed."""
    for c in config.get("components", []):
        props = c.get("props") or {}
        if props.get("elem_id") == "opening-status" and props.get("visible") is not False:
            if not str(props.get("value", "")).startswith("⏳"):  # a failure, said on the page
                raise RuntimeError(f"app.py's opening examples: {props.get('value')}")
            return True
    return False


@contextlib.contextmanager
def served_app(env: dict[str, str] | None = None, *, start_timeout: float = 180.0, until: str = "ready"):
    """``python app.py`` on a free loopback port, with ``env`` added to this process's environment, once every
    opening example is in its page (``until="answered"``: once the server answers at all, the openings maybe
    still being computed); stopped (terminated, then killed) on exit."""
    if until not in ("ready", "answered"):
        raise ValueError(f'until must be "ready" or "answered", got {until!r}.')
    import httpx

    port = free_port()
    log = Path(tempfile.mkstemp(prefix="explorer-app-", suffix=".log")[1])
    full_env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1",
                "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    started = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=full_env, stdout=out,
                                   stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}/", process, log)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"app.py exited with {process.returncode}:\n{server.log_tail()}")
            try:
                answer = httpx.get(server.url + "config", timeout=5)
                if answer.status_code == 200:
                    now = time.monotonic() - started
                    server.answered_seconds = server.answered_seconds or now
                    if until == "answered":
                        break
                    config = answer.json()
                    if server.computed_seconds is None and computed_page(config):
                        server.computed_seconds = now
                    if not openings_pending(config):  # the server settled: every opening example computed
                        server.ready_seconds = now
                        if server.computed_seconds is None:
                            raise RuntimeError("app.py's page has every opening example, yet its first tab "
                                               "shows no computed figure")
                        break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not answer within {start_timeout:.0f} s:\n{server.log_tail()}")
            time.sleep(0.5)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
        log.unlink(missing_ok=True)
