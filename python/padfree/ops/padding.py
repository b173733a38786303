"""Placeholder until the padding bindings land: keeps `import padfree.ops` working meanwhile."""


def _not_yet(*args, **kwargs):
    raise NotImplementedError("padfree.ops.padding is not implemented yet")


cu_seqlens_from_mask = cu_seqlens_from_seqlens = rebuild_padding = remove_padding = _not_yet
