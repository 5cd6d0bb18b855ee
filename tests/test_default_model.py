"""The shipped default model (assets/default-model), measured on its shipped weights, offline."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import json

import pytest
import torch

from explorer.finetune import evaluate_loss
from lens.heads import induction_score, previous_token_score, repeated_random_tokens
from explorer.probes import run_with_cache
from models import generate, load_pretrained
from training.corpus import corpus_vocabulary, words_of
from training.data import story_rows, unigram_entropy
from training.evaluate import PROBE_SPANS, best, probe_scores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(ROOT, "assets", "default-model")
PROMPT = "Once upon a time, there was a kind girl named Lily. She had a small red ball."


@pytest.fixture(scope="module")
def ours():
    return load_pretrained(FOLDER)


@pytest.fixture(scope="module")
def hf():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(FOLDER, dtype=torch.float32,
                                            attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FOLDER)


def test_folder_holds_the_shipped_files():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "README.md"):
        assert os.path.isfile(os.path.join(FOLDER, name)), name
    assert os.path.getsize(os.path.join(FOLDER, "model.safetensors")) <= 20 * 1024 * 1024


def test_architecture_is_the_one_the_card_promises(ours):
    c = ours.config
    assert c.n_layers >= 4
    assert c.n_kv_heads < c.n_heads
    assert c.tie_embeddings
    with open(os.path.join(FOLDER, "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["model_type"] == "llama" and cfg["hidden_act"] == "silu"


def test_tokenizer_loads_offline_with_bos_and_word_tokens(tok, ours):
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    assert len(tok) == ours.config.vocab_size
    assert tok.bos_token_id == ours.config.bos_token_id
    assert tok.eos_token_id == ours.config.eos_token_id
    ids = tok(PROMPT).input_ids
    assert ids[0] == tok.bos_token_id
    # Every word of a corpus sentence is one token, and a single token decodes to a word.
    assert len(ids) == 1 + len(words_of(PROMPT))
    assert [tok.decode([i]) for i in ids[1:]] == words_of(PROMPT)
    assert tok.decode(ids, skip_special_tokens=True) == PROMPT


def test_the_apps_tokenizer_is_autotokenizers_own(tok):
    """models.loading.load_tokenizer skips AutoTokenizer for a plain fast tokenizer (start-up time): the same class,
    vocabulary, special tokens, ids and decodings as AutoTokenizer's, on texts with unknown words, digits, spaces
    and special tokens written out."""
    from models.loading import _plain_fast_tokenizer, load_tokenizer
    from pathlib import Path

    assert _plain_fast_tokenizer(Path(FOLDER))  # the path under test is the one taken
    ours = load_tokenizer(FOLDER)
    assert type(ours) is type(tok)
    assert ours.get_vocab() == tok.get_vocab() and len(ours) == len(tok)
    assert ours.all_special_tokens == tok.all_special_tokens and ours.all_special_ids == tok.all_special_ids
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id, ours.mask_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id, tok.mask_token_id)
    assert ours.model_max_length == tok.model_max_length and ours.padding_side == tok.padding_side
    assert ours.chat_template == tok.chat_template
    texts = [PROMPT, "", " ", "Zyx qwerty 12345 !!", "Tom  gave\nthe ball<mask> to</s> Anna.", "ÄÖü 東京 🙂",
             "Once upon a time " * 20]
    for text in texts:
        for special in (True, False):
            a = ours(text, add_special_tokens=special)["input_ids"]
            assert a == tok(text, add_special_tokens=special)["input_ids"], (text, special)
            assert ours.convert_ids_to_tokens(a) == tok.convert_ids_to_tokens(a)
            assert ours.decode(a) == tok.decode(a)
    batch = dict(return_tensors="pt", padding=True)
    assert torch.equal(ours(texts[:4], **batch)["input_ids"], tok(texts[:4], **batch)["input_ids"])


def test_same_logits_in_transformers_and_in_our_decoder(ours, hf, tok):
    ids = tok([PROMPT, "Mom asked Tom to buy eggs, milk and jam. Tom went to the shop."],
              return_tensors="pt", padding=True).input_ids[:1]
    probe = repeated_random_tokens(ours.config.vocab_size, 40, 2, seed=1, bos_id=tok.bos_token_id)
    for x in (ids, probe):
        with torch.no_grad():
            a = ours(x)
            b = hf(x).logits
        scale = b.abs().max()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(scale))


def test_held_out_loss_well_under_the_unigram_baseline(ours):
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(os.path.join(FOLDER, "tokenizer.json"))
    # Stories from a seed no training run reads (training uses seed 0, held out seed 0 + offset).
    rows = story_rows(t, seed=424242, n_rows=16, seq_len=ours.config.max_seq_len)
    loss = evaluate_loss(ours, rows)
    baseline = unigram_entropy(rows[:, 1:], ours.config.vocab_size)
    print(f"held-out loss {loss:.3f} nats/token, unigram baseline {baseline:.3f}")
    assert loss < 0.5 * baseline, (loss, baseline)
    assert loss <= 1.20, loss


def test_held_out_loss_meets_the_issue_target(ours):
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(os.path.join(FOLDER, "tokenizer.json"))
    rows = story_rows(t, seed=424242, n_rows=16, seq_len=ours.config.max_seq_len)
    assert evaluate_loss(ours, rows) <= 1.10


def _patterns_hf(hf, x):
    with torch.no_grad():
        out = hf(x, output_attentions=True)
    return torch.stack(out.attentions)            # (L, B, H, T, T)


def test_head_scores_previous_token_and_induction(ours, hf, tok):
    span = 32
    x = repeated_random_tokens(ours.config.vocab_size, span, 8, seed=123, bos_id=tok.bos_token_id)
    _, cache = run_with_cache(ours, x, lambda n: n.endswith("attn.hook_pattern"))
    pat = cache.stack("attn.hook_pattern")          # (L, B, H, T, T)
    # The hook pattern is the same as transformers' eager attention weights.
    ref = _patterns_hf(hf, x)
    torch.testing.assert_close(pat, ref, rtol=1e-4, atol=1e-5)
    prev = previous_token_score(ref)                # (L, H)
    ind = induction_score(ref, span)
    assert prev.max() >= 0.7, prev
    assert ind.max() >= 0.7, ind


def test_previous_token_head_meets_the_issue_target(hf, tok):
    x = repeated_random_tokens(hf.config.vocab_size, 32, 8, seed=123, bos_id=tok.bos_token_id)
    assert previous_token_score(_patterns_hf(hf, x)).max() >= 0.8


@pytest.mark.parametrize("span", PROBE_SPANS)
def test_induction_works_at_every_distance(hf, tok, span):
    # <s> + r + r, 8 rows, a seed training never used to choose its checkpoint; scored on
    # transformers' own attention weights.
    x = repeated_random_tokens(hf.config.vocab_size, span, 8, seed=123, bos_id=tok.bos_token_id)
    ind = induction_score(_patterns_hf(hf, x), span)
    print(f"span {span}: best induction head {float(ind.max()):.3f}")
    assert ind.max() >= 0.7, (span, ind)
    # ...and the model uses it: the second copy is predicted far better than the first.
    with torch.no_grad():
        logits = hf(x).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten(),
                                             reduction="none").view(8, -1)
    first, second = loss[:, :span - 1].mean(), loss[:, span + 1:].mean()
    assert second < 0.25 * first, (span, float(first), float(second))


def test_logged_scores_are_the_shipped_weights_and_the_card_says_them(ours):
    with open(os.path.join(FOLDER, "training_log.json")) as fh:
        log = json.load(fh)
    picked = log["picked"]
    now = probe_scores(ours, [int(k) for k in picked["induction"]], seed=log["probe_seed"])
    for span, scores in picked["induction"].items():
        torch.testing.assert_close(torch.tensor(now["induction"][span]), torch.tensor(scores),
                                   atol=1e-4, rtol=0)
    assert list(picked["induction"]) == [str(s) for s in PROBE_SPANS]
    with open(os.path.join(FOLDER, "README.md")) as fh:
        card = fh.read()
    for span, scores in picked["induction"].items():
        assert f"span {span}: **{best(scores)[0]:.3f}**" in card
    assert f"{picked['held_out_loss']:.3f} nats/token" in card
    assert f"{log['train_minutes']:.1f} minutes" in card and log["machine"]["cpu"] in card
    assert "sunday" not in card


def test_greedy_story_continuation_is_made_of_corpus_words(ours, tok):
    vocab = corpus_vocabulary()
    ids = torch.tensor([tok(PROMPT).input_ids])
    out = generate(ours, ids, 60, temperature=0.0)[0, ids.shape[1]:].tolist()
    if tok.eos_token_id in out:
        out = out[:out.index(tok.eos_token_id)]
    text = tok.decode(out, skip_special_tokens=True)
    words = words_of(text)
    assert len(words) >= 10, text
    assert all(w in vocab for w in words), [w for w in words if w not in vocab]
    # Whole sentences: capitalised after a period, and the text before the cut ends one.
    assert "." in words
    sentences = [s.strip() for s in text.split(".")[:-1] if s.strip()]
    assert sentences and all(s[0].isupper() for s in sentences), text
