"""Kernel bindings on torch tensors: one module per kernel family, mirroring plugins/kernels.

All functions take contiguous CUDA tensors, enqueue on torch's current stream, never synchronize,
and raise InputError (a ValueError) for a bad dtype, device, layout or shape.
"""
from . import graph_edges  # noqa: F401
from ._tensors import InputError  # noqa: F401
from .activation import bias_gelu  # noqa: F401
from .attention import attention_varlen  # noqa: F401
from .decode_gemm import decode_gemm  # noqa: F401
from .decoder import (  # noqa: F401
    cross_attention,
    decode_linear,
    decoder_self_attention,
    decoder_step_embedding,
)
from .decoding import beam_reorder_cache_indir, log_softmax_topk  # noqa: F401
from .embedding import embedding_layernorm  # noqa: F401
from .fragments import FragmentWeight, fragment_layout  # noqa: F401
from .graph_guard import GuardedGraph  # noqa: F401
from .inputs import PaddedInputPacker, pack_padded_inputs, padded_input_stats, stream_synchronize  # noqa: F401
from .layernorm import layernorm, skip_layernorm  # noqa: F401
from .padding import (  # noqa: F401
    cu_seqlens_from_mask,
    cu_seqlens_from_seqlens,
    pack_from_mask,
    pack_from_seqlens,
    rebuild_padding,
    remove_padding,
)
from .pooling import sequence_pool  # noqa: F401
from .search import beam_search_step, greedy_step  # noqa: F401
