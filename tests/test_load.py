"""Many users at once, on loopback only.

In-process (the shared ``app_url``): 32 gradio_client clients, each its own session, send requests across the
tabs at the same moment. Every one is answered, each answer equals the one the same request gets when it runs
alone, and the server still answers afterwards. Bounded: 180 s for the whole test. Three clients at once (a
memory sweep, a generation, an attention question): the attention answer does not wait for the measurements.

``python app.py`` in its own process (explorer/bench/load.py, the client the benchmark uses too), with the
idle time and the private-model budget lowered through the environment: 64 sessions open the page at once
(every page-load event, then one attention question each): all answered, none refused, and the server's
memory comes back once they have left; then many throw-away sessions that each cost memory: the server's
memory stays bounded and another visitor's fine-tuned model survives, or its owner is told.

Only the parts of an answer that do not depend on timing are compared (figure data, token tables, counts);
measured seconds and bytes differ from run to run by nature. Latencies are printed, never asserted, except
where the order of events is the behaviour under test (an answer that comes while a sweep still runs).
"""
from __future__ import annotations

import json
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor, wait

import pytest

from explorer.bench import load as room
from explorer.bench import page_client, server as app_server

pytestmark = pytest.mark.slow  # minutes: dozens of clients, and a server process of its own

CLIENTS = 32
OVERALL_SECONDS = 180
CAUSAL = "causal (as trained)"


def _fig(payload):
    assert payload["type"] == "plotly"
    return json.loads(payload["plot"])


def _figs(*payloads):
    return [_fig(p) for p in payloads]


# (api_name, args, the deterministic part of the answer)
REQUESTS = [
    ("/attention", ("Tom gave the red ball to Anna.", 0, 1, CAUSAL), lambda o: (_figs(o[0], o[3], o[4]), o[1])),
    ("/attention", ("The cat sat on the mat. The dog sat on the log.", 1, 0, "bidirectional (mask removed)"),
     lambda o: (_figs(o[0], o[3], o[4]), o[1])),
    ("/rope", ("Tom gave the red ball to Anna.", 500.0, 7, [0, 1, 3], 1, 1, ), lambda o: _figs(*o[:4])),
    ("/generate", ("Once upon a time", 6, 0.8, 20, 0.9, 3),
     lambda o: (o[0], [row[:6] for row in o[6]["data"]])),
    ("/generate", ("🐳 The whale 中文", 5, 0.0, None, 1.0, 0), lambda o: (o[0], [row[:6] for row in o[6]["data"]])),
    ("/encoder_decoder", ("The little dog found a red ball.", 1, 2, -1), lambda o: _figs(*o[:4])),
    ("/memory_compare", (128, 2, 16, 1, ["naive", "sdpa", "tiled"], True, "float32"),
     lambda o: [[row[0], row[1], row[3]] for row in o[2]["data"]]),
    ("/lora", (4, 8, ["q_proj", "v_proj"]), lambda o: (_fig(o[0]), o[1], o[2])),
    ("/lora_compare", ("Tom has a red", 1, 0, 6), lambda o: (_fig(o[0]), o[1], o[2])),
]


