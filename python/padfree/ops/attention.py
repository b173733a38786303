"""Placeholder until the attention bindings land: keeps `import padfree.ops` working meanwhile."""


def _not_yet(*args, **kwargs):
    raise NotImplementedError("padfree.ops.attention is not implemented yet")
attention_varlen = _not_yet
