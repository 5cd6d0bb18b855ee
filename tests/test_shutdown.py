"""A process that ran the app's work exits with its own status, also when that work was still computing.

CPython ends a daemon thread that is still inside a torch kernel at interpreter exit by unwinding it through C++
that cannot be unwound: the process aborts ("terminate called without an active exception", exit 134) after every
test has passed. Each case runs in a process of its own and exits while the work is mid-kernel.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gradio as gr
import pytest

REPO = Path(__file__).resolve().parent.parent

# Seconds of matrix products, in steps of a fraction of a second each.
KERNELS = """
    import torch

    torch.set_num_threads(1)

    def products(steps, per_step=12):
        a = torch.randn(700, 700)
        for _ in range(steps):
            for _ in range(per_step):
                a = (a @ a).clamp_(-1, 1)
            yield a.sum().item()
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(KERNELS) + textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=240)


def _exited_cleanly(done: subprocess.CompletedProcess) -> None:
    assert "terminate called" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


@pytest.mark.slow  # a fresh Python process
def test_a_stopped_measurement_ends_its_step_before_the_process_exits():
    """Stop closes the sweep while its worker is inside a step; the interpreter exits right after: it waits for
    the step instead of ending the worker inside it."""
    done = _run("""
        from explorer.measure.run import STILL_RUNNING, abandonable

        sweep = abandonable(products(50), poll_s=0.02)
        next(x for x in sweep if x is not STILL_RUNNING)  # one step done: the worker is inside the next
        sweep.close()
        print("stopped")
    """)
    _exited_cleanly(done)
    assert "stopped" in done.stdout


@pytest.mark.slow
def test_close_waits_for_a_handler_still_computing_then_the_process_exits_cleanly():
    """An app served in-process, a request still computing when it is closed: ``serving.close`` returns once the
    handler's thread has finished, and the process exits with status 0."""
    done = _run("""
        import threading

        import gradio as gr
        from tests.loopback import loopback_client

        from explorer.bench.server import free_port
        from explorer.web import serving, sweeper

        started, finished = threading.Event(), threading.Event()

        def work(steps):
            started.set()
            for _ in products(int(steps)):
                pass
            finished.set()
            return "done"

        with gr.Blocks() as demo:
            steps, out = gr.Number(), gr.Textbox()
            gr.Button().click(work, steps, out, api_name="work")
        demo.queue()
        port = free_port()
        demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
        sweeper.start_sweeper(demo)
        loopback_client(f"http://127.0.0.1:{port}/").submit(3, api_name="/work")
        assert started.wait(60), "the handler never started"
        running = serving.close(demo, timeout=120)
        print("running after close:", running, "finished:", finished.is_set())
    """)
    _exited_cleanly(done)
    assert "running after close: [] finished: True" in done.stdout, done.stdout[-2000:]


def test_stop_sweeper_ends_the_thread_without_waiting_out_its_period():
    with gr.Blocks() as demo:
        gr.Markdown("a page")
    from explorer.web import sweeper

    thread = sweeper.start_sweeper(demo)  # its period is a minute (the default idle time's quarter)
    time.sleep(0.2)  # its first sweep (milliseconds) is over: stopped while waiting out the period, the usual case
    t0 = time.monotonic()
    assert sweeper.stop_sweeper(demo, timeout=10)
    assert not thread.is_alive() and time.monotonic() - t0 < 5
    assert sweeper.stop_sweeper(demo)  # once stopped, nothing left to stop
    assert thread not in threading.enumerate()
