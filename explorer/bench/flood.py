"""A stranger's script against ``python app.py`` (issue 31): floods of fresh session ids, throw-away sessions,
long jobs queued before a generation, and Stop. Raw queue routes (``explorer.bench.page_client``), one process
of clients; the server runs in its own (``explorer.bench.server``). Used by ``python -m explorer.bench`` (the
robustness rows) and tests/test_robustness_flood.py.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import re
import threading
import time
import uuid
from typing import Any, Callable

from .load import quantiles
from .page_client import API, fetch_plan, run_events  # noqa: F401 (fetch_plan: tests)

#: The memory lab's sweep at lengths that take seconds on 2 cores: a long measurement.
SWEEP = [4096, 8, 64, 8, ["naive", "tiled"], True, "float32"]
#: A server's settings that let one address hold as many events as it sends (rows that measure the queue itself).
NO_CLIENT_CAPS = {"EXPLORER_CLIENT_QUEUE_CAP": "100000", "EXPLORER_CLIENT_LANE_CAP": "100000",
                  "EXPLORER_CLIENT_LONG_CAP": "100000"}


def _join(http, url: str, fn: int, data: list, session_hash: str, headers: dict | None = None) -> tuple[int, str]:
    body = {"data": data, "fn_index": fn, "session_hash": session_hash, "event_data": None, "trigger_id": None}
    try:
        r = http.post(url + API + "queue/join", json=body, headers=headers or {}, timeout=60)
        return r.status_code, r.text[:200]
    except Exception as exc:  # noqa: BLE001 - counted as a failure of this join
        return 0, f"{type(exc).__name__}: {exc}"[:200]


def keep_reading(url: str, session_hash: str, timeout: float = 900.0) -> threading.Thread:
    """A reader of ``session_hash``'s answers (Gradio's ``/queue/data``) on a daemon thread, open until its
    stream closes or ``timeout`` seconds pass: what a script does whose events the queue should not drop as unread
    (``gradio_adapter.drop_unread``)."""
    import httpx

    def read() -> None:
        with contextlib.suppress(Exception), httpx.Client(timeout=httpx.Timeout(30.0, read=timeout)) as http:
            with http.stream("GET", url + API + "queue/data", params={"session_hash": session_hash}) as stream:
                for line in stream.iter_lines():
                    if '"msg":"close_stream"' in line[:100] or '"msg":"unexpected_error"' in line[:100]:
                        return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def flood(url: str, fn: int, data: list, n: int, *, tag: str, workers: int = 32,
          headers: dict | Callable[[int], dict] | None = None, wait_when_full: float = 0.0,
          read: bool = False) -> dict[str, Any]:
    """``n`` joins of event ``fn``, each from a new session id, ``workers`` at a time: how many were accepted,
    refused (by status) and how many said the queue was stopped. ``headers`` may be a function of the join's
    number. With ``wait_when_full`` seconds, a join told the queue is full is sent again until accepted or that
    long has passed. Streams are never read, so the queue drops what waits longer than its grace
    (``serving.UNREAD_SECONDS``); with ``read`` each accepted join's answers are read (``keep_reading``), as a
    script that holds its place does, and ``finished`` counts the accepted events whose answers had ended by the
    flood's last join: each freed its place in the caps for a later join."""
    import httpx

    deadline = time.monotonic() + wait_when_full
    readers: list[threading.Thread] = []

    def one(i: int):
        with httpx.Client() as http:
            while True:
                session = f"{tag}-{i}-{uuid.uuid4().hex[:6]}"
                code, text = _join(http, url, fn, data, session, headers(i) if callable(headers) else headers)
                if code == 200 and read:
                    readers.append(keep_reading(url, session))
                if code != 503 or "Queue is full" not in text or time.monotonic() > deadline:
                    return code, text
                time.sleep(0.25)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        codes = list(pool.map(one, range(n)))
    by_status: dict[int, int] = {}
    for code, _ in codes:
        by_status[code] = by_status.get(code, 0) + 1
    return {"joins": n, "by_status": by_status, "accepted": by_status.get(200, 0),
            "finished": sum(not reader.is_alive() for reader in readers),
            "queue_stopped": sum("Queue is stopped" in text for _, text in codes),
            "examples": sorted({text for code, text in codes if code != 200})[:3]}