def _first_difference(a, b, path="answer"):
    """Where two answers first differ (for the failure message)."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}[{k!r}]")
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for k, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{k}]")
    if isinstance(a, str) and path.endswith("['bdata']"):
        import base64

        import numpy as np

        x, y = (np.frombuffer(base64.b64decode(v), dtype=np.float64) for v in (a, b))
        if x.shape == y.shape:
            return f"{path}: max |difference| {np.abs(x - y).max():.3g}"
    return f"{path}: {str(a)[:300]} vs {str(b)[:300]}"


def _clear_memos():
    """Forget the shared results (per-prompt forwards, opening examples), so both phases compute afresh."""
    from explorer.state.cache import results

    results.clear()


def test_32_clients_at_once_get_the_answers_they_get_alone(app_url, monkeypatch):
    from tests.loopback import loopback_client

    from explorer.web import serving

    # every client here is 127.0.0.1: the per-address cap of long jobs (4) would refuse what this test compares
    monkeypatch.setattr(serving, "CLIENT_LONG_CAP", 1000)

    deadline = time.monotonic() + OVERALL_SECONDS
    alone_client = loopback_client(app_url)
    alone = []
    for api, args, key in REQUESTS:
        alone.append(key(alone_client.predict(*args, api_name=api)))
    _clear_memos()

    def one(i: int):
        api, args, key = REQUESTS[i % len(REQUESTS)]
        # its own session; the page info may wait behind the 31 others' work on 2 busy cores (httpx waits 5 s)
        c = loopback_client(app_url, httpx_kwargs={"timeout": 60})
        job = c.submit(*args, api_name=api)
        return i, key(job.result(timeout=max(1.0, deadline - time.monotonic())))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        futures = [pool.submit(one, i) for i in range(CLIENTS)]
        done, pending = wait(futures, timeout=max(1.0, deadline - time.monotonic()))
        assert not pending, f"{len(pending)} of {CLIENTS} clients got no answer within {OVERALL_SECONDS} s"
        answers = dict(f.result() for f in futures)  # re-raises a client's error, if any
    wall = time.perf_counter() - t0
    print(f"\n{CLIENTS} concurrent clients across {len({r[0] for r in REQUESTS})} endpoints answered in {wall:.1f} s")

    for i in range(CLIENTS):
        j = i % len(REQUESTS)
        assert answers[i] == alone[j], \
            f"client {i} ({REQUESTS[j][0]}) got a different answer than alone: {_first_difference(answers[i], alone[j])}"

    # still alive: the page config and a fresh request answer
    with urllib.request.urlopen(app_url + "config", timeout=10) as r:
        assert r.status == 200
    api, args, key = REQUESTS[0]
    assert key(loopback_client(app_url).predict(*args, api_name=api)) == alone[0]
    assert time.monotonic() < deadline


def test_requests_queued_behind_a_sweep_are_all_answered(app_url):
    """A memory sweep, a second one from another page, and quick requests from the first page while they run:
    none dropped. (One page holds one long job at a time, issue 31: its second is refused, so each sweep has its own
    page.)"""
    from tests.loopback import loopback_client

    c, other = loopback_client(app_url), loopback_client(app_url)
    jobs = [page.submit(256, 2, 16, 2, ["naive", "sdpa"], True, "float32", api_name="/memory_compare")
            for page in (c, other)]
    jobs += [c.submit(4, 8, ["q_proj"], api_name="/lora") for _ in range(3)]
    results = [job.result(timeout=120) for job in jobs]
    assert all(len(r) == 3 for r in results)
    assert [row[:2] for row in results[0][2]["data"]] == [[128, "naive"], [128, "sdpa"], [256, "naive"], [256, "sdpa"]]


def test_attention_is_answered_while_a_sweep_and_a_generation_run(app_url):
    """Three clients: a memory sweep of seconds, a generation, then an attention question on a new prompt. The
    attention answer comes while the sweep is still measuring (no lock it holds is one the view needs), and in
    seconds, not after the measurements (the benchmark reports the time against its 1 s target)."""
    three = room.attention_beside_measurements(app_url, timeout=150)
    print(f"\nattention beside a sweep and a generation: {three}")
    assert not three["failed"], three["failed"]
    assert three["attention_seconds"] is not None
    assert three["sweep_still_running"], "the attention answer waited for the sweep"
    assert three["attention_seconds"] < 10, three


# --- python app.py in its own process ---------------------------------------------------------------------

IDLE_MINUTES = 0.1  # a session idle 6 s is forgotten; the sweeper looks every 1.5 s
MIB = 2**20


@pytest.fixture(scope="module")
def server(served_model_dir, model_root):
    """``python app.py`` on a free loopback port, serving the test model, with the idle time lowered and a small
    budget for visitors' own models (about five copies of the tiny local checkpoint, or one of the default)."""
    from explorer.state.private_models import model_bytes
    from models import load_pretrained

    tiny = model_bytes(load_pretrained(model_root / "tiny-local"))
    default = model_bytes(load_pretrained(served_model_dir))
    env = {"EXPLORER_DEFAULT_MODEL": str(served_model_dir), "EXPLORER_MODEL_ROOT": str(model_root),
           "EXPLORER_SESSION_IDLE_MINUTES": str(IDLE_MINUTES),
           "EXPLORER_PRIVATE_MODELS_BUDGET": str(default + 5 * tiny + tiny // 2), "EXPLORER_THREADS": "1",
           # every client here comes from 127.0.0.1: the whole budget is that one address's share
           "EXPLORER_CLIENT_PRIVATE_SHARE": "1"}
    with app_server.served_app(env) as s:
        yield s


def _settled_rss(server, seconds: float) -> int:
    """The server's RSS once idle sessions have been swept: the lowest of a few readings over ``seconds``."""
    end, low = time.monotonic() + seconds, server.rss_bytes()
    while time.monotonic() < end:
        time.sleep(1.0)
        low = min(low, server.rss_bytes())
    return low


def test_64_sessions_open_the_page_at_once_all_answered_and_memory_comes_back(server):
    """64 sessions open the same link at the same moment (the page, then the events a link sends: its tab's
    link trigger and that tab's view; a page without a link sends none), then each asks the Attention tab one
    of the four prompts the class was given: every event answered, none refused (p50/p95 printed). Once they have
    left and the idle sweep ran, the server's RSS is within 100 MiB of what it was after a warm-up class of
    four (the opening examples and the four prompts' first use in).

    With 64 prompts of their own instead (the benchmark's class), the Python objects are freed the same way
    but about 120 MiB more of native memory stays (measured: 525 -> 693 MiB), one share per new prompt
    shape: that residue is the allocator's and torch's, not the sessions'."""
    warm = room.classroom(server.url, 4, timeout=180, tag="warm-up", own_prompts=False, query=room.CLASS_LINK)
    assert warm["events_per_page"] == 3, warm
    assert warm["pages_ready"] == 4 and not warm["examples"], warm
    before = _settled_rss(server, IDLE_MINUTES * 60 + 6)
    t0 = time.monotonic()
    class_ = room.classroom(server.url, 64, timeout=300, tag="class", own_prompts=False, query=room.CLASS_LINK)
    print(f"\n{room.describe(class_)}")
    assert class_["refused"] == 0 and class_["failed"] == 0, class_["examples"]
    assert class_["pages_ready"] == 64 and class_["attention_answered"] == 64
    peak = server.rss_bytes()
    after = _settled_rss(server, IDLE_MINUTES * 60 + 8)  # every session idle past the limit, then swept
    print(f"server RSS {before / MIB:.0f} MiB before, {peak / MIB:.0f} MiB when the class left, "
          f"{after / MIB:.0f} MiB after the idle sweep ({time.monotonic() - t0:.0f} s in all)")
    assert after - before <= 100 * MIB, f"RSS {before / MIB:.0f} -> {after / MIB:.0f} MiB"


def _call(server, plan, session_hash: str, api_name: str, values: list, timeout: float = 120.0) -> page_client.Outcome:
    import httpx

    fn = plan.fn_of(api_name)
    with httpx.Client(timeout=60) as http:
        return page_client.run_events(http, server.url, session_hash, plan, [fn], {fn: values},
                               time.monotonic() + timeout, follow=False, keep_outputs=True)


def test_throw_away_sessions_keep_memory_bounded_and_a_fine_tuned_model_survives_or_its_owner_is_told(server):
    """Client A fine-tunes its own copy; client B then opens 60 throw-away sessions, each loading the tiny local
    checkpoint (a private model) and tracing the memory lab (the call that once kept 9 MiB per session). RSS
    stays bounded; A's next action shows its adapter or says, in a sentence, that its model was freed."""
    plan = page_client.fetch_plan(server.url)
    alice = f"alice-{uuid.uuid4().hex[:8]}"
    tune = list(plan.values[plan.fn_of("lora_finetune")])
    tune[4], tune[6] = 3, 20  # 3 steps, at most 20 s
    tuned = _call(server, plan, alice, "lora_finetune", tune, timeout=180)
    assert not tuned.failed and not tuned.refused, tuned.failed + tuned.refused
    compare = plan.values[plan.fn_of("lora_compare")]
    first = _call(server, plan, alice, "lora_compare", compare)
    assert not first.failed, first.failed
    start = _settled_rss(server, 3)
    trace = list(plan.values[plan.fn_of("memory_trace")])
    trace[0] = 128  # a longer trace than the opening one: real memory per call
    rss = []
    for i in range(60):
        bob = f"bob-{i}-{uuid.uuid4().hex[:6]}"
        loaded = _call(server, plan, bob, "load_model", ["tiny-local", None])
        traced = _call(server, plan, bob, "memory_trace", trace)
        assert not traced.failed, traced.failed
        assert not loaded.failed or all("visitors' own models" in m for m in loaded.failed), loaded.failed
        if i % 10 == 9:
            rss.append(server.rss_bytes())
    print(f"\nRSS during churn: {start / MIB:.0f} MiB, then " + ", ".join(f"{r / MIB:.0f}" for r in rss) + " MiB")
    assert max(rss) - start <= 150 * MIB  # once: 9 MiB per session, over 500 MiB for 60
    # No growth with the number of sessions once the first ones are swept: 40 more sessions grew RSS by 46-63 MiB
    # on a 2-core Xeon (glibc's heaps filling, flattening after about 90 sessions and falling back once idle);
    # the leak this guards against kept 9 MiB a session, 360 MiB here.
    assert rss[-1] - rss[1] <= 100 * MIB
    again = _call(server, plan, alice, "lora_compare", compare)
    if again.failed:  # freed to make room or idle: said in a sentence, once
        assert any("was freed" in m for m in again.failed), again.failed
    else:
        assert json.dumps(again.outputs, default=str) == json.dumps(first.outputs, default=str)
