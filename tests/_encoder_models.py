"""Small random HF encoders, batches and references shared by the padfree.torch tests, and the
kernels' contracts in plain torch (REFERENCE_OPS) that run the encoder on the CPU in float64."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from padfree.torch import PadfreeEncoder  # noqa: E402
from padfree.torch.weights import extract  # noqa: E402

ARCHS = ["bert", "roberta", "distilbert", "electra", "albert"]


# ---- models and batches ------------------------------------------------------------------------

def make_model(arch: str, hidden: int = 128, heads: int = 2, layers: int = 2, positions: int = 64,
               act: str = "gelu", seed: int = 0) -> torch.nn.Module:
    """A small HF encoder with random weights everywhere (LayerNorm affine included), HF eager attention.
    ELECTRA and ALBERT factorize their embeddings (embedding_size = hidden / 2); ALBERT runs `layers`
    passes through one shared group of two layers."""
    common = dict(vocab_size=97, max_position_embeddings=positions, attn_implementation="eager")
    if arch == "electra":
        config = transformers.ElectraConfig(hidden_size=hidden, embedding_size=hidden // 2, num_attention_heads=heads,
                                            num_hidden_layers=layers, intermediate_size=4 * hidden, hidden_act=act,
                                            type_vocab_size=2, **common)
        cls = transformers.ElectraModel
    elif arch == "albert":
        config = transformers.AlbertConfig(hidden_size=hidden, embedding_size=hidden // 2, num_attention_heads=heads,
                                           num_hidden_layers=layers, num_hidden_groups=1, inner_group_num=2,
                                           intermediate_size=4 * hidden, hidden_act=act, type_vocab_size=2, **common)
        cls = transformers.AlbertModel
    elif arch == "bert":
        config = transformers.BertConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                                         intermediate_size=4 * hidden, hidden_act=act, type_vocab_size=3, **common)
        cls = transformers.BertModel
    elif arch == "roberta":
        common["max_position_embeddings"] = positions + 2  # positions start at pad_token_id + 1 = 2
        config = transformers.RobertaConfig(hidden_size=hidden, num_attention_heads=heads,
                                            num_hidden_layers=layers, intermediate_size=4 * hidden,
                                            hidden_act=act, type_vocab_size=2, pad_token_id=1, **common)
        cls = transformers.RobertaModel
    else:
        config = transformers.DistilBertConfig(dim=hidden, n_heads=heads, n_layers=layers, hidden_dim=4 * hidden,
                                               activation=act, pad_token_id=0, **common)
        cls = transformers.DistilBertModel
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                p.copy_((1.0 + 0.2 * torch.randn_like(p)) if name.endswith("weight") else 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    return model


def randomize_parameters(model: torch.nn.Module, seed: int, bias_scale: float = 0.1) -> torch.nn.Module:
    """Every parameter drawn from one torch.Generator seeded `seed`, in named_parameters() order:
    LayerNorm weights 1 + 0.2 N(0, 1) and biases 0.2 N(0, 1), other vectors bias_scale N(0, 1), matrices
    N(0, 1/fan_in) (unit-scale activations through 12 layers)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "LayerNorm" in name or "layer_norm" in name:
                p.copy_((1.0 + 0.2 * noise) if name.endswith("weight") else 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(bias_scale * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model


def pad_id(model) -> int:
    return model.config.pad_token_id or 0


def random_batch(model, batch: int, width: int, rng: np.random.Generator, *, lengths=None, types: bool = False):
    """Right-padded int64 ids [B, S], mask, token types; padded positions hold the pad id.

    RoBERTa numbers positions by counting non-pad ids, so tokens never draw the pad id.
    """
    if lengths is None:
        lengths = rng.integers(1, width + 1, size=batch)
        lengths[0], lengths[-1] = 1, width  # the edge lengths, every time
    vocab = model.config.vocab_size
    pad = pad_id(model)
    ids = rng.integers(0, vocab - 1, size=(batch, width))
    ids[ids >= pad] += 1  # skip the pad id
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    ids[~mask] = pad
    type_ids = None
    if types:
        type_ids = rng.integers(0, model.config.type_vocab_size, size=(batch, width)) * mask
    return (torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64)),
            None if type_ids is None else torch.from_numpy(type_ids))


