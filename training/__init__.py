"""How the shipped models are made: ``python -m training`` (the default decoder),
``python -m training --encoder`` (the masked-language-model encoder); ``python -m training.live``: a small
decoder trained from scratch in about a minute, while a class watches its induction head form.

Reading order: corpus (the stories) -> tokenizer -> data (training rows) -> evaluate (held-out
loss, head scores at several spans) -> loop (the decoder's training) -> card (its model card)
-> encoder (masked-language-model training and its card) -> __main__ (the command line) -> live
(train one live).
Nothing in the app imports this package; it imports ``models`` and ``lens``, never ``explorer``.
"""
