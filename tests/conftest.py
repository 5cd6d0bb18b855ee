"""Shared fixtures: offline Hub, the app launched in-process, a gradio_client for it, a tiny local checkpoint,
one quick training run; the Hypothesis profiles; the markers that follow from a test's fixtures.

The app serves the shipped default model (assets/default-model). When that folder is absent (a fresh
checkout before the model is trained), or with ``EXPLORER_TEST_FIXTURE_MODEL=1``, the app tests serve a tiny
random checkpoint built here instead (a byte-level BPE tokenizer trained on a few sentences, so any text,
emoji included, encodes).

The tiers (markers in pytest.ini): ``python -m pytest -q -m "not slow" tests`` while working, the whole suite
(``python3 -m pytest -q tests``) before a merge and in CI.
"""
from __future__ import annotations

import faulthandler
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Compiled test modules (with pytest's assertion rewriting) and the project's own are kept in __pycache__ (git
# ignores it) even where PYTHONDONTWRITEBYTECODE is set: otherwise every run compiles and rewrites them anew.
sys.dont_write_bytecode = False

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
# The device is chosen the way a deployment chooses it (explorer/device.py reads this once): forced to the CPU
# where torch sees no GPU, so every app test runs the same placing code a GPU deployment runs; "auto" on a GPU
# machine, where tests/test_cuda.py checks the app on CUDA.
os.environ.setdefault("EXPLORER_DEVICE", "auto" if torch.cuda.is_available() else "cpu")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# the app fixture measures the formats view at start-up: a tenth of its timing budgets (its numbers noisier,
# the same code and texts) keeps the fast tier within its time
os.environ.setdefault("EXPLORER_FORMATS_SECONDS_SCALE", "0.1")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (default "ci"); a test's own settings() inherit from it:
#   ci       30 examples per test, derandomized: the same examples on every run, so a red run is reproducible
#   dev      10 examples, derandomized: a third of the time, for a quick look while working
#   explore  300 examples from a fresh seed each run: hunting for new failures (now and then, never in CI)
settings.register_profile("ci", max_examples=30, derandomize=True, deadline=None)
settings.register_profile("dev", max_examples=10, derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=300, derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SHIPPED = ROOT / "assets" / "default-model"
FIXTURE_SENTENCES = [
    "The cat sat on the mat. The dog sat on the log.",
    "Tom gave the red ball to Anna. Anna gave the red ball to Tom.",
    "Once upon a time there was a little girl who liked to play in the garden.",
]


def make_tiny_checkpoint(folder: Path, *, seed: int = 0, n_layers: int = 2, d_model: int = 32, n_heads: int = 4,
                         n_kv_heads: int = 2) -> Path:
    """A random Llama-format checkpoint with a working tokenizer, written to ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from models import Decoder, ModelConfig, save_pretrained

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(FIXTURE_SENTENCES * 4, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    config = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                         n_kv_heads=n_kv_heads, d_ff=64, max_seq_len=128, bos_token_id=bos,
                         eos_token_id=tok.token_to_id("</s>"), pad_token_id=tok.token_to_id("<pad>"))
    torch.manual_seed(seed)
    model = Decoder(config)
    with torch.no_grad():  # larger weights than the 0.02 init, so attention patterns are not uniform
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.3)
    save_pretrained(model, folder)
    fast.save_pretrained(str(folder))
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    """The allowed root for local checkpoints in the app tests, holding ``tiny-local`` (3 layers)."""
    root = tmp_path_factory.mktemp("model-root")
    make_tiny_checkpoint(root / "tiny-local", seed=1, n_layers=3)
    return root


@pytest.fixture(scope="session")
def served_model_dir(tmp_path_factory) -> Path:
    """The folder the app serves as its default model."""
    if SHIPPED.joinpath("config.json").is_file() and os.environ.get("EXPLORER_TEST_FIXTURE_MODEL") != "1":
        return SHIPPED
    return make_tiny_checkpoint(tmp_path_factory.mktemp("default-model"))


@pytest.fixture(scope="session")
def app_demo(served_model_dir, model_root):
    """The whole app as ``app.build_demo()`` makes it, built once for the session (``app_url`` serves it)."""
    os.environ["EXPLORER_DEFAULT_MODEL"] = str(served_model_dir)
    os.environ["EXPLORER_MODEL_ROOT"] = str(model_root)
    import app

    from explorer.web import serving

    demo = app.build_demo()
    _DEMOS.append(demo)
    serving.freeze_start_up()  # as python app.py does once its openings are computed
    return demo


@pytest.fixture(scope="session")
def app_url(app_demo):
    """The whole app, launched in this process on a free port; closed at the end of the session once the work it
    started has ended (``explorer.web.serving.close`` says why that matters at exit)."""
    import app
    from explorer.web import serving

    demo = app_demo
    port = _free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True,
                **app.launch_kwargs())
    yield f"http://127.0.0.1:{port}/"
    running = serving.close(demo)
    if running:
        warnings.warn(f"the app's threads still running after close: {running}", stacklevel=1)


@pytest.fixture(scope="session")
def client(app_url):
    from tests.loopback import loopback_client

    return loopback_client(app_url)


@pytest.fixture()
def fresh_client(app_url):
    """A client with its own session (its own per-user state)."""
    from tests.loopback import loopback_client

    return loopback_client(app_url)


@pytest.fixture(scope="session")
def smol_shape(model_root) -> str:
    """A SmolLM2-135M-shape folder (random weights, the shipped tokenizer) under the app's model root: its id."""
    from explorer.bench.flood import write_smol_shape_folder

    folder = model_root / "smol-shape"
    if not (folder / "config.json").is_file():
        write_smol_shape_folder(folder)
    return folder.name


@pytest.fixture(scope="session")
def quick_folder(tmp_path_factory) -> tuple[Path, str]:
    """``python -m training --quick`` once per session: (its output folder, its stdout). Read it, never change it
    (copy it first): tests/test_train.py and tests/test_encoder_model.py share it."""
    out = tmp_path_factory.mktemp("quick") / "model"
    proc = subprocess.run(
        [sys.executable, "-m", "training", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


# Markers that follow from the fixtures a test uses (directly or through another fixture), set here so that they
# cannot drift: the app over HTTP (in this process, or `python app.py` in tests/test_load.py) and a training run.
FIXTURE_MARKERS = {"app_url": ("server",), "server": ("server",), "quick_folder": ("train", "slow")}


def pytest_collection_finish(session):
    """The test modules and the libraries they import (torch, gradio, transformers: about a million objects) live
    for the whole run: frozen, Python's full collections leave them out (they took 13 s of the fast tier)."""
    import gc

    gc.collect()
    gc.freeze()
    # what the tests leave behind (some 400,000 objects by the end) was walked in full 57 times; a tenth as often
    gc.set_threshold(700, 10, 100)


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture in FIXTURE_MARKERS.keys() & set(getattr(item, "fixturenames", ())):
            for marker in FIXTURE_MARKERS[fixture]:
                item.add_marker(marker)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine two threads spin against each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


#: A fast test still running after this many seconds has every thread's stack written down (it goes on running)
#: and shown at the end of the run: a rare ~100 s stall of a served request in the fast tier is to be caught in the act.
STALL_SECONDS = 60
_STALLS: list[tuple[str, str]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if item.get_closest_marker("slow") is not None:
        yield
        return
    queue_then: list[str] = []
    timer = threading.Timer(STALL_SECONDS, lambda: queue_then.append(queue_state()))
    timer.daemon = True
    with tempfile.TemporaryFile("w+") as dump:
        faulthandler.dump_traceback_later(STALL_SECONDS, file=dump)
        timer.start()
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            timer.cancel()
            dump.seek(0)
            stacks = dump.read()
    if stacks:
        _STALLS.append((item.nodeid, "".join(queue_then) + stacks))


#: The apps this test process built (``app_demo``): a stall report shows their queues.
_DEMOS: list = []


def queue_state() -> str:
    """What each app's Gradio queue holds now: its lines by concurrency id (waiting, running, limit) and the
    sessions with events pending (the stalled request's server side; the stacks show only idle threads)."""
    from explorer.web import gradio_adapter

    lines = []
    for demo in _DEMOS:
        try:
            queue = gradio_adapter.queue_of(demo)
        except RuntimeError:  # not served yet: no queue
            continue
        for cid, line in list(getattr(queue, "event_queue_per_concurrency_id", {}).items()):
            now = time.monotonic()
            waiting = [(getattr(getattr(e, "fn", None), "api_name", "?"), str(e.session_hash)[:8],
                        round(now - getattr(e, "enqueue_time", now), 1)) for e in list(line.queue)]
            lines.append(f"queue line {cid}: running {getattr(line, 'current_concurrency', '?')} of "
                         f"{getattr(line, 'concurrency_limit', '?')}, waiting {waiting}")
        pending = {k[:8]: len(v) for k, v in list(getattr(queue, "pending_event_ids_session", {}).items())}
        lines.append(f"events known {len(getattr(queue, 'event_ids_to_events', {}))}, pending by session {pending}")
    return "\n".join(["queue state then:", *lines, ""]) + "\n"


def pytest_terminal_summary(terminalreporter):
    for nodeid, stacks in _STALLS:
        terminalreporter.write_sep("=", f"{nodeid} ran past {STALL_SECONDS} s: every thread then")
        terminalreporter.write_line(stacks[-20000:])
