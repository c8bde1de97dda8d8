"""A small random-weight model with Llama-3-8B-Instruct's *shape*, built locally (no download):
grouped-query attention (8 query / 2 key-value heads), RoPE theta 500,000, Llama-3's 128,256-token
vocabulary with its special tokens at their ids (128000 <|begin_of_text|>, 128006/128007 header,
128009 <|eot_id|>), its chat template and end-of-turn ids [128001, 128009], stored in bfloat16.

It exercises the non-default verifier path (a local model directory, bf16, GQA, a large
vocabulary, a template whose end-of-turn token is not EOS) on a CPU:
``python experiments/llama3_shaped.py --out /tmp/llama3-shaped`` then
``python -m decoding ... --verifier /tmp/llama3-shaped``. The tokenizer is a byte-level BPE
trained here on the shipped benchmark prompts and padded to the vocabulary (ids it never emits
are named ``<|fill_N|>``), so its text is not Llama-3's; the ids and the template are.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB = 128_256
BASE = 128_000  # first special id
SPECIAL = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>",
           9: "<|eot_id|>"}
# Meta's published Llama-3 Instruct chat template (a format fact of the model)
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def _texts() -> list[str]:
    from drafters.data.sources import load_benchmark

    out = []
    for b in ("gsm8k", "math500", "svamp", "mt_bench"):
        out += [t for p in load_benchmark(b)[0][:200] for t in p.turns]
    return out


def build_tokenizer(merges_vocab: int = 4000):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(_texts(), trainers.BpeTrainer(
        vocab_size=merges_vocab, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    vocab = bpe.get_vocab()
    vocab.update({f"<|fill_{i}|>": i for i in range(len(vocab), BASE)})  # unreachable by merges, decodable
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(bpe.to_str())["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer, tok.decoder = bpe.pre_tokenizer, bpe.decoder
    tok.add_special_tokens([AddedToken(SPECIAL.get(i, f"<|reserved_special_token_{i}|>"), special=True)
                            for i in range(VOCAB - BASE)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL[0], eos_token=SPECIAL[9],
                                   pad_token=SPECIAL[1], chat_template=CHAT_TEMPLATE)
    assert fast.convert_tokens_to_ids(SPECIAL[9]) == BASE + 9 and len(fast) == VOCAB
    return fast


# Llama-3-8B's own sizes (its config.json); the default build is a small model of the same layout
SHAPES = {"llama3-8b": dict(hidden=4096, intermediate=14_336, layers=32, heads=32, kv_heads=8),
          "small": dict(hidden=256, intermediate=512, layers=2, heads=8, kv_heads=2)}


def _branch_outputs(model) -> list:
    """The projections that write into the residual stream: attention's o_proj and the MLP's down_proj."""
    return [m for layer in model.model.layers for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]


def bigram_fraction(model, sigma, ids) -> float:
    """Share of positions where the model's greedy next token is the planted successor ``sigma[id]``."""
    import torch

    with torch.no_grad():
        top = model(ids).logits.argmax(-1)  # (B, T)
    return (top == sigma[ids]).float().mean().item()


def corpus_successors(sequences: list[list[int]], vocab: int) -> dict[int, int]:
    """Each id's most frequent next id in ``sequences`` (ties: the smaller id), over ids below ``vocab``:
    the bigram table of a corpus, for :func:`plant_bigram`."""
    from collections import Counter

    counts: dict[int, Counter] = {}
    for seq in sequences:
        for a, b in zip(seq, seq[1:]):
            if a < vocab and b < vocab:
                counts.setdefault(a, Counter())[b] += 1
    return {a: min(c, key=lambda b: (-c[b], b)) for a, c in sorted(counts.items())}


