"""Many users at once, on loopback only: 32 gradio_client clients, each its own session, send requests across
the tabs at the same moment. Every one is answered, each answer equals the one the same request gets when it
runs alone, and the server still answers afterwards. Bounded: 180 s for the whole test.

Only the parts of an answer that do not depend on timing are compared (figure data, token tables, counts);
measured seconds and bytes differ from run to run by nature.
"""
from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait

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
    from explorer.cache import results

    results.clear()


def test_32_clients_at_once_get_the_answers_they_get_alone(app_url):
    from gradio_client import Client

    deadline = time.monotonic() + OVERALL_SECONDS
    alone_client = Client(app_url, verbose=False)
    alone = []
    for api, args, key in REQUESTS:
        alone.append(key(alone_client.predict(*args, api_name=api)))
    _clear_memos()

    def one(i: int):
        api, args, key = REQUESTS[i % len(REQUESTS)]
        c = Client(app_url, verbose=False)  # its own session
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
    assert key(Client(app_url, verbose=False).predict(*args, api_name=api)) == alone[0]
    assert time.monotonic() < deadline


def test_requests_queued_behind_a_sweep_are_all_answered(app_url):
    """A memory sweep, then more sweeps and quick requests from the same client while it runs: none dropped."""
    from gradio_client import Client

    c = Client(app_url, verbose=False)
    jobs = [c.submit(256, 2, 16, 2, ["naive", "sdpa"], True, "float32", api_name="/memory_compare") for _ in range(2)]
    jobs += [c.submit(4, 8, ["q_proj"], api_name="/lora") for _ in range(3)]
    results = [job.result(timeout=120) for job in jobs]
    assert all(len(r) == 3 for r in results)
    assert [row[:2] for row in results[0][2]["data"]] == [[128, "naive"], [128, "sdpa"], [256, "naive"], [256, "sdpa"]]
