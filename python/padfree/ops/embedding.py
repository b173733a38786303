"""Placeholder until the embedding bindings land: keeps `import padfree.ops` working meanwhile."""


def _not_yet(*args, **kwargs):
    raise NotImplementedError("padfree.ops.embedding is not implemented yet")
embedding_layernorm = _not_yet