def plant_bigram(model, seed: int = 0, target: float = 0.9, sharpness: float = 12.0, vocab: int = 4000,
                 successor: dict[int, int] | None = None) -> float:
    """Give a random model a next token a drafter can learn; returns the residual-branch scale used.

    1. The embedding rows are rescaled to RMS 1 (the scale of the final-norm hidden states that a
       drafter predicts from them), and a successor map ``sigma`` is planted in the LM head: row s is the
       sum of the embedding directions of the tokens t with sigma(t) = s, scaled so that the logit of
       sigma(t) is ``sharpness`` for a hidden state along t of norm sqrt(hidden); the other rows are
       zero, so generated text stays among the planted successors (and never ends early at EOS).
       Alone, a bigram model: t -> sigma(t). ``successor``: the map, e.g. a corpus's bigram table
       (:func:`corpus_successors`: the verifier then speaks the corpus, and a drafter trained on it has
       seen the pairs it generates); default: a random permutation of the first ``vocab`` ids (the
       text tokens of build_tokenizer).
    2. The residual branches (o_proj, down_proj) are scaled by beta so that attention and the MLPs still
       decide the greedy token at about ``1 - target`` of the positions (so context, the KV cache and
       the tree pass still matter): beta is found by bisection (in log space) on random ids of the
       map's domain, for any shape (the branches' size relative to the embeddings depends on the width).
    """
    import torch

    E = model.model.embed_tokens.weight  # (V, H)
    V, H = E.shape
    k = min(vocab, V)  # the ids a tokenizer trained on the texts emits (below build_tokenizer's fill tokens)
    g = torch.Generator(device="cpu").manual_seed(seed)
    if successor is None:
        A, succ = torch.arange(k), torch.randperm(k, generator=g)
    else:
        A, succ = torch.tensor(list(successor)), torch.tensor(list(successor.values()))
        if len(A) < 2 or int(A.min()) < 0 or max(int(A.max()), int(succ.max())) >= k:
            raise ValueError(f"successor: a map of at least 2 ids in [0, {k}), got {len(A)}")
    sigma = torch.arange(V)
    sigma[A] = succ  # the successor of A[i] is succ[i]
    sigma = sigma.to(E.device)
    A = A.to(E.device)
    succ = succ.to(E.device)
    with torch.no_grad():
        unit = E.float() / E.float().norm(dim=-1, keepdim=True).clamp_min(1e-6)  # the pad row is zero
        E.copy_((unit * H ** 0.5).to(E.dtype))  # rows of RMS 1, the scale of the features a drafter predicts
        # rows outside the map's image (fill, special, EOS) stay zero
        head = torch.zeros(V, H, device=E.device)
        head.index_add_(0, succ, sharpness / H ** 0.5 * unit[A])
        model.lm_head.weight.copy_(head.to(E.dtype))
    ids = A[torch.randint(0, len(A), (2, 64), generator=g).to(E.device)]
    scale = [1.0]
    hooks = [m.register_forward_hook(lambda _m, _i, out: out * scale[0]) for m in _branch_outputs(model)]
    lo, hi = -3.0, 3.0  # log10 of the branches' scale
    try:
        for _ in range(12):  # the bigram fraction falls as the branches grow
            mid = (lo + hi) / 2
            scale[0] = 10 ** mid
            lo, hi = (mid, hi) if bigram_fraction(model, sigma, ids) > target else (lo, mid)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        for m in _branch_outputs(model):
            m.weight.mul_(10 ** lo)
    return 10 ** lo


def build(out: str | Path, hidden: int = 256, layers: int = 2, seed: int = 0, *,
          intermediate: int | None = None,
          heads: int = 8, kv_heads: int = 2, device: str = "cpu", learnable: bool = False,
          corpus_texts: list[str] | None = None) -> Path:
    """Write the model directory (config, bf16 safetensors, tokenizer, generation config). The weights
    are drawn on ``device`` in bf16 (an 8B model is initialized on the GPU in seconds). ``learnable``
    plants a near-bigram next token (:func:`plant_bigram`) that a drafter can learn; without it the
    next token is near-uniform (top-2 logit gaps of about 0.2) and no drafter can predict it.
    ``corpus_texts``: the planted successor map is these texts' bigram table (each token's most
    frequent next token; :func:`corpus_successors`) instead of a random permutation: the verifier
    speaks the corpus, so a drafter trained on it has seen the pairs the verifier generates."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(out)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=hidden // heads, rope_theta=500_000.0, max_position_embeddings=8192,
                      rms_norm_eps=1e-5,
                      tie_word_embeddings=False, bos_token_id=BASE, eos_token_id=[BASE + 1, BASE + 9],
                      pad_token_id=BASE + 1)
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    if learnable:  # the successor map over the ids the tokenizer emits for text (below the fill tokens)
        k = min(i for t, i in tokenizer.get_vocab().items() if t.startswith("<|fill_"))
        successor = None if corpus_texts is None else corpus_successors(
            [tokenizer.encode(text, add_special_tokens=False) for text in corpus_texts], k)
        plant_bigram(model.eval(), seed=seed, vocab=k, successor=successor)
    model.generation_config = GenerationConfig(bos_token_id=BASE, eos_token_id=[BASE + 1, BASE + 9],
                                               pad_token_id=BASE + 1, do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"wrote {build(args.out, args.hidden, args.layers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
