"""Jobs: the long work the panels start and watch, kept out of the panels so they only lay out and word things.

    finetune    the LoRA tab's fine-tune: a worker thread per run, a registry the Stop button's request finds it
                in, the model's lock per step, the session's state kept in step with the adapter
    experiments the Experiments tab's sweeps and patching: a worker thread each, a Stop between torch operations,
                a time cap after which they end with what they computed
    generation  the generation tab's stream: one warm-up per model and decode path, then
                ``probes.stream_generation`` under the model's lock, and the fast step's tokens checked against
                the modules at the end

A job knows no Gradio: it takes numbers and ids already checked, yields plain records, and raises ``ValueError``
with a sentence where a person can change something; the panel turns records into figures and texts.
Floor: models, lens, state, probes, measure and ``explorer.finetune`` below it; never web, panels or gradio.
"""
from explorer.measure.run import STILL_RUNNING  # noqa: F401 (what a job's updates yield while a step computes)

from . import experiments, finetune, generation  # noqa: F401
