"""``python -m training``: train the default decoder; ``--encoder``: the encoder; ``--quick``: a
tiny run of either (for tests); ``--card-only``: rewrite a folder's model card from its log."""
from __future__ import annotations

import argparse
import dataclasses

import torch


def _apply_overrides(settings, items: list[str], ap: argparse.ArgumentParser) -> None:
    fields = {f.name for f in dataclasses.fields(settings)}
    for item in items:
        name, _, value = item.partition("=")
        if name not in fields:
            ap.error(f"--set {item}: {type(settings).__name__} has no field {name!r}.")
        current = getattr(settings, name)
        if isinstance(current, tuple):
            parsed = tuple(type(current[0])(v) for v in value.split(","))
        else:
            parsed = type(current)(value)
        setattr(settings, name, parsed)


def main(argv: list[str] | None = None) -> dict:
    from . import encoder, loop
    from .card import rewrite_card

    ap = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", action="store_true",
                    help="train the masked-language-model encoder instead of the decoder")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny model, a small slice, a few steps (well under a minute)")
    ap.add_argument("--out", default=None,
                    help=f"output folder (default {loop.DEFAULT_OUT}, or {encoder.DEFAULT_OUT} with "
                         "--encoder; --quick has no default and needs one)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default 2; 1 with --quick, where a tiny model gains "
                         "nothing from a second thread and loses a lot when cores are shared)")
    ap.add_argument("--card-only", action="store_true",
                    help="rewrite README.md in --out from its training_log.json (no training)")
    ap.add_argument("--compare-decoder", metavar="FOLDER", default=None,
                    help="with --encoder: measure the decoder in FOLDER (same tokenizer) at the encoder's "
                         "held-out positions, into the encoder's log and card (no training)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override one settings field (for experiments), e.g. --set max_gap=32")
    args = ap.parse_args(argv)
    if args.quick and args.out is None:
        ap.error("--quick needs --out: it must not overwrite the shipped model.")
    default_out = encoder.DEFAULT_OUT if args.encoder else loop.DEFAULT_OUT
    out = args.out or default_out
    if args.compare_decoder:
        if not args.encoder:
            ap.error("--compare-decoder goes with --encoder.")
        return encoder.compare_decoder(out, args.compare_decoder)
    if args.card_only:
        return encoder.rewrite_card(out) if args.encoder else rewrite_card(out)
    torch.set_num_threads(args.threads or (1 if args.quick else 2))
    cls = encoder.EncoderSettings if args.encoder else loop.TrainSettings
    s = cls.quick() if args.quick else cls()
    if args.seed is not None:
        s.seed = args.seed
    if args.steps is not None:
        s.steps = args.steps
    _apply_overrides(s, args.set, ap)
    return encoder.train_encoder(s, out) if args.encoder else loop.train(s, out)


if __name__ == "__main__":
    main()
