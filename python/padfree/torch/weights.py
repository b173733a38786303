"""Weight extraction: a Hugging Face encoder -> EncoderWeights, the one layout the encoder runs.

Architectures are recognised by module structure, not class name, so that models of the same
architecture (XLM-RoBERTa, CamemBERT, ...) load too:
- BERT-like:       embeddings.{word,position,token_type}_embeddings + encoder.layer[i].attention.self.query ...
- ELECTRA-like:    BERT-like, plus embeddings_project (embedding_size -> hidden_size) where the two differ
- RoBERTa-like:    BERT-like whose embeddings number positions from padding_idx + 1
                   (they define create_position_ids_from_input_ids)
- DistilBERT-like: embeddings.{word,position}_embeddings + transformer.layer[i].attention.q_lin ...
- ALBERT-like:     BERT-like embeddings at embedding_size, encoder.embedding_hidden_mapping_in to the hidden
                   size, then encoder.albert_layer_groups[g].albert_layers[j]: num_hidden_layers passes, each
                   through one group's inner_group_num layers (groups shared by consecutive passes)

Factorized embeddings (ELECTRA, ALBERT) run the embedding LayerNorm kernel at embedding_size and the
projection to the hidden size as one GEMM. Shared layers (ALBERT) are one LayerWeights object repeated
in `layers`: their weights are held once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .. import kernel_sizes
from .._lib import PadfreeError

# HF hidden_act -> the activation the FFN computes: "erf" / "tanh" GELU (the cuBLASLt epilogue and
# padfree.ops.bias_gelu both do these), or "relu" (the epilogue's other activation).
ACTIVATIONS = {
    "gelu": "erf", "gelu_python": "erf",
    "gelu_new": "tanh", "gelu_fast": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_python_tanh": "tanh",
    "relu": "relu",
}


class UnsupportedModelError(PadfreeError, ValueError):
    """The model's architecture or configuration has no padding-free path in padfree.torch."""


@dataclass
class LayerWeights:
    """One encoder layer. Linear weights stay [out, in] as HF stores them; the encoder multiplies by
    their transpose view, which cuBLASLt takes without a copy."""
    qkv_weight: torch.Tensor        # [3H, H]: Q | K | V rows, merged once here
    qkv_bias: torch.Tensor          # [3H]: added by the attention kernel as it loads Q, K, V
    out_weight: torch.Tensor        # [H, H]
    out_bias: torch.Tensor          # [H]: folded into the first skip LayerNorm
    attn_ln_weight: torch.Tensor
    attn_ln_bias: torch.Tensor
    attn_ln_eps: float
    up_weight: torch.Tensor         # [I, H]
    up_bias: torch.Tensor           # [I]
    down_weight: torch.Tensor       # [H, I]
    down_bias: torch.Tensor         # [H]: folded into the second skip LayerNorm
    ffn_ln_weight: torch.Tensor
    ffn_ln_bias: torch.Tensor
    ffn_ln_eps: float
    # Where extract() placed the four projection weights in one buffer (colocate_projections): the
    # attention's two (QKV, out) and the FFN's two (up, down) as flat views spanning each pair, which a
    # kernel before them prefetches into L2 in one range. None: the weights are separate tensors.
    attention_projections: torch.Tensor | None = None
    ffn_projections: torch.Tensor | None = None


@dataclass
class EncoderWeights:
    """Everything the padding-free encoder needs, on one device in one dtype."""
    architecture: str               # "bert", "roberta", "electra", "albert" or "distilbert" (the weight layout)
    hidden_size: int
    num_heads: int
    activation: str                 # a value of ACTIVATIONS
    word_embeddings: torch.Tensor   # [vocab, E]; E = embedding_size (= H unless factorized)
    position_embeddings: torch.Tensor  # [positions, E]
    token_type_embeddings: torch.Tensor | None  # [types, E]; None: the model has no token types
    emb_ln_weight: torch.Tensor     # [E]
    emb_ln_bias: torch.Tensor
    emb_ln_eps: float
    position_offset: int            # position of a sequence's first token (RoBERTa: padding_idx + 1)
    layers: list[LayerWeights] = field(default_factory=list)  # one per layer run (shared ones repeated)
    pooler_weight: torch.Tensor | None = None  # [H, H]; None: the model has no pooler
    pooler_bias: torch.Tensor | None = None
    embedding_proj_weight: torch.Tensor | None = None  # [H, E]: ELECTRA's embeddings_project, ALBERT's
    embedding_proj_bias: torch.Tensor | None = None    # embedding_hidden_mapping_in; None: E == H, none
    head: Any = None  # heads.HeadWeights of a task model (BERT's pooler then lives there); None: none

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def vocab_size(self) -> int:
        return self.word_embeddings.shape[0]

    @property
    def type_vocab_size(self) -> int:
        return 0 if self.token_type_embeddings is None else self.token_type_embeddings.shape[0]

    @property
    def max_seqlen(self) -> int:
        """The longest sequence the position table covers."""
        return self.position_embeddings.shape[0] - self.position_offset

    @property
    def intermediate_size(self) -> int:
        return self.layers[0].up_weight.shape[0]

    @property
    def embedding_size(self) -> int:
        return self.word_embeddings.shape[1]

    @property
    def distinct_layers(self) -> list[LayerWeights]:
        """The layers whose weights a forward reads, each once (ALBERT's shared layers once)."""
        return list({id(lw): lw for lw in self.layers}.values())


