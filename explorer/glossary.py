"""The words the tabs use, each defined in one or two sentences (shown in the header's glossary; ``term`` puts a
definition on a word where it appears, as a hover title; ``mark`` does it for every term of one of our texts)."""
from __future__ import annotations

import functools
import html
import re

TERMS: dict[str, str] = {
    "token": "A piece of text the tokenizer cuts the input into (a word, part of a word or a symbol); the model "
             "sees only its id, an integer.",
    "embedding": "The row of the embedding matrix for a token id: the vector of d_model numbers the model starts "
                 "from for that token.",
    "residual stream": "The vector each token carries from layer to layer; every attention and feed-forward block "
                       "reads it and adds its output back to it.",
    "RMSNorm": "Divides a vector by the root of its mean square (its RMS) and multiplies by a learned scale; unlike "
               "LayerNorm it does not subtract the mean.",
    "query, key, value": "Three projections of each token's vector: the query asks, the keys are compared with it "
                         "(dot product), the values are what gets averaged.",
    "attention head": "One set of query, key and value projections; each head computes its own attention pattern, "
                      "and the heads' outputs are concatenated and mixed by o_proj.",
    "KV head": "A key/value projection shared by several query heads under grouped-query attention; the KV cache "
               "stores one key and one value vector per KV head per token.",
    "GQA": "Grouped-query attention: fewer key/value heads than query heads, each read by a group of query heads, "
           "which shrinks the KV cache by that factor.",
    "RoPE": "Rotary position embedding: rotates pairs of numbers in each query and key by an angle proportional to "
            "the token's position, so their dot product depends on the distance between them.",
    "rope_theta (θ)": "The base of RoPE's frequencies: pair i turns by position · θ^(−2i/D); a larger θ makes the "
                      "slow pairs slower, for longer contexts.",
    "softmax": "Turns a row of scores into weights that are positive and sum to 1: exp(score) divided by the sum "
               "of exp over the row.",
    "causal mask": "Sets the scores of later tokens to −∞ before the softmax, so each token attends only to "
                   "itself and the tokens before it, as when generating.",
    "attention sink": "A token (usually the first) that receives most of many heads' attention while carrying "
                      "little information: a place to put weight when a head has nothing to look at.",
    "previous-token head": "A head whose tokens attend mostly to the token just before them; its score is the "
                           "mean weight on position j − 1.",
    "induction head": "A head that, at a repeated token, attends to the token that followed its earlier occurrence, "
                      "so the model can copy what came next; scored on repeated random tokens.",
    "SwiGLU": "The feed-forward block of Llama: down(SiLU(gate(x)) · up(x)), a gated variant of an MLP.",
    "GELU": "The smooth activation of the classic encoder's MLP: x · Φ(x), Φ the normal distribution function.",
    "logit": "The unnormalised score the LM head gives each vocabulary token; softmax over the logits gives the "
             "next-token probabilities.",
    "logit lens": "Applying the final norm and LM head to the residual stream after each layer, to read what the "
                  "model would predict if it stopped there.",
    "max |Δlogit|": "The largest absolute difference between the logits of two computations of the same input "
                    "(e.g. naive vs fused attention); rounding-level values mean the same function.",
    "nats/token": "Cross-entropy loss per token in natural-log units: the mean of −ln p(correct next token); "
                  "ln 2 ≈ 0.69 nats is one bit.",
    "KV cache": "The keys and values of the tokens seen so far, kept between generation steps so that each new "
                "token computes only its own instead of re-running the whole prefix.",
    "prefill": "The first forward pass of generation, over the whole prompt at once, which fills the KV cache.",
    "decode step": "One forward pass for one new token, reading the KV cache; generation is one decode step per "
                   "token after the prefill.",
    "flash / tiled attention": "Attention computed block by block over the keys with a running softmax, never "
                               "holding the full T × S score matrix: memory grows with T, not T².",
    "SDPA": "PyTorch's scaled_dot_product_attention: a fused kernel (flash on CPU and GPU) that never returns the "
            "attention weights.",
    "LoRA": "Low-rank adaptation: a frozen weight W plus (alpha/r) · B A with small trainable A and B of rank r; "
            "training only them needs a fraction of the memory.",
    "int8": "Weights stored as 8-bit integers with one floating-point scale per output row: a quarter of the fp32 "
            "bytes, at a small error.",
    "bf16": "bfloat16: 16-bit floats with fp32's exponent range and 8 bits of mantissa; half the bytes of fp32.",
    "roofline": "The bound on a computation's speed set by either the chip's arithmetic rate or its memory "
                "bandwidth, whichever runs out first for that many operations per byte.",
    "encoder": "A transformer without the causal mask: every token sees the whole sentence, as in BERT; trained "
               "to fill in hidden words rather than to predict the next one.",
}


