"""Handlers that count against a client address's share read it from the request Gradio passes them
(``explorer.web.clients.with_client``): no patch of Gradio's processing."""
from __future__ import annotations

import asyncio
import threading

import gradio as gr

from explorer.state import clients as state_clients
from explorer.web.clients import with_client


def _whose(text, progress=gr.Progress()):
    return f"{text} from {state_clients.current()}"


def _steps(n):
    for i in range(n):
        yield f"{i} from {state_clients.current()}"


def _request(host: str) -> gr.Request:
    return gr.Request(headers={}, client={"host": host})


def test_gradio_passes_the_request_and_the_handler_sees_its_address():
    with gr.Blocks() as demo:
        box = gr.Textbox()
        gr.Button().click(with_client(_whose), [box], [box], api_name="whose")
    fn = next(f for f in demo.fns.values() if f.api_name == "whose")
    answer = asyncio.run(demo.process_api(fn, ["hello"], state=None, request=_request("203.0.113.9")))
    assert answer["data"] == ["hello from 203.0.113.9"]
    assert state_clients.current() == "local"  # nothing left set outside the request
    assert "client_request" not in str(demo.get_api_info())  # not a parameter an API client sees


def test_without_a_request_the_handler_runs_as_local_and_one_wrapper_serves_each_function():
    assert with_client(_whose)("hi") == "hi from local"
    assert with_client(_whose) is with_client(_whose)  # its listeners share one concurrency group


def test_a_generators_every_step_sees_the_address_whatever_thread_runs_it():
    steps = with_client(_steps)(3, _request("198.51.100.4"))
    seen = []
    for _ in range(3):  # Gradio runs each step of a sync generator in a worker thread
        thread = threading.Thread(target=lambda: seen.append(next(steps)))
        thread.start()
        thread.join()
    assert seen == ["0 from 198.51.100.4", "1 from 198.51.100.4", "2 from 198.51.100.4"]
    assert state_clients.current() == "local"
