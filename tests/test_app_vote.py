"""Ask the class through the app as served: one page asks (gradio_client), 40 phones vote at once through the phone
page's own routes (some change their vote), the tally is exact; a second question from another tab reuses the room
and reaches a joined phone by itself; a voter's page cannot reveal or close; bad, unknown and expired codes get
sentences; the caps hold; the reveal's values equal transformers' softmax (next token) and eager attention
weights (a head)."""
from __future__ import annotations

import csv
import html
import threading
import time

import httpx
import numpy as np
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError

from explorer.state import rooms as room_store
from tests.loopback import loopback_client
from tests.plotly_payload import arr, fig

PROMPT = "Tom gave the red ball to Anna. Anna gave the red ball to"


def ask(client: Client, tab: str = "walkthrough", *values):
    values = values or (PROMPT,)
    out = client.predict(*values, "", "http://127.0.0.1:7860/", api_name=f"/ask_class_{tab}")
    qr, link, code_md, plot, counts, timer, reach = out
    assert qr.startswith('<img src="data:image/png;base64,') and qr.count("<") == 1
    code = link.rsplit("?code=", 1)[1]
    assert link == f"http://127.0.0.1:7860/vote?code={code}" and code_md["value"] == code
    assert "Phones cannot open this link" in reach["value"]  # the test server listens on loopback only
    return code, counts, fig(plot)


def bars(figure: dict, i: int) -> tuple[list[str], np.ndarray]:
    trace = figure["data"][i]
    return [html.unescape(y[3:]) for y in trace["y"]], arr(trace["x"])


def state(app_url, code, voter, **more) -> dict:
    return httpx.get(app_url + "vote/api/state", params={"code": code, "voter": voter, **more}, timeout=60).json()


def cast(app_url, code, qid, choice, voter) -> dict:
    return httpx.post(app_url + "vote/api/vote", json={"code": code, "qid": qid, "choice": choice, "voter": voter},
                      timeout=60).json()


def voter_id(i) -> str:
    return f"phone-{i}-" + "0123456789abcdef"


@pytest.mark.slow
def test_forty_phones_vote_at_once_and_the_tally_is_exact(app_url):
    teacher = loopback_client(app_url)
    code, counts, figure = ask(teacher)
    choices, shares = bars(figure, 0)
    assert 2 <= len(choices) <= 6 and not shares.any() and "0 votes" in counts
    made = threading.Barrier(40)
    errors: list[str] = []
    final = [None] * 40

    def vote(i: int) -> None:
        try:
            s = state(app_url, code.lower(), voter_id(i))
            assert s["text"].startswith("Which token") and s["message"].startswith("Tap your answer")
            made.wait(timeout=120)
            choice = i % len(choices)
            assert cast(app_url, code, s["qid"], choice, voter_id(i))["mine"] == choice
            if i % 4 == 0:  # a quarter change their mind
                choice = (choice + 1) % len(choices)
                assert cast(app_url, code, s["qid"], choice, voter_id(i))["mine"] == choice
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

    # a page that asked nothing holds no room: it can neither reveal nor close, nor read the tally
    other = loopback_client(app_url)
    for api in ("/class_reveal_walkthrough", "/class_close_walkthrough"):
        with pytest.raises(AppError, match="No question is open on this page"):
            other.predict(api_name=api)
    plot, text, _ = teacher.predict(api_name="/class_reveal_walkthrough")
    assert "of you chose" in text and "the model gave it" in text
    closed = cast(app_url, code, state(app_url, code, voter_id(1))["qid"], 0, voter_id(1))
    assert "revealed: votes are closed" in closed["message"] and closed["state"] == "revealed"
    teacher.predict(api_name="/class_close_walkthrough")
    assert state(app_url, code, voter_id(1))["state"] == "ended"


@pytest.mark.slow
def test_a_question_from_another_tab_reuses_the_room_and_reaches_a_joined_phone(app_url):
    teacher = loopback_client(app_url)
    code, _, _ = ask(teacher)
    first = state(app_url, code, voter_id(7))
    cast(app_url, code, first["qid"], 0, voter_id(7))
    got = {}

    def wait() -> None:  # the phone's held poll: no re-join, no reload
        got["answer"] = state(app_url, code, voter_id(7), seen=first["key"], wait="1")

    phone = threading.Thread(target=wait)
    phone.start()
    time.sleep(0.5)
    again, _, _ = ask(teacher, "attention", PROMPT, "1", "0")
    phone.join(timeout=60)
    assert again == code  # the same room: the same code and join link
    assert got["answer"]["qid"] > first["qid"]
    assert got["answer"]["text"].startswith("Layer 1, head 0") and got["answer"]["mine"] is None
    _, text, _ = teacher.predict(api_name="/class_tally_walkthrough")
    assert "asked in another section" in text
    csv_file = teacher.predict(api_name="/class_csv_attention")  # the download button's update
    if isinstance(csv_file, dict):
        csv_file = csv_file.get("value") or csv_file.get("path")
        csv_file = csv_file.get("path") if isinstance(csv_file, dict) else csv_file
    with open(csv_file, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["question"] for r in rows} == {"1", "2"} and rows[0]["question_text"] == first["text"]
    assert [int(r["votes"]) for r in rows if r["question"] == "1"][0] == 1  # the first question's one vote, on A
    teacher.predict(api_name="/class_close_attention")


@pytest.mark.slow
def test_reveal_equals_transformers_softmax_and_attention(app_url, served_model_dir):
    from transformers import AutoTokenizer, LlamaForCausalLM

    teacher = loopback_client(app_url)
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
    teacher = loopback_client(app_url)
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
    answer = state(app_url, typed, voter_id(f"bad{len(typed)}"))
    assert answer["state"] == "error" and message in answer["message"]


def test_an_expired_room_gets_sentences(app_url, monkeypatch):
    teacher = loopback_client(app_url)
    code, _, _ = ask(teacher)
    qid = state(app_url, code, voter_id("late"))["qid"]
    store = room_store.rooms
    now = store.clock()
    monkeypatch.setattr(store, "clock", lambda: now + store.minutes * 60 + 1)
    assert cast(app_url, code, qid, 0, voter_id("late"))["state"] == "ended"  # a phone that joined: "ended"
    answer = state(app_url, code, voter_id("stranger"))
    assert answer["state"] == "ended" and "Thank you" in answer["message"]
    with pytest.raises(AppError, match="has ended"):
        teacher.predict(api_name="/class_reveal_walkthrough")


def test_caps_on_rooms_and_votes_hold_through_the_app(app_url, monkeypatch):
    store = room_store.rooms
    monkeypatch.setattr(store, "max_rooms", len(store) + 1)
    monkeypatch.setattr(store, "max_votes", 2)
    monkeypatch.setattr(store, "address_share", 1.0)  # every voter here comes from loopback
    teacher = loopback_client(app_url)
    code, _, _ = ask(teacher)
    with pytest.raises(AppError, match="class rooms, its limit"):
        ask(loopback_client(app_url))
    qid = state(app_url, code, voter_id("cap0"))["qid"]
    cast(app_url, code, qid, 0, voter_id("cap0"))
    cast(app_url, code, qid, 1, voter_id("cap1"))
    assert "2 votes, its limit" in cast(app_url, code, qid, 0, voter_id("cap2"))["message"]
    assert cast(app_url, code, qid, 0, voter_id("cap1"))["mine"] == 0  # a counted vote may still change
    _, text, _ = teacher.predict(api_name="/class_tally_walkthrough")
    assert "**2 votes**" in text
    teacher.predict(api_name="/class_close_walkthrough")
