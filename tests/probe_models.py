"""The small random decoder, token batches and attention implementations the probe tests share
(tests/test_probes*.py)."""
import torch

from models import Decoder, ModelConfig

IMPLS = ["naive", "sdpa", "tiled"]


def _small_decoder(seed=0, **kw):
    cfg = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    cfg.update(kw)
    torch.manual_seed(seed)
    model = Decoder(ModelConfig(**cfg)).eval()
    with torch.no_grad():  # wider than the 0.02 init so logits differ clearly between tokens
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.2)
    return model


def _tokens(T, vocab=50, n=1, seed=1):
    return torch.randint(0, vocab, (n, T), generator=torch.Generator().manual_seed(seed))