# Other ways the tabs' texts write a term (plurals are matched anyway): surface form -> term
ALIASES: dict[str, str] = {
    "grouped-query attention": "GQA",
    "flash attention": "flash / tiled attention",
    "rope_theta": "rope_theta (θ)",
    "query": "query, key, value",
    "queries": "query, key, value",
    "LM head": "logit",
    "key/value head": "KV head",
    "previous-token": "previous-token head",
    "induction": "induction head",
    "sink": "attention sink",
}


def definition(word: str) -> str:
    """The definition of ``word`` (case-insensitive); KeyError names the known terms otherwise."""
    for key, text in TERMS.items():
        if key.lower() == word.lower():
            return text
    raise KeyError(f"{word!r} is not in the glossary; it has {', '.join(TERMS)}.")


def term(word: str, shown: str | None = None) -> str:
    """HTML for a word with its definition as a hover title (dotted underline), for a gr.Markdown or gr.HTML."""
    text = html.escape(definition(word), quote=True)
    return f'<abbr class="term" title="{text}">{html.escape(shown or word)}</abbr>'


def markdown() -> str:
    """The whole glossary as a Markdown definition list, in the order of the lesson."""
    return "\n".join(f"- **{html.escape(k)}**: {html.escape(v)}" for k, v in TERMS.items())


@functools.cache
def _forms() -> dict[str, str]:
    forms = {k: k for k in TERMS if "," not in k and "/" not in k.replace("nats/token", "")}
    forms.update(ALIASES)
    return forms


@functools.cache
def _pattern() -> re.Pattern:
    forms = sorted(_forms(), key=len, reverse=True)  # the longest first: "KV cache" before "KV head"'s "KV"
    body = "|".join(re.escape(f) for f in forms)
    return re.compile(rf"(?<![\w|/-])({body})(s|es)?(?![\w|/-])", re.IGNORECASE)


@functools.cache
def _term_of() -> dict[str, str]:
    """Each written form, lower-cased -> its term."""
    return {k.lower(): v for k, v in _forms().items()}


# Markdown we never mark inside: fenced and inline code, HTML tags, a link's target, LaTeX-free by design
_PROTECTED = re.compile(r"```.*?```|`[^`]*`|<[^>]*>|\]\([^)]*\)", re.DOTALL)


def mark(text: str) -> str:
    """Our own Markdown ``text`` with the first use of each glossary term wrapped in ``<abbr class="term"
    title="definition">`` (a dotted underline; hovering shows the definition). Never call it on a visitor's
    text: it adds HTML. Code spans, tags and link targets are left as they are."""
    pattern, forms = _pattern(), _term_of()
    done: set[str] = set()

    def wrap(m: re.Match) -> str:
        key = forms[m.group(1).lower()]
        if key in done:
            return m.group(0)
        done.add(key)
        title = html.escape(TERMS[key], quote=True)
        return f'<abbr class="term" title="{title}">{m.group(0)}</abbr>'

    out, last = [], 0
    for m in _PROTECTED.finditer(text):
        out.append(pattern.sub(wrap, text[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(pattern.sub(wrap, text[last:]))
    return "".join(out)
