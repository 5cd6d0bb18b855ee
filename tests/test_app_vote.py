"""Ask the class through gradio_client: one page asks, 40 sessions vote at once (some change their vote), the
tally is exact; a voter's page cannot reveal or close; bad, unknown and expired codes get sentences; the caps
hold; the reveal's values equal transformers' softmax (next token) and eager attention weights (a head)."""
from __future__ import annotations

import html
import threading

import numpy as np
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError

from explorer.state import rooms as room_store
from tests.plotly_payload import arr, fig

PROMPT = "Tom gave the red ball to Anna. Anna gave the red ball to"


def ask(client: Client, tab: str = "walkthrough", *values):
    values = values or (PROMPT,)
    out = client.predict(*values, "", "http://127.0.0.1:7860/", api_name=f"/ask_class_{tab}")
    qr, link, code_md, plot, counts, timer, reach = out
    assert qr.startswith('<img src="data:image/png;base64,') and qr.count("<") == 1
    code = link.rsplit("?join=", 1)[1]
    assert link == f"http://127.0.0.1:7860/?join={code}" and code_md["value"] == code
    assert "Phones cannot open this link" in reach["value"]  # the test server listens on loopback only
    return code, counts, fig(plot)


def bars(figure: dict, i: int) -> tuple[list[str], np.ndarray]:
    trace = figure["data"][i]
    return [html.unescape(y[3:]) for y in trace["y"]], arr(trace["x"])


