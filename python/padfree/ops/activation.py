"""Placeholder until the activation bindings land: keeps `import padfree.ops` working meanwhile."""


def _not_yet(*args, **kwargs):
    raise NotImplementedError("padfree.ops.activation is not implemented yet")
bias_gelu = _not_yet