def hf_reference(model, ids, mask, type_ids, device, dtype=torch.float64):
    """HF eager on a copy of the model in `dtype` (float64 on the CPU, float32 on the GPU)."""
    ref = model.to(device=device, dtype=dtype)
    kwargs = {} if type_ids is None else {"token_type_ids": type_ids.to(device)}
    with torch.no_grad():
        out = ref(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
    pooled = getattr(out, "pooler_output", None)
    return out.last_hidden_state, pooled


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    assert torch.isfinite(got).all()
    return float((got - ref).norm() / ref.norm())


def check_padded_output(out, ref_hidden, ref_pooled, mask, tol):
    valid = mask.bool().cpu()
    hidden = out.last_hidden_state.cpu()
    assert hidden.shape == ref_hidden.shape
    assert (hidden[~valid] == 0).all(), "padded rows must be exact zeros"
    assert rel_err(hidden[valid], ref_hidden.cpu()[valid]) < tol
    if ref_pooled is None:
        assert getattr(out, "pooler_output", None) is None
    else:
        assert rel_err(out.pooler_output, ref_pooled) < tol


# ---- reference ops: the kernels' contracts in plain torch (CPU tests) ---------------------------

def _segments(cu):
    cu = cu.tolist()
    return [(a, b) for a, b in zip(cu[:-1], cu[1:])]


def _ref_embedding(ids, cu, word, pos, gamma, beta, eps=1e-12, token_type_ids=None, token_type_embeddings=None,
                   position_offset=0, out=None):
    positions = torch.cat([torch.arange(b - a) for a, b in _segments(cu)]) + position_offset
    x = word[ids.long()] + pos[positions]
    if token_type_embeddings is not None:
        x = x + token_type_embeddings[0 if token_type_ids is None else token_type_ids.long()]
    out[:len(ids)] = x if gamma is None else F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)
    return out


def _ref_attention(qkv, cu, max_seqlen, num_heads, qkv_bias=None, softmax_scale=None, out=None):
    hidden = qkv.shape[1] // 3
    qkv = qkv + qkv_bias
    for a, b in _segments(cu):
        assert b - a <= max_seqlen
        q, k, v = (qkv[a:b, i * hidden:(i + 1) * hidden].reshape(b - a, num_heads, -1).transpose(0, 1)
                   for i in range(3))
        p = torch.softmax(q @ k.transpose(1, 2) * softmax_scale, dim=-1)
        out[a:b] = (p @ v).transpose(0, 1).reshape(b - a, hidden)
    return out


def _ref_skip_layernorm(x, residual, gamma, beta, bias=None, eps=1e-12, out=None):
    summed = x + bias if residual is None else x + bias + residual
    out.copy_(F.layer_norm(summed, (x.shape[-1],), gamma, beta, eps))
    return out


def _ref_bias_gelu(x, bias=None, approximate="none", out=None):
    out.copy_(F.gelu(x + bias, approximate=approximate))
    return out


def _ref_rebuild_padding(packed, cu, padded_seqlen, out=None):
    padded = packed.new_zeros(len(cu) - 1, padded_seqlen, *packed.shape[1:])
    for i, (a, b) in enumerate(_segments(cu)):
        n = min(b - a, padded_seqlen)  # longer sequences keep their first rows, as the kernel's
        padded[i, :n] = packed[a:a + n]
    return padded


def reference_pool(x, cu, mode, normalize=False):
    """Sentence pooling of packed rows [T, H] per cu_seqlens segment in x's dtype (empty: zeros)."""
    pooled = x.new_zeros(len(cu) - 1, x.shape[1])
    for i, (a, b) in enumerate(_segments(cu)):
        if b > a:
            rows = x[a:b]
            pooled[i] = rows[0] if mode == "cls" else rows.mean(0) if mode == "mean" else rows.max(0).values
    return F.normalize(pooled, p=2, dim=1) if normalize else pooled


def _ref_sequence_pool(x, cu, mode="mean", normalize=False, out=None):
    out.copy_(reference_pool(x, cu, mode, normalize))
    return out


REFERENCE_OPS = types.SimpleNamespace(
    embedding_layernorm=_ref_embedding, attention_varlen=_ref_attention, skip_layernorm=_ref_skip_layernorm,
    bias_gelu=_ref_bias_gelu, rebuild_padding=_ref_rebuild_padding, sequence_pool=_ref_sequence_pool)


def cpu_encoder(model, use_epilogue=None, dtype=torch.float64, **options) -> PadfreeEncoder:
    """The encoder's composition on the CPU with REFERENCE_OPS (options: PadfreeEncoder's, e.g. pooling)."""
    weights = extract(model, dtype, torch.device("cpu"))
    return PadfreeEncoder(weights, model.config, ops=REFERENCE_OPS, use_epilogue=use_epilogue, **options)