@pytest.mark.slow
def test_forty_sessions_vote_at_once_and_the_tally_is_exact(app_url):
    teacher = Client(app_url, verbose=False)
    code, counts, figure = ask(teacher)
    choices, shares = bars(figure, 0)
    assert 2 <= len(choices) <= 6 and not shares.any() and "0 votes" in counts
    voters = [None] * 40
    made = threading.Barrier(40)
    errors: list[str] = []
    final = [None] * 40

    def vote(i: int) -> None:
        try:
            # forty clients fetch the app's config and API at once: a slow shared machine takes longer than
            # httpx's 5 s default, and this test checks the tally, not the time (the benchmark's vote row does)
            voters[i] = v = Client(app_url, verbose=False, httpx_kwargs={"timeout": 120})
            question, status, _ = v.predict(code.lower(), api_name="/class_join")
            assert question.startswith("Which token") and "Tap your answer" in status
            made.wait(timeout=120)
            choice = i % len(choices)
            v.predict(api_name=f"/class_vote_{choice}")
            if i % 4 == 0:  # a quarter change their mind
                choice = (choice + 1) % len(choices)
                v.predict(api_name=f"/class_vote_{choice}")
            final[i] = choice
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(repr(exc))

    threads = [threading.Thread(target=vote, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[:3]
    expected = np.bincount(final, minlength=len(choices))
    plot, text, _ = teacher.predict(api_name="/class_tally_walkthrough")
    labels, shares = bars(fig(plot), 0)
    assert labels == choices and "**40 votes**" in text
    assert np.allclose(shares, 100 * expected / 40)
    assert [int(t.split(" ")[0]) for t in fig(plot)["data"][0]["text"]] == expected.tolist()

    # a voter's page holds no room: it can neither reveal nor close, nor read the tally
    for api in ("/class_reveal_walkthrough", "/class_close_walkthrough"):
        with pytest.raises(AppError, match="No question is open on this page"):
            voters[0].predict(api_name=api)
    plot, text, _ = teacher.predict(api_name="/class_reveal_walkthrough")
    assert "of you chose" in text and "the model gave it" in text
    with pytest.raises(AppError, match="revealed: votes are closed"):
        voters[1].predict(api_name="/class_vote_0")
    teacher.predict(api_name="/class_close_walkthrough")
    with pytest.raises(AppError, match=f"No open room has the code {code}"):
        Client(app_url, verbose=False).predict(code, api_name="/class_join")


@pytest.mark.slow
def test_reveal_equals_transformers_softmax_and_attention(app_url, served_model_dir):
    from transformers import AutoTokenizer, LlamaForCausalLM

    teacher = Client(app_url, verbose=False)
    tok = AutoTokenizer.from_pretrained(served_model_dir)
    ref = LlamaForCausalLM.from_pretrained(served_model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = ref(ids, output_attentions=True)
    probs = torch.softmax(out.logits[0, -1].double(), dim=-1)

    ask(teacher)
    plot, text, _ = teacher.predict(api_name="/class_reveal_walkthrough")
    labels, model_pct = bars(fig(plot), 1)
    by_label = {}  # every token of the vocabulary (the distractor from the prompt may be an unlikely one), the
    for i in torch.argsort(probs, descending=True).tolist():  # likeliest token first where two read the same
        by_label.setdefault(f"“{tok.decode([i])}”", i)
    for label, pct in zip(labels, model_pct):
        assert label in by_label, (label, list(by_label)[:10])
        assert pct / 100 == pytest.approx(float(probs[by_label[label]]), abs=1e-5)
    assert max(by_label, key=lambda lab: probs[by_label[lab]]) in labels  # the model's top token is a choice
    teacher.predict(api_name="/class_close_walkthrough")

    layer, head = 1, 0
    ask(teacher, "attention", PROMPT, str(layer), str(head))
    plot, text, _ = teacher.predict(api_name="/class_reveal_attention")
    labels, model_pct = bars(fig(plot), 1)
    row = out.attentions[layer][0, head, -1].double()
    for label, pct in zip(labels, model_pct):
        position = int(label.split("·")[0])
        assert pct / 100 == pytest.approx(float(row[position]), abs=1e-5)
    assert int(torch.argmax(row)) in [int(lab.split("·")[0]) for lab in labels]
    teacher.predict(api_name="/class_close_attention")


def test_knockout_question_bins_the_measured_change(app_url):
    teacher = Client(app_url, verbose=False)
    code, counts, figure = ask(teacher, "experiments", PROMPT, ["1.0"], "zero (output set to 0)")
    labels, _ = bars(figure, 0)
    assert labels[0] == "The loss goes down" and len(labels) == 4
    plot, text, _ = teacher.predict(api_name="/class_reveal_experiments")
    _, measured = bars(fig(plot), 1)
    assert sorted(measured.tolist()) == [0, 0, 0, 100] and "Measured:" in text and "Nobody voted" in text
    teacher.predict(api_name="/class_close_experiments")


@pytest.mark.parametrize("typed, message", [("", "Type the room code"), ("ABC", "6 letters and digits"),
                                            ("<b>1O</b>", "without 0, O, 1, I or L"),
                                            ("ZZZZZZ", "No open room has the code ZZZZZZ")])
def test_bad_codes_get_a_sentence(app_url, typed, message):
    with pytest.raises(AppError, match=message):
        Client(app_url, verbose=False).predict(typed, api_name="/class_join")


def test_a_vote_without_a_room_and_an_expired_room_get_sentences(app_url, monkeypatch):
    voter = Client(app_url, verbose=False)
    with pytest.raises(AppError, match="Join a room first"):
        voter.predict(api_name="/class_vote_0")
    teacher = Client(app_url, verbose=False)
    code, _, _ = ask(teacher)
    voter.predict(code, api_name="/class_join")
    store = room_store.rooms
    now = store.clock()
    monkeypatch.setattr(store, "clock", lambda: now + store.minutes * 60 + 1)
    with pytest.raises(AppError, match="room has ended"):
        voter.predict(api_name="/class_vote_0")
    with pytest.raises(AppError, match=f"No open room has the code {code}.*45 minutes"):
        Client(app_url, verbose=False).predict(code, api_name="/class_join")
    with pytest.raises(AppError, match="has ended"):
        teacher.predict(api_name="/class_reveal_walkthrough")


def test_caps_on_rooms_and_votes_hold_through_the_app(app_url, monkeypatch):
    store = room_store.rooms
    monkeypatch.setattr(store, "max_rooms", len(store) + 1)
    monkeypatch.setattr(store, "max_votes", 2)
    monkeypatch.setattr(store, "address_share", 1.0)  # every voter here comes from loopback
    teacher = Client(app_url, verbose=False)
    code, _, _ = ask(teacher)
    with pytest.raises(AppError, match="class rooms, its limit"):
        ask(Client(app_url, verbose=False))
    voters = [Client(app_url, verbose=False) for _ in range(3)]
    for v in voters:
        v.predict(code, api_name="/class_join")
    voters[0].predict(api_name="/class_vote_0")
    voters[1].predict(api_name="/class_vote_1")
    with pytest.raises(AppError, match="2 votes, its limit"):
        voters[2].predict(api_name="/class_vote_0")
    voters[1].predict(api_name="/class_vote_0")  # a counted vote may still change
    _, text, _ = teacher.predict(api_name="/class_tally_walkthrough")
    assert "**2 votes**" in text
    teacher.predict(api_name="/class_close_walkthrough")


@pytest.mark.slow
def test_the_benchmark_class_counts_every_vote(app_url):
    """explorer.bench.vote's clients (raw queue routes, as a browser sends them) against the app: every vote
    counted and shown; the timings are the benchmark's to judge, not this test's."""
    from explorer.bench.vote import class_vote

    r = class_vote(app_url, 8, timeout=120)
    assert not r["failed"], r["failed"]
    assert r["counted"] == r["shown"] == r["final_tally"] == 8 and r["exact"]
    assert r["attention_requests_meanwhile"] >= 1
