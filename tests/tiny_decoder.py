"""A tiny decoder configuration and random weights spread wide enough that every parameter shows in the output."""
import torch

from models import ModelConfig

TINY = dict(vocab_size=61, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64, d_ff=80)


def tiny(**kw) -> ModelConfig:
    """``TINY`` with ``kw`` changed."""
    return ModelConfig(**{**TINY, **kw})


def spread(model, std: float = 0.08, *, norms: bool = False):
    """Every weight but the norms drawn from N(0, std); with ``norms``, the norm weights too, from U(0.5, 1.5)
    (away from 1, so a norm weight left out of a computation would show). Returns the model in eval mode."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, std)
            elif norms:
                p.uniform_(0.5, 1.5)
    return model.eval()