def extract(model: torch.nn.Module, dtype: torch.dtype, device: torch.device,
            allow_unused_weights: bool = False) -> EncoderWeights:
    """Copy a HF encoder's weights into EncoderWeights (the model itself is left untouched).

    Task models (BertForSequenceClassification, ...) give their base model and their head (heads.py);
    a model with a head padfree cannot run (BertForMaskedLM) is refused unless allow_unused_weights,
    which runs its encoder alone. Raises UnsupportedModelError naming what does not fit.
    """
    from .heads import extract_head  # heads.py imports this module's error
    base = getattr(model, "base_model", model)
    config = getattr(base, "config", None)
    if config is None:
        raise UnsupportedModelError(f"{type(model).__name__} is not a Hugging Face model (no config)")
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise UnsupportedModelError("decoder / cross-attention configurations are not supported: "
                                    "padfree.torch runs bidirectional encoders")
    position_type = getattr(config, "position_embedding_type", "absolute")
    if position_type != "absolute":
        raise UnsupportedModelError(f"position_embedding_type={position_type!r} is not supported; "
                                    "only absolute position embeddings are")

    def take(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=device, dtype=dtype).contiguous()

    encoder = getattr(base, "encoder", None)
    if encoder is not None and hasattr(encoder, "albert_layer_groups") and hasattr(base, "embeddings"):
        weights = _albert_like(base, config, take)
    elif encoder is not None and hasattr(encoder, "layer") and hasattr(base, "embeddings"):
        weights = _bert_like(base, config, take)
    elif hasattr(base, "transformer") and hasattr(base, "embeddings"):
        weights = _distilbert_like(base, config, take)
    else:
        raise UnsupportedModelError(
            f"{type(base).__name__}: expected a BERT-, RoBERTa-, ELECTRA-, ALBERT- or DistilBERT-like model "
            "(embeddings + encoder.layer, encoder.albert_layer_groups or transformer.layer)")
    weights.head = extract_head(model, base, take, allow_unused_weights)
    if weights.head is not None:  # the head reads the pooler where it uses one; nothing else does
        weights.pooler_weight = weights.pooler_bias = None
    _check_shapes(weights)
    for lw in weights.distinct_layers:
        colocate_projections(lw)
    return weights


_PART_ALIGN = 128  # elements: every weight starts at least 256-byte aligned, as from the allocator