def answer_seconds(url: str, api_name: str, values: list | None = None, *, headers: dict | None = None,
                   timeout: float = 120.0, session_hash: str | None = None) -> tuple[float | None, list[str]]:
    """Seconds until ``api_name`` is answered for one session (a new one unless ``session_hash`` is given; None:
    not answered), and what failed."""
    import httpx

    plan = fetch_plan(url)
    fn = plan.fn_of(api_name)
    t0 = time.monotonic()
    session_hash = session_hash or f"victim-{uuid.uuid4().hex[:8]}"
    with httpx.Client(timeout=60, headers=headers or {}) as http:
        out = run_events(http, url, session_hash, plan, [fn], {fn: values or plan.values[fn]},
                         time.monotonic() + timeout, follow=False)
    return (time.monotonic() - t0 if fn in out.done else None), out.refused + out.failed


def queue_outlives_flood(url: str, *, long_jobs: int = 20, joins: int = 2300) -> dict[str, Any]:
    """Long jobs queued (sweeps, one session each, read: they stay pending for minutes), then ``joins`` cheap joins
    (``kv_calculator``) each from a new session, never read (dropped unrun if they wait past the queue's grace),
    sent again while the queue is full until taken:
    more sessions than Gradio's per-session message books hold, with events pending. Then a page and an answer
    from a new visitor."""
    import httpx

    plan = fetch_plan(url)
    sweep = plan.fn_of("memory_compare")
    held = flood(url, sweep, SWEEP, long_jobs, tag="long", workers=long_jobs, read=True)  # read: they stay queued
    cheap = plan.fn_of("kv_calculator")
    t0 = time.monotonic()
    flooded = flood(url, cheap, plan.values[cheap], joins, tag="cheap", wait_when_full=400.0)
    flood_s = time.monotonic() - t0
    page = httpx.get(url, timeout=60)
    seconds, failed = answer_seconds(url, "kv_calculator", timeout=300.0)
    books = held["accepted"] + flooded["accepted"]
    return {"long_jobs": held, "flood": flooded, "flood_seconds": flood_s, "sessions_joined": books,
            "page_status": page.status_code, "answer_seconds": seconds, "answer_failed": failed}


def hold_heartbeat(url: str, session_hash: str) -> threading.Event:
    """Open Gradio's heartbeat for ``session_hash`` and keep it open, as a page does, until the returned event is
    set."""
    import httpx

    stop = threading.Event()

    def hold() -> None:
        with contextlib.suppress(Exception), httpx.Client(timeout=httpx.Timeout(5.0, read=None)) as http:
            with http.stream("GET", url + API + f"heartbeat/{session_hash}") as stream:
                for _ in stream.iter_bytes():
                    if stop.is_set():
                        return

    threading.Thread(target=hold, daemon=True).start()
    return stop


