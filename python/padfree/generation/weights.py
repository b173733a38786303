"""Weight extraction: a Hugging Face encoder-decoder -> Seq2SeqWeights, the one layout generation runs.

Done once at load: Q, K, V projections fused into one [3*hidden, hidden] matrix per self-attention
(the decoder's cross-attention keeps Q apart and fuses K | V, since K/V are computed once per batch
from the encoder output while Q is per step); the attention scale head_dim**-0.5 folded into the Q
rows and bias (HF scales q by it inside the projection; the kernels then run with
softmax_scale=1.0); everything cast to the serving dtype on the serving device. Tied tensors
(shared embeddings, an LM head tied to them) stay one tensor after the cast.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .models import ACTIVATIONS, FamilySpec, UnsupportedModelError

__all__ = ["LayerNormWeights", "AttentionWeights", "CrossAttentionWeights", "FFNWeights", "EncoderLayerWeights",
           "DecoderLayerWeights", "StackWeights", "Seq2SeqWeights", "extract", "fairseq_sinusoidal_table"]


@dataclass
class LayerNormWeights:
    weight: torch.Tensor   # [hidden]
    bias: torch.Tensor     # [hidden]
    eps: float


@dataclass
class AttentionWeights:
    """Self-attention of one layer: fused QKV (Q rows pre-scaled), output projection, its LayerNorm."""
    qkv_weight: torch.Tensor   # [3*hidden, hidden]  Q | K | V, Q scaled by head_dim**-0.5
    qkv_bias: torch.Tensor     # [3*hidden]          added by the attention op as it loads Q, K, V
    out_weight: torch.Tensor   # [hidden, hidden]
    out_bias: torch.Tensor     # [hidden]
    ln: LayerNormWeights       # pre-LN: applied to the sublayer input; post-LN: after the residual add


@dataclass
class CrossAttentionWeights:
    q_weight: torch.Tensor     # [hidden, hidden] scaled by head_dim**-0.5
    q_bias: torch.Tensor       # [hidden] scaled likewise
    kv_weight: torch.Tensor    # [2*hidden, hidden]  K | V, applied once per batch to the encoder output
    kv_bias: torch.Tensor      # [2*hidden]
    out_weight: torch.Tensor
    out_bias: torch.Tensor
    ln: LayerNormWeights


@dataclass
class FFNWeights:
    fc1_weight: torch.Tensor   # [ffn, hidden]
    fc1_bias: torch.Tensor
    fc2_weight: torch.Tensor   # [hidden, ffn]
    fc2_bias: torch.Tensor
    ln: LayerNormWeights


@dataclass
class EncoderLayerWeights:
    self_attn: AttentionWeights
    ffn: FFNWeights


@dataclass
class DecoderLayerWeights:
    self_attn: AttentionWeights
    cross_attn: CrossAttentionWeights
    ffn: FFNWeights


@dataclass
class StackWeights:
    """The encoder or the decoder: embeddings, positions, layers, final LayerNorm."""
    num_heads: int
    embed_tokens: torch.Tensor              # [vocab, hidden], unscaled (embed_scale applied at lookup)
    embed_scale: float                      # sqrt(hidden) where config.scale_embedding, else 1.0
    positions: torch.Tensor                 # [rows, hidden]; which row a position reads: FamilySpec.positions
    max_positions: int | None               # longest sequence the table serves; None: grown on demand (M2M100)
    layernorm_embedding: LayerNormWeights | None
    final_layer_norm: LayerNormWeights | None
    layers: list = field(default_factory=list)

    @property
    def hidden(self) -> int:
        return self.embed_tokens.shape[1]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads


@dataclass
class Seq2SeqWeights:
    spec: FamilySpec
    activation: str                          # a value of models.ACTIVATIONS
    encoder: StackWeights
    decoder: StackWeights
    lm_head: torch.Tensor                    # [target_vocab, hidden]
    logits_bias: torch.Tensor | None         # [target_vocab] (final_logits_bias) or None
    pad_token_id: int                        # the embeddings' padding index (M2M100's positions use it)
    # the LM head as the decode step multiplies it (pad_output_projection): rows padded to a multiple of
    # 64 (zeros) and a bias with -inf there; None: lm_head and logits_bias as they are
    output_weight: torch.Tensor | None = None
    output_bias: torch.Tensor | None = None
    # id(weight) -> its copy in mma fragment order (ops.fragments), for each of step_linear_weights() the
    # fragment kernel takes: made by the first step that uses them (DecoderOps.weight_fragments: up to
    # DecoderOps.fragment_step_rows rows) and kept, since larger steps (GEMMs) still read the weights in
    # nn.Linear's layout; None: not made yet
    fragments: dict | None = None
    # per decoder layer, its linear layers folded for decode_gemm (DecoderOps.decode_gemm_layers: pre-LN
    # steps of 17-256 rows), made by the first step that uses them and kept; None: not made yet
    folded: list | None = None

    @property
    def step_lm_head(self) -> torch.Tensor:
        """[V', hidden]: the matrix the decode step's logits GEMM reads (V' >= target_vocab_size)."""
        return self.lm_head if self.output_weight is None else self.output_weight

    @property
    def step_logits_bias(self) -> torch.Tensor | None:
        """[V'] or None: the bias log_softmax_topk adds to the step's logits (-inf on padded ids)."""
        return self.logits_bias if self.output_weight is None else self.output_bias

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.device

    @property
    def source_vocab_size(self) -> int:
        return self.encoder.embed_tokens.shape[0]

    @property
    def target_vocab_size(self) -> int:
        return self.lm_head.shape[0]

    def step_linear_weights(self) -> list[torch.Tensor]:
        """The decoder layers' weights a step multiplies, layer by layer: fused QKV, self-attention output,
        cross-attention Q and output, fc1, fc2 (not the cross-attention K/V, computed once per batch)."""
        return [w for layer in self.decoder.layers
                for w in (layer.self_attn.qkv_weight, layer.self_attn.out_weight, layer.cross_attn.q_weight,
                          layer.cross_attn.out_weight, layer.ffn.fc1_weight, layer.ffn.fc2_weight)]

    def decoder_bytes(self) -> int:
        """Bytes of the decoder weights one step reads (layers, LM head, bias; not the embedding table)."""
        total = self.lm_head.numel() * self.lm_head.element_size()
        if self.logits_bias is not None:
            total += self.logits_bias.numel() * self.logits_bias.element_size()
        for layer in self.decoder.layers:
            for part in (layer.self_attn, layer.cross_attn, layer.ffn):
                for name, value in vars(part).items():
                    if isinstance(value, torch.Tensor) and name not in ("kv_weight", "kv_bias"):
                        total += value.numel() * value.element_size()
        return total


def fairseq_sinusoidal_table(num_embeddings: int, dim: int, padding_idx: int) -> torch.Tensor:
    """M2M100's sinusoidal table, the same float32 ops as M2M100SinusoidalPositionalEmbedding.get_embedding
    (each row depends on its index only, so a longer table agrees with a shorter one where both exist)."""
    half_dim = dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.int64).float() * -emb)
    emb = torch.arange(num_embeddings, dtype=torch.int64).float().unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num_embeddings, -1)
    if dim % 2 == 1:
        emb = torch.cat([emb, torch.zeros(num_embeddings, 1)], dim=1)
    emb[padding_idx, :] = 0
    return emb