def colocate_projections(lw: LayerWeights) -> None:
    """Moves lw's projection weights into one buffer in the order a forward reads them (QKV, out, up,
    down) and sets attention_projections / ffn_projections to the spans of the two pairs."""
    parts = (lw.qkv_weight, lw.out_weight, lw.up_weight, lw.down_weight)
    starts, end = [], 0
    for part in parts:
        starts.append(end)
        end += -(-part.numel() // _PART_ALIGN) * _PART_ALIGN
    flat = torch.empty(end, dtype=parts[0].dtype, device=parts[0].device)
    views = []
    for part, start in zip(parts, starts):
        view = flat[start:start + part.numel()].view(part.shape)
        view.copy_(part)
        views.append(view)
    lw.qkv_weight, lw.out_weight, lw.up_weight, lw.down_weight = views
    lw.attention_projections = flat[:starts[1] + parts[1].numel()]
    lw.ffn_projections = flat[starts[2]:starts[3] + parts[3].numel()]


def _activation(name) -> str:
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise UnsupportedModelError(f"hidden activation {name!r} is not supported; "
                                    f"supported: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def _merge_qkv(q: torch.nn.Linear, k: torch.nn.Linear, v: torch.nn.Linear, take):
    if q.bias is None or k.bias is None or v.bias is None:
        raise UnsupportedModelError("Q/K/V projections without bias are not supported")
    return (take(torch.cat([q.weight, k.weight, v.weight], dim=0)),
            take(torch.cat([q.bias, k.bias, v.bias], dim=0)))


def _linear(module, take, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [out, in], bias [out]) of a Linear with a bias, else UnsupportedModelError."""
    if not isinstance(module, torch.nn.Linear) or module.bias is None:
        raise UnsupportedModelError(f"{where}: expected a Linear layer with a bias, got {type(module).__name__}")
    return take(module.weight), take(module.bias)


def _embeddings(emb, take, **fields) -> dict:
    """The EncoderWeights fields of BERT-like embeddings (word, position, optional token type, LayerNorm)."""
    token_types = getattr(emb, "token_type_embeddings", None)
    return dict(
        word_embeddings=take(emb.word_embeddings.weight),
        position_embeddings=take(emb.position_embeddings.weight),
        token_type_embeddings=None if token_types is None else take(token_types.weight),
        emb_ln_weight=take(emb.LayerNorm.weight), emb_ln_bias=take(emb.LayerNorm.bias),
        emb_ln_eps=float(emb.LayerNorm.eps), **fields)


def _bert_like(base, config, take) -> EncoderWeights:
    emb = base.embeddings
    roberta = hasattr(emb, "create_position_ids_from_input_ids")
    offset = emb.padding_idx + 1 if roberta else 0
    layers = []
    for layer in base.encoder.layer:
        att = layer.attention
        qkv_w, qkv_b = _merge_qkv(att.self.query, att.self.key, att.self.value, take)
        layers.append(LayerWeights(
            qkv_weight=qkv_w, qkv_bias=qkv_b,
            out_weight=take(att.output.dense.weight), out_bias=take(att.output.dense.bias),
            attn_ln_weight=take(att.output.LayerNorm.weight), attn_ln_bias=take(att.output.LayerNorm.bias),
            attn_ln_eps=float(att.output.LayerNorm.eps),
            up_weight=take(layer.intermediate.dense.weight), up_bias=take(layer.intermediate.dense.bias),
            down_weight=take(layer.output.dense.weight), down_bias=take(layer.output.dense.bias),
            ffn_ln_weight=take(layer.output.LayerNorm.weight), ffn_ln_bias=take(layer.output.LayerNorm.bias),
            ffn_ln_eps=float(layer.output.LayerNorm.eps)))
    pooler = getattr(base, "pooler", None)
    # ELECTRA: embeddings at embedding_size, projected to the hidden size (the module exists only
    # where the two differ)
    project = getattr(base, "embeddings_project", None)
    proj_w, proj_b = (None, None) if project is None else _linear(project, take, "embeddings_project")
    architecture = "roberta" if roberta else "electra" if getattr(config, "model_type", "") == "electra" else "bert"
    return EncoderWeights(
        architecture=architecture,
        hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
        activation=_activation(config.hidden_act), layers=layers,
        pooler_weight=None if pooler is None else take(pooler.dense.weight),
        pooler_bias=None if pooler is None else take(pooler.dense.bias),
        embedding_proj_weight=proj_w, embedding_proj_bias=proj_b,
        **_embeddings(emb, take, position_offset=offset))


def _albert_layer(layer, take) -> LayerWeights:
    att = layer.attention
    qkv_w, qkv_b = _merge_qkv(att.query, att.key, att.value, take)
    return LayerWeights(
        qkv_weight=qkv_w, qkv_bias=qkv_b,
        out_weight=take(att.dense.weight), out_bias=take(att.dense.bias),
        attn_ln_weight=take(att.LayerNorm.weight), attn_ln_bias=take(att.LayerNorm.bias),
        attn_ln_eps=float(att.LayerNorm.eps),
        up_weight=take(layer.ffn.weight), up_bias=take(layer.ffn.bias),
        down_weight=take(layer.ffn_output.weight), down_bias=take(layer.ffn_output.bias),
        ffn_ln_weight=take(layer.full_layer_layer_norm.weight), ffn_ln_bias=take(layer.full_layer_layer_norm.bias),
        ffn_ln_eps=float(layer.full_layer_layer_norm.eps))


def albert_schedule(num_hidden_layers: int, num_hidden_groups: int) -> list[int]:
    """The layer group of each of ALBERT's num_hidden_layers passes, by HF's own formula
    (AlbertTransformer.forward: int(i / (num_hidden_layers / num_hidden_groups)))."""
    return [int(i / (num_hidden_layers / num_hidden_groups)) for i in range(num_hidden_layers)]


def _albert_like(base, config, take) -> EncoderWeights:
    groups = base.encoder.albert_layer_groups
    passes, group_count = int(config.num_hidden_layers), int(config.num_hidden_groups)
    if group_count < 1 or group_count != len(groups):
        raise UnsupportedModelError(f"ALBERT: num_hidden_groups={group_count} but the model holds {len(groups)}"
                                    " layer groups")
    schedule = albert_schedule(passes, group_count)
    if any(g >= group_count for g in schedule):
        raise UnsupportedModelError(f"ALBERT: num_hidden_layers={passes} with num_hidden_groups={group_count}"
                                    " maps a layer to a group the model does not have")
    # each group's layers extracted once; every pass through a group reuses the same objects
    group_layers = [[_albert_layer(layer, take) for layer in group.albert_layers] for group in groups]
    layers = [lw for g in schedule for lw in group_layers[g]]
    proj_w, proj_b = _linear(base.encoder.embedding_hidden_mapping_in, take, "embedding_hidden_mapping_in")
    pooler = getattr(base, "pooler", None)
    pooler_w, pooler_b = (None, None) if pooler is None else _linear(pooler, take, "pooler")
    if pooler is not None and not isinstance(getattr(base, "pooler_activation", None), torch.nn.Tanh):
        raise UnsupportedModelError(f"ALBERT pooler activation {type(base.pooler_activation).__name__}:"
                                    " the pooler runs dense + tanh")
    return EncoderWeights(
        architecture="albert", hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
        activation=_activation(config.hidden_act), layers=layers,
        pooler_weight=pooler_w, pooler_bias=pooler_b, embedding_proj_weight=proj_w, embedding_proj_bias=proj_b,
        **_embeddings(base.embeddings, take, position_offset=0))


def _distilbert_like(base, config, take) -> EncoderWeights:
    emb = base.embeddings
    layers = []
    for layer in base.transformer.layer:
        att = layer.attention
        qkv_w, qkv_b = _merge_qkv(att.q_lin, att.k_lin, att.v_lin, take)
        layers.append(LayerWeights(
            qkv_weight=qkv_w, qkv_bias=qkv_b,
            out_weight=take(att.out_lin.weight), out_bias=take(att.out_lin.bias),
            attn_ln_weight=take(layer.sa_layer_norm.weight), attn_ln_bias=take(layer.sa_layer_norm.bias),
            attn_ln_eps=float(layer.sa_layer_norm.eps),
            up_weight=take(layer.ffn.lin1.weight), up_bias=take(layer.ffn.lin1.bias),
            down_weight=take(layer.ffn.lin2.weight), down_bias=take(layer.ffn.lin2.bias),
            ffn_ln_weight=take(layer.output_layer_norm.weight),
            ffn_ln_bias=take(layer.output_layer_norm.bias),
            ffn_ln_eps=float(layer.output_layer_norm.eps)))
    return EncoderWeights(
        architecture="distilbert", hidden_size=config.dim, num_heads=config.n_heads,
        activation=_activation(config.activation),
        word_embeddings=take(emb.word_embeddings.weight),
        position_embeddings=take(emb.position_embeddings.weight),
        token_type_embeddings=None,
        emb_ln_weight=take(emb.LayerNorm.weight), emb_ln_bias=take(emb.LayerNorm.bias),
        emb_ln_eps=float(emb.LayerNorm.eps), position_offset=0, layers=layers)


def check_kernel_sizes(w: EncoderWeights) -> None:
    """Raise UnsupportedModelError unless padfree's kernels are built for w's sizes (extract checks
    only what the encoder's own logic needs, so that the CPU tests can run other sizes on reference ops)."""
    problem = kernel_sizes.attention_problem(w.num_heads, w.head_dim)
    if problem is not None:
        raise UnsupportedModelError(f"{w.num_heads} heads x {w.head_dim}: {problem}")


def _check_shapes(w: EncoderWeights) -> None:
    h = w.hidden_size
    if not w.layers:
        raise UnsupportedModelError("the model has no encoder layers")
    if h % w.num_heads:
        raise UnsupportedModelError(f"hidden size {h} is not a multiple of num_heads {w.num_heads}")
    problem = kernel_sizes.hidden_problem(h)
    if problem is not None:
        raise UnsupportedModelError(f"{problem}: the LayerNorm kernels cannot run this model")
    e = w.embedding_size
    if w.embedding_proj_weight is None and e != h:
        raise UnsupportedModelError(f"embedding size {e} differs from hidden size {h} with no projection between")
    if w.embedding_proj_weight is not None:
        problem = kernel_sizes.hidden_problem(e)
        if problem is not None:
            raise UnsupportedModelError(f"embedding {problem.replace('hidden size', 'size')}: the embedding"
                                        " LayerNorm kernel cannot run this model")
        if w.embedding_proj_weight.shape != (h, e):
            raise UnsupportedModelError(f"the embedding projection is {list(w.embedding_proj_weight.shape)},"
                                        f" expected [{h}, {e}] (hidden size x embedding size)")
    if w.max_seqlen < 1:
        raise UnsupportedModelError(f"the position table ({w.position_embeddings.shape[0]} rows) "
                                    f"leaves no room after the position offset {w.position_offset}")
    for i, lw in enumerate(w.layers):
        if lw.qkv_weight.shape != (3 * h, h) or lw.out_weight.shape != (h, h) \
                or lw.down_weight.shape[0] != h or lw.up_weight.shape[1] != h:
            raise UnsupportedModelError(f"layer {i}: projection shapes do not match hidden size {h}")
