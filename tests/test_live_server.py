"""Train one live on the served app: while the server trains, another visitor's attention question is answered
within 5 s (the run holds one thread), Stop ends the run, and live@final then loads from the header's loader."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the network

import time

import pytest

from explorer.jobs import live_training
from tests.loopback import loopback_client

CAUSAL = "causal (as trained)"
PROMPT = "The cat sat on the mat. The cat sat on the mat."


@pytest.mark.slow
def test_a_live_run_leaves_other_visitors_answered_and_ends_loadable(app_url):
    trainer = loopback_client(app_url)
    stream = trainer.submit(60, 0, api_name="/training_live")
    deadline = time.time() + 60
    while time.time() < deadline and not any("Training: step" in str(o[-1]) for o in stream.outputs()):
        time.sleep(0.2)
    assert any("Training: step" in str(o[-1]) for o in stream.outputs()), stream.outputs()[-1:]
    run = live_training.current()
    assert run is not None
    while time.time() < deadline and live_training.records(run)[-1]["step"] == 0:  # past the first record: stepping
        time.sleep(0.1)
    assert live_training.records(run)[-1]["step"] > 0 and not run.finished.is_set()

    other = loopback_client(app_url)
    started = time.time()
    other.predict(PROMPT, 0, 0, CAUSAL, api_name="/attention")
    took = time.time() - started
    print(f"attention answered in {took:.2f} s while the live run trained (step {live_training.records(run)[-1]['step']})")
    assert not run.finished.is_set(), "the run ended before the question was answered: nothing was measured"
    assert took < 5.0, f"an attention question took {took:.1f} s while the live run trained"

    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="Only the page that started this live run can stop it"):
        other.predict(api_name="/training_live_stop")  # a watcher cannot end the lecturer's run
    assert not run.finished.is_set()
    said = trainer.predict(api_name="/training_live_stop")  # the page that started it can
    assert "Ended (stopped)" in said and "live@final" in said
    final = stream.result(timeout=30)
    assert "live@final" in final[-1]
    status = other.predict("live@final", api_name="/load_model")[0]
    assert "Loaded **live@final**" in status