def victim_beside_rotation(url: str, *, joins: int = 300, flooder: str = "10.1.1.1",
                           victim: str = "10.2.2.2", established_s: float = 10.0) -> dict[str, Any]:
    """``joins`` attention questions, each from a new session id, all from one (forwarded) address, then one
    from another address and one from a classmate behind the flooder's address (a page whose heartbeat opened
    ``established_s`` before, as ``BrowserSessions.ESTABLISHED_SECONDS`` asks): how the flood was answered and how
    long each waited. The server must trust one proxy hop (``EXPLORER_PROXY_HOPS=1``) for the forwarded addresses
    to count."""
    plan = fetch_plan(url)
    fn = plan.fn_of("attention")
    values = list(plan.values[fn])
    classmate = f"classmate-{uuid.uuid4().hex[:8]}"
    heartbeat = hold_heartbeat(url, classmate)
    opened = time.monotonic()
    try:
        flooded = flood(url, fn, values, joins, tag="rotating", headers={"X-Forwarded-For": flooder}, read=True)
        values[0] = "The victim asks a question of their own."
        seconds, failed = answer_seconds(url, "attention", values, headers={"X-Forwarded-For": victim})
        time.sleep(max(0.0, established_s - (time.monotonic() - opened)))
        flooded_again = flood(url, fn, plan.values[fn], joins, tag="rotating2", headers={"X-Forwarded-For": flooder},
                              read=True)
        values[0] = "A classmate behind the same address asks."
        classmate_s, classmate_failed = answer_seconds(url, "attention", values, session_hash=classmate,
                                                       headers={"X-Forwarded-For": flooder})
    finally:
        heartbeat.set()
    return {"flood": flooded, "victim_seconds": seconds, "victim_failed": failed, "flood_again": flooded_again,
            "classmate_seconds": classmate_s, "classmate_failed": classmate_failed}


def memory_after_throwaway(server, *, sessions: int = 600, settle_s: float = 120.0, log=print) -> dict[str, Any]:
    """Resident memory of the server before ``sessions`` throw-away ``memory_trace`` sessions (each a new id,
    never read), right after, and ``settle_s`` seconds later (their sessions expired meanwhile)."""
    import gc

    plan = fetch_plan(server.url)
    fn = plan.fn_of("memory_trace")
    gc.collect()
    before = server.rss_bytes()
    t0 = time.monotonic()
    flooded = flood(server.url, fn, plan.values[fn], sessions, tag="throwaway", workers=16, read=True)
    # the flood's events may still be running: wait until the server is idle (CPU time stops growing)
    while time.monotonic() - t0 < 600:
        cpu = server.cpu_seconds()
        time.sleep(2)
        if server.cpu_seconds() - cpu < 0.2:
            break
    after = server.rss_bytes()
    log(f"robust: {sessions} throw-away memory_trace sessions: RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB")
    time.sleep(settle_s)
    settled = server.rss_bytes()
    return {"sessions": sessions, "flood": flooded, "rss_before": before, "rss_after": after,
            "rss_settled": settled, "settle_seconds": settle_s,
            "rss_settled_above_start": settled - before}


