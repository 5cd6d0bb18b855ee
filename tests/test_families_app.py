"""Every tab answers, through gradio_client, on a random-weight model of each family at its real shape.

Qwen2.5-0.5B-Instruct, Qwen3-0.6B and Gemma-3-270m as their published config.json files give them
(explorer/data/real_configs.json: layers, heads, head_dim, vocabulary, windows, local layers), built by
transformers' own classes with their random initialisation and written with ``save_pretrained`` (no download),
with the fixture tokenizer beside the weights. ``python app.py`` serves them in its own process, its
visitors' budget raised through ``EXPLORER_PRIVATE_MODELS_BUDGET`` to what the app says the largest needs
(``checkpoints.budget_needed``); each is loaded through the API as the header picker loads it, then each tab's
main endpoint is called and must answer, about the loaded model, without an error (the Weight formats section's
measurement on Gemma only: ``FORMATS_ON``). No timing is asserted:
the Attention tab's time at these shapes is a benchmark row (``python -m explorer.bench.families``).
"""
from __future__ import annotations

import shutil

import pytest

from explorer import measure
from explorer.bench import server as app_server
from explorer.panels.attention import AttentionView
from explorer.panels.positions import RopeView
from explorer.state import checkpoints
from tests.api_answer import named
from tests.conftest import make_tiny_checkpoint

pytestmark = pytest.mark.slow  # minutes: three models of 0.27-0.6 B parameters built, written, loaded and asked

FAMILIES = ["Qwen2.5-0.5B-Instruct", "Qwen3-0.6B", "Gemma-3-270m"]
PROMPT = "The cat sat on the mat. The dog sat on the log."
CAUSAL = "causal (as trained)"
# The Weight formats section measures three formats and transformers (about 5 minutes at this shape on 2 shared
# cores): on Gemma only, the family whose bf16 and int8 copies carry the most switches (sandwich norms, GeGLU,
# QK-norm, the (1 + w) norms, local layers).
FORMATS_ON = "Gemma-3-270m"


@pytest.fixture(scope="module")
def family_root(tmp_path_factory):
    """The allowed model root of the family server, holding the fixture tokenizer's folder."""
    root = tmp_path_factory.mktemp("family-root")
    make_tiny_checkpoint(root / "tokenizer-source")
    return root


@pytest.fixture(scope="module")
def family_server(family_root, served_model_dir):
    budget = max(checkpoints.budget_needed(measure.real_config(name)) for name in FAMILIES)
    env = {"EXPLORER_DEFAULT_MODEL": str(served_model_dir), "EXPLORER_MODEL_ROOT": str(family_root),
           "EXPLORER_PRIVATE_MODELS_BUDGET": str(budget)}
    with app_server.served_app(env) as server:
        yield server


def write_family(root, name: str):
    """``name``'s published config, random weights from its transformers class, saved under ``root``, with the
    fixture tokenizer (whose ids are a few hundred, all inside the model's vocabulary)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from models import load_pretrained

    tokenizer = root / "tokenizer-source"
    ids = load_pretrained(tokenizer).config
    fields = dict(measure.load_real_configs()[name]["config"])
    config = AutoConfig.for_model(**fields, bos_token_id=ids.bos_token_id, eos_token_id=ids.eos_token_id,
                                  pad_token_id=ids.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder = root / name
    model.save_pretrained(folder)
    del model
    for f in tokenizer.iterdir():
        if f.name not in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(f, folder / f.name)
    return folder


@pytest.mark.parametrize("name", FAMILIES)
def test_every_tab_answers_on_each_family_at_its_real_shape(family_server, family_root, name):
    from tests.loopback import loopback_client

    from models import ModelConfig

    folder = write_family(family_root, name)
    config = measure.real_config(name)
    assert ModelConfig.from_hf(__import__("json").loads((folder / "config.json").read_text())) \
        .differences_from_llama() == config.differences_from_llama()  # transformers wrote the published shape
    c = loopback_client(family_server.url)
    try:
        status, *_ = c.predict(name, api_name="/load_model")  # the handler the header picker's button runs
        assert "Loaded" in status and config.family in status, status
        # Inside the model
        walk = c.predict(PROMPT, 5, config.n_layers - 1, 0, api_name="/walkthrough")
        assert walk
        # Attention: the last layer and head exist, the info names the loaded model, local layers are said
        att = named(AttentionView, c.predict(PROMPT, config.n_layers - 1, config.n_heads - 1, CAUSAL,
                                             api_name="/attention"))
        assert name in att.info
        assert ("is **local**" in att.info or "is **global**" in att.info) == (config.sliding_window is not None)
        assert c.predict(PROMPT, CAUSAL, api_name="/attention_impls")
        # Experiments
        assert c.predict(PROMPT, [f"{config.n_layers - 1}.{config.n_heads - 1}"], "zero (output set to 0)",
                         api_name="/knockout")
        # Training: the shipped model's own run, whatever model this session loaded
        assert c.predict(api_name="/training_step")
        # Positions: this model's head_dim and theta
        rope = named(RopeView, c.predict(PROMPT, config.rope_theta, 5, [0, 1, 2], config.n_layers - 1, 0,
                                         api_name="/rope"))
        assert f"head_dim {config.head_dim} → {config.head_dim // 2} pairs" in rope.md
        # KV cache & generation
        assert c.predict(PROMPT, 8, 0.0, 50, 0.95, 0, False, "the modules", api_name="/generate")
        _, _, kv_md = c.predict("this app's model", 8192, 1, "float16", api_name="/kv_calculator")
        assert f"{config.n_layers} layers" in kv_md
        local = measure.kv_cache_bytes(config)["local_layers"]
        assert (f"{len(local)} of {config.n_layers} layers are local" in kv_md) == bool(local)
        # Memory lab (one attention layer, sized by its sliders)
        assert c.predict(128, 4, 64, 2, ["naive", "sdpa"], True, "float32", api_name="/memory_compare")
        assert c.predict(48, 8, True, 0, api_name="/memory_trace")
        # LoRA & int8
        assert c.predict(8, 16, ["q_proj", "v_proj"], api_name="/lora")
        # layer 0: an API client's Layer menu keeps the default model's choices (a page's menus follow a load)
        assert c.predict(PROMPT, 0, 0, 4, api_name="/lora_compare")
        if name == FORMATS_ON:
            assert c.predict(PROMPT, api_name="/formats")
        # Encoder vs decoder
        assert c.predict(PROMPT, 0, 0, -1, api_name="/encoder_decoder")
        assert c.predict(PROMPT, 3, api_name="/fill_in_blank")
    finally:
        c.predict("default", api_name="/load_model")
        shutil.rmtree(folder, ignore_errors=True)