class _Caster:
    """Casts tensors to (dtype, device) once, keeping tensors that share storage shared."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self._seen: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        key = (t.data_ptr(), tuple(t.shape))
        if key not in self._seen:
            self._seen[key] = t.detach().to(device=self.device, dtype=self.dtype).contiguous()
        return self._seen[key]

    def new(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=self.device, dtype=self.dtype).contiguous()


def _linear(module, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    if module.bias is None:
        raise UnsupportedModelError(f"{where}: a projection without bias is not supported (every family's "
                                    f"HF class has biases; this module was modified)")
    return module.weight.detach().float(), module.bias.detach().float()


def _ln(module, cast: _Caster, where: str) -> LayerNormWeights:
    if module.weight is None or module.bias is None:
        raise UnsupportedModelError(f"{where}: a LayerNorm without weight and bias (elementwise_affine=False) "
                                    f"is not supported")
    return LayerNormWeights(cast(module.weight), cast(module.bias), float(module.eps))


def _self_attention(attn, ln, cast: _Caster, num_heads: int, where: str) -> AttentionWeights:
    q_w, q_b = _linear(attn.q_proj, where + ".q_proj")
    k_w, k_b = _linear(attn.k_proj, where + ".k_proj")
    v_w, v_b = _linear(attn.v_proj, where + ".v_proj")
    o_w, o_b = _linear(attn.out_proj, where + ".out_proj")
    scale = (q_w.shape[0] // num_heads) ** -0.5
    return AttentionWeights(cast.new(torch.cat([q_w * scale, k_w, v_w])), cast.new(torch.cat([q_b * scale, k_b, v_b])),
                            cast(attn.out_proj.weight), cast(attn.out_proj.bias), _ln(ln, cast, where + " LayerNorm"))


def _cross_attention(attn, ln, cast: _Caster, num_heads: int, where: str) -> CrossAttentionWeights:
    q_w, q_b = _linear(attn.q_proj, where + ".q_proj")
    k_w, k_b = _linear(attn.k_proj, where + ".k_proj")
    v_w, v_b = _linear(attn.v_proj, where + ".v_proj")
    _linear(attn.out_proj, where + ".out_proj")
    scale = (q_w.shape[0] // num_heads) ** -0.5
    return CrossAttentionWeights(cast.new(q_w * scale), cast.new(q_b * scale), cast.new(torch.cat([k_w, v_w])),
                                 cast.new(torch.cat([k_b, v_b])), cast(attn.out_proj.weight),
                                 cast(attn.out_proj.bias), _ln(ln, cast, where + " LayerNorm"))


def _ffn(layer, cast: _Caster, where: str) -> FFNWeights:
    _linear(layer.fc1, where + ".fc1")
    _linear(layer.fc2, where + ".fc2")
    return FFNWeights(cast(layer.fc1.weight), cast(layer.fc1.bias), cast(layer.fc2.weight), cast(layer.fc2.bias),
                      _ln(layer.final_layer_norm, cast, where + ".final_layer_norm"))


def _positions(stack, spec: FamilySpec, config, cast: _Caster, pad: int) -> tuple[torch.Tensor, int | None]:
    module = stack.embed_positions
    if spec.positions == "marian":
        return cast(module.weight), module.weight.shape[0]
    if spec.positions == "learned":
        return cast(module.weight), module.weight.shape[0] - 2   # rows = max_position_embeddings + offset 2
    # fairseq: HF computes the table (a non-persistent buffer) and grows it past its size on demand
    table = fairseq_sinusoidal_table(module.weights.shape[0], config.d_model, pad)
    return cast.new(table), None


def _stack(stack, side: str, spec: FamilySpec, config, cast: _Caster, pad: int) -> StackWeights:
    heads = getattr(config, f"{side}_attention_heads")
    positions, max_positions = _positions(stack, spec, config, cast, pad)
    embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
    layers = []
    for i, layer in enumerate(stack.layers):
        where = f"{spec.hf_class}.{side}.layers[{i}]"
        self_attn = _self_attention(layer.self_attn, layer.self_attn_layer_norm, cast, heads, where + ".self_attn")
        ffn = _ffn(layer, cast, where)
        if side == "encoder":
            layers.append(EncoderLayerWeights(self_attn, ffn))
        else:
            cross = _cross_attention(layer.encoder_attn, layer.encoder_attn_layer_norm, cast, heads,
                                     where + ".encoder_attn")
            layers.append(DecoderLayerWeights(self_attn, cross, ffn))
    ln_emb = _ln(stack.layernorm_embedding, cast, f"{side}.layernorm_embedding") if spec.layernorm_embedding else None
    final = _ln(stack.layer_norm, cast, f"{side}.layer_norm") if spec.final_layer_norms else None
    return StackWeights(heads, cast(stack.embed_tokens.weight), embed_scale, positions, max_positions, ln_emb,
                        final, layers)


def extract(model: torch.nn.Module, spec: FamilySpec, dtype: torch.dtype, device: torch.device) -> Seq2SeqWeights:
    """Seq2SeqWeights of `model` (a class of `spec`'s family, config already validated) in dtype on device."""
    config = model.config
    base = model.model
    pad = config.pad_token_id
    if pad is None:
        raise UnsupportedModelError(f"{spec.hf_class} config: pad_token_id is None; the embeddings' padding "
                                    f"index (and M2M100's positions) need it")
    cast = _Caster(dtype, device)
    encoder = _stack(base.encoder, "encoder", spec, config, cast, pad)
    decoder = _stack(base.decoder, "decoder", spec, config, cast, pad)
    lm_head = cast(model.lm_head.weight)
    if getattr(model.lm_head, "bias", None) is not None:
        raise UnsupportedModelError(f"{spec.hf_class}: an lm_head with a bias is not supported "
                                    f"(the family's bias is final_logits_bias)")
    logits_bias = None
    if spec.logits_bias:
        logits_bias = cast.new(model.final_logits_bias.detach().reshape(-1))
        if logits_bias.shape[0] != lm_head.shape[0]:
            raise UnsupportedModelError(f"{spec.hf_class}: final_logits_bias has {logits_bias.shape[0]} entries "
                                        f"but the LM head {lm_head.shape[0]} rows")
    return Seq2SeqWeights(spec, ACTIVATIONS[config.activation_function], encoder, decoder, lm_head, logits_bias,
                          int(pad))


def pad_output_projection(weights: Seq2SeqWeights, multiple: int = 64) -> None:
    """Pad the LM head to a multiple of `multiple` rows for the decode step's logits GEMM.

    Why: a vocabulary that is not a multiple of 8 (Marian's 58101, NLLB's 256206) makes the logits
    GEMM's output rows misaligned, and cuBLAS falls back to an align-1 kernel several times slower than
    the weight read (42 us instead of ~15 for Marian-base at 4 rows, measured on an H200). The padded
    rows are zeros and the step's bias puts -inf there, so log-softmax, top-k and sampling never see
    them. No copy is kept: the padded table is allocated once and lm_head (and a tied embedding
    table) become views of its first rows."""
    old = weights.lm_head
    vocab, hidden = old.shape
    padded = -(-vocab // multiple) * multiple
    if padded == vocab:
        return
    table = torch.zeros(padded, hidden, dtype=old.dtype, device=old.device)
    table[:vocab] = old
    view = table[:vocab]
    for holder, name in ((weights, "lm_head"), (weights.decoder, "embed_tokens"), (weights.encoder, "embed_tokens")):
        if getattr(holder, name) is old:
            setattr(holder, name, view)
    bias = torch.full((padded,), float("-inf"), dtype=old.dtype, device=old.device)
    bias[:vocab] = 0.0 if weights.logits_bias is None else weights.logits_bias
    weights.output_weight, weights.output_bias = table, bias
