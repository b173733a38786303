"""The rewrite passes, one per module, each `run(graph, ctx) -> graph` recording into ctx a PassReport.

Order matters: shared_weights folds the exporter's Transposes of shared weights into constants, which
the others expect; embeddings, attention, skip_layernorm and bias_gelu replace subgraphs with plugin
nodes on packed token rows; pooler gathers each sequence's first row; sentence pools each
sequence's rows (sentence-similarity models only); layout makes every remaining
tensor consistent with the chosen I/O form and drops the padding-mask plumbing.
"""
from . import attention, bias_gelu, embeddings, layout, pooler, sentence, shared_weights, skip_layernorm

PIPELINE = (shared_weights, embeddings, attention, skip_layernorm, bias_gelu, pooler, sentence, layout)