def generation_beside_finetunes(url: str, *, finetunes: int = 20, sweeps: int = 1) -> dict[str, Any]:
    """``finetunes`` LoRA fine-tunes (each from its own session and forwarded address: one address holds only a
    few of a lane) and ``sweeps`` memory sweeps queued, then a generation from a new session: seconds until its
    first streamed token (or its answer). The server must trust one proxy hop (``EXPLORER_PROXY_HOPS=1``)."""
    import httpx

    plan = fetch_plan(url)
    ft = plan.fn_of("lora_finetune")
    queued = flood(url, ft, plan.values[ft], finetunes, tag="finetune", workers=8, read=True,
                   headers=lambda i: {"X-Forwarded-For": f"10.4.{i // 250}.{i % 250 + 1}"})
    swept = flood(url, plan.fn_of("memory_compare"), SWEEP, sweeps, tag="sweep", workers=1, read=True) \
        if sweeps else None
    time.sleep(0.5)
    gen = plan.fn_of("generate")
    values = list(plan.values[gen])
    session = f"generation-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    first = None
    with httpx.Client(timeout=120) as http:
        code, _ = _join(http, url, gen, values, session)
        with http.stream("GET", url + API + "queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if '"msg":"process_generating"' in line[:200] or '"msg":"process_completed"' in line[:200]:
                    first = time.monotonic() - t0
                    break
                if time.monotonic() - t0 > 300:
                    break
    return {"finetunes": queued, "sweeps": swept, "generation_join": code, "generation_first_seconds": first}


def class_beside_long_floods(url: str, *, addresses: int = 4, joins: int = 300, class_size: int = 40,
                             timeout: float = 120.0) -> dict[str, Any]:
    """``addresses`` forwarded addresses each sending ``joins`` LoRA fine-tunes from fresh session ids, then a
    class of ``class_size`` at as many addresses asking the Attention tab at once and a visitor's KV calculator:
    how many long jobs were taken (and how many of those had ended while their address still flooded), how many
    of the class were answered and how fast. The server must trust one proxy hop (``EXPLORER_PROXY_HOPS=1``)."""
    plan = fetch_plan(url)
    ft = plan.fn_of("lora_finetune")
    floods = [flood(url, ft, plan.values[ft], joins, tag=f"long{a}", headers={"X-Forwarded-For": f"10.5.0.{a + 1}"},
                    read=True) for a in range(addresses)]
    visitor_s, visitor_failed = answer_seconds(url, "kv_calculator", headers={"X-Forwarded-For": "10.6.0.1"},
                                               timeout=timeout)
    values = list(plan.values[plan.fn_of("attention")])

    def student(i: int):
        mine = [f"Student {i} asks: the cat sat on the mat and looked at the cat.", *values[1:]]
        return answer_seconds(url, "attention", mine, headers={"X-Forwarded-For": f"10.7.{i // 250}.{i % 250 + 1}"},
                              timeout=timeout)

    with concurrent.futures.ThreadPoolExecutor(class_size) as pool:
        answers = list(pool.map(student, range(class_size)))
    seconds = [s for s, _ in answers if s is not None]
    q = quantiles(seconds)
    return {"long_accepted": [f["accepted"] for f in floods], "long_finished": [f["finished"] for f in floods],
            "long_examples": floods[0]["examples"],
            "visitor_seconds": visitor_s, "visitor_failed": visitor_failed, "class_size": class_size,
            "class_answered": len(seconds), "class_failed": [f for _, fs in answers for f in fs][:3],
            **{f"class_{k}": None if q[k] is None else round(q[k], 2) for k in ("p50", "p95")}}


def cancel_and_watch(server, http, session: str, fn: int, event_id: str, watch_s: float,
                     idle: float = 0.0) -> dict[str, Any]:
    """Stop as the button sends it (Gradio's /cancel) and the server's CPU seconds in each quarter second from the
    moment it was sent: ``settled_after`` is when they first fell within a tenth of a core of ``idle`` (the server's
    own rate before the work began: its heartbeats and sweeper are not the work). Sent on a thread, since Gradio
    answers the cancel only once the handler's current step has returned: timed from its answer, a step that ran on
    after Stop would go unseen. ``cancel_answered_after``: when that answer came."""
    answered: list[float] = []
    t0 = time.monotonic()

    def send() -> None:
        http.post(server.url + API + "cancel", json={"session_hash": session, "fn_index": fn, "event_id": event_id})
        answered.append(time.monotonic() - t0)

    sender = threading.Thread(target=send, daemon=True)
    windows, settled = [], None
    last, since = server.cpu_seconds(), time.monotonic()
    sender.start()
    while time.monotonic() - t0 < watch_s:
        time.sleep(0.25)
        now, at = server.cpu_seconds(), time.monotonic()
        windows.append(round((now - last) / (at - since), 2))  # the window's real length: sleep overruns under load
        last, since = now, at
        if settled is None and windows[-1] < idle + 0.1:
            settled = at - t0
    sender.join(60)
    return {"cores_per_quarter_second_after": windows, "settled_after": settled, "idle_cores": round(idle, 3),
            "cancel_answered_after": answered[0] if answered else None}


def cores_in_use(server, seconds: float = 1.0) -> float:
    """The server's CPU cores in use over the next ``seconds`` (idle, or busy with a job)."""
    before, t = server.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    return (server.cpu_seconds() - before) / (time.monotonic() - t)


def stop_frees_cpu(server, *, run_s: float = 3.0, watch_s: float = 4.0, sweep: list | None = None) -> dict[str, Any]:
    """A memory sweep (``sweep``, default ``SWEEP``) started and Stop pressed after ``run_s`` seconds (Gradio's
    /cancel, as the button sends it); then the server's CPU in quarter seconds (``cancel_and_watch``)."""
    import httpx

    plan = fetch_plan(server.url)
    fn = plan.fn_of("memory_compare")
    session = f"stopper-{uuid.uuid4().hex[:8]}"
    idle = cores_in_use(server)
    with httpx.Client(timeout=60) as http:
        r = http.post(server.url + API + "queue/join", json={"data": sweep or SWEEP, "fn_index": fn,
                                                            "session_hash": session, "event_data": None,
                                                            "trigger_id": None})
        event_id = r.json()["event_id"]
        time.sleep(run_s)
        busy_rate = cores_in_use(server, 0.5)
        watched = cancel_and_watch(server, http, session, fn, event_id, watch_s, idle)
    return {"cores_busy_before_stop": busy_rate, **watched}


#: The LoRA tab's fine-tune as the Stop row runs it: rank 8 on q and v, 200 steps, at most 60 s, the rate from the
#: model's width; ``FT_TEXT`` gives one training row of a few hundred tokens, so a step at the 135M shape takes seconds.
FT_TEXT = ("Once upon a time, there was a happy girl named Mia. She had a purple whale. She loved the purple whale "
           "very much. ") * 12


def write_smol_shape_folder(folder) -> str:
    """A checkpoint at the SmolLM2-135M shape (random N(0, 0.02) weights, as the benchmark's model) with the shipped
    model's tokenizer, written to ``folder``; returns its name (what the Model tab's box takes under its root)."""
    import shutil
    from pathlib import Path

    import torch

    from explorer.state.checkpoints import default_model_dir
    from models.decoder import Decoder
    from models.loading import save_pretrained

    from lens.device import HOST

    from .runs import model_config, settings_for

    folder = Path(folder)
    torch.manual_seed(0)
    save_pretrained(Decoder(model_config(settings_for(False, False, HOST))), folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(default_model_dir() / name, folder / name)
    return folder.name


def finetune_stop_frees_cpu(server, folder_name: str, *, run_s: float = 12.0, watch_s: float = 4.0,
                            timeout: float = 600.0) -> dict[str, Any]:
    """One session loads ``folder_name`` (under the server's model root), starts a LoRA fine-tune on ``FT_TEXT`` and
    presses Stop ``run_s`` seconds after its first step was shown (Gradio's /cancel, as the button sends it): the
    server's CPU seconds in each quarter second from then on and when they fell below a tenth of a core
    (``cancel_and_watch``); then the Stop button's own request (``lora_stop``) and what it says. Also how long a
    step took (between two steps shown)."""
    import httpx

    from .page_client import run_events

    plan = fetch_plan(server.url)
    session = f"ftstop-{uuid.uuid4().hex[:8]}"
    load, ft, stop = plan.fn_of("load_model"), plan.fn_of("lora_finetune"), plan.fn_of("lora_stop")
    with httpx.Client(timeout=60) as http:
        loaded = run_events(http, server.url, session, plan, [load], {load: [folder_name, None]},
                            time.monotonic() + timeout, follow=False)
        if load not in loaded.done:
            raise RuntimeError(f"loading {folder_name} failed: {loaded.refused + loaded.failed}")
        idle = cores_in_use(server)
        values = [8, 16, ["q_proj", "v_proj"], FT_TEXT, 200, None, 60, None]
        r = http.post(server.url + API + "queue/join", json={"data": values, "fn_index": ft, "session_hash": session,
                                                            "event_data": None, "trigger_id": None})
        event_id = r.json()["event_id"]
        t0, stepped, ended = time.monotonic(), threading.Event(), threading.Event()
        stepping: list[tuple[int, float]] = []  # (step, seconds since the join) as each step was shown

        def read() -> None:  # the stream stays open, as a browser's does: Gradio ends an event whose reader left
            with httpx.Client(timeout=timeout) as reader, reader.stream(
                    "GET", server.url + API + "queue/data", params={"session_hash": session}) as stream:
                for line in stream.iter_lines():
                    found = re.search(r"Step (\d+)/", line)
                    if found:
                        stepping.append((int(found.group(1)), time.monotonic() - t0))
                        stepped.set()
                    if '"msg":"process_completed"' in line[:300] or '"msg":"close_stream"' in line[:300]:
                        break
            ended.set()

        threading.Thread(target=read, daemon=True).start()
        while not stepped.wait(0.5):
            if ended.is_set() or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the fine-tune showed no step: {server.log_tail()}")
        time.sleep(run_s)
        busy_rate = cores_in_use(server, 0.5)
        watched = cancel_and_watch(server, http, session, ft, event_id, watch_s, idle)
        said = run_events(http, server.url, session, plan, [stop], {stop: [None]}, time.monotonic() + 60,
                          follow=False, keep_outputs=True)
    status = (said.outputs.get(stop) or [None])[0]
    shown = stepping[:]
    step_s = sorted(b[1] - a[1] for a, b in zip(shown, shown[1:]) if b[0] == a[0] + 1)
    return {"model": folder_name, "first_step_seconds": shown[0][1], "steps_shown": len(shown),
            "step_seconds_median": step_s[len(step_s) // 2] if step_s else None, "cores_busy_before_stop": busy_rate,
            **watched,
            "stop_status": status if isinstance(status, str) else None}


def bench_finetune_stop(log=print) -> dict[str, Any]:
    """The fine-tune Stop row: a LoRA fine-tune of a SmolLM2-135M-shape model in ``python app.py``, stopped during
    its training (``finetune_stop_frees_cpu``)."""
    import tempfile
    from pathlib import Path

    from .server import served_app

    with tempfile.TemporaryDirectory() as root:
        name = write_smol_shape_folder(Path(root) / "smol-shape")
        with served_app({"EXPLORER_MODEL_ROOT": root}) as server:
            out = finetune_stop_frees_cpu(server, name)
    log(f"robust: CPU settled {out['settled_after']} s after a 135M-shape fine-tune's Stop ({out['stop_status']})")
    return out


def bench_robust(log=print) -> dict[str, Any]:
    """The benchmark's robustness rows (issue 31), each on a fresh ``python app.py``: the queue after more new
    sessions than Gradio's books hold, a victim beside 300 rotating session ids from one forwarded address, a
    generation beside 20 queued fine-tunes and a sweep, CPU after Stop, and resident memory after 600
    throw-away sessions."""
    from .server import served_app

    out: dict[str, Any] = {}
    with served_app(NO_CLIENT_CAPS) as server:
        out["queue"] = queue_outlives_flood(server.url)
    log(f"robust: queue after {out['queue']['flood']['joins']} new-session joins: "
        f"{out['queue']['flood']['queue_stopped']} 'queue stopped', answer {out['queue']['answer_seconds']}")
    with served_app({"EXPLORER_PROXY_HOPS": "1"}) as server:
        out["rotation"] = victim_beside_rotation(server.url)
        log(f"robust: beside 300 rotating ids, another address {out['rotation']['victim_seconds']} s, a classmate "
            f"behind the same address {out['rotation']['classmate_seconds']} s")
        out["long_floods"] = class_beside_long_floods(server.url)
        log(f"robust: a class of 40 beside 4 x 300 long jobs: {out['long_floods']['class_answered']} answered, "
            f"p95 {out['long_floods']['class_p95']} s")
        out["lanes"] = generation_beside_finetunes(server.url)
        log(f"robust: generation beside 20 fine-tunes: first token {out['lanes']['generation_first_seconds']}")
    with served_app() as server:
        out["stop"] = stop_frees_cpu(server)
        log(f"robust: CPU settled {out['stop']['settled_after']} s after Stop")
    out["finetune_stop"] = bench_finetune_stop(log=log)
    with served_app(NO_CLIENT_CAPS) as server:
        fetch_plan(server.url)
        out["memory"] = memory_after_throwaway(server, log=log)
        log(f"robust: RSS {out['memory']['rss_settled_above_start'] / 2**20:.0f} MiB above start, 2 min after")
    return out
