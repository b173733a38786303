"""decoder_step.onnx -> decoder_step.padfree.onnx: each recorded site (ops.py) becomes one plugin node.

Rules, and why:
- Mechanical, from the record: a site's nodes are those named inside its scope, its arguments and
  outputs are named in `padfree.sites` (ops.site_problems proves the site closed before anything is
  removed). The plugin node takes the spec's input order (plugins/spec/plugins.json) from the site's
  roles, so a port added to the spec without a role here fails the swap, not the engine.
- Fields follow the spec (spec.node_attributes: every field present, typed, nothing unknown), taken
  from the site; `num_beams` of the cross-attention is the one field the site cannot know (its
  subgraph derives rows / batch): the swap is told the width of the engine it prepares.
- num_beams is fixed at export (`padfree export --num-beams N`, default the model's
  generation_config.num_beams). The kernel maps hypothesis r to source r // num_beams and refuses
  rows != batch * num_beams, so an engine serves one beam width; a field fixed in the file is what
  TensorRT serializes, and deriving it at run time would need a shape input the plugin does not have.
  Greedy search on a beam engine is beam search's width; another width is another swap (set_num_beams)
  and another engine.
- The cross-attention plugin reads a `max_seqlen` shape input (only its length: an upper bound of the
  longest source, which sizes its workspace per profile); the site has none (its subgraph masks by
  cu_seqlens alone), so the swapped step gains a graph input `max_seqlen` int32 [max_source_len],
  inserted after cu_seqlens. Callers pass any int32 vector as long as the longest source.
- The caches stay graph inputs and outputs (`past_key.i` -> `present_key.i`): the self-attention
  plugin aliases its cache outputs to its cache inputs (docs/PLUGINS.md), so an engine writes in place.
- Then the step is checked as the encoder rewrite checks its result: shapes.infer through the plugin
  ports (a plugin wired to a tensor of the wrong shape fails here) and onnx.checker (full check).
"""
from __future__ import annotations

import json

import onnx
from onnx import TensorProto, helper

from .. import shapes, spec as spec_mod
from ..errors import ExportError
from .ops import CROSS_ATTENTION, SITES_KEY, site_nodes, site_problems, sites_metadata, sites_of

__all__ = ["swap_sites", "set_num_beams", "num_beams_of", "MAX_SEQLEN", "NUM_BEAMS_KEY", "step_io"]

MAX_SEQLEN = "max_seqlen"
MAX_SEQLEN_DIM = "max_source_len"
NUM_BEAMS_KEY = "padfree.num_beams"
_EXTRA_INPUTS = {CROSS_ATTENTION: {"max_seqlen": MAX_SEQLEN}}  # spec ports a site has no role for


def swap_sites(model: onnx.ModelProto, num_beams: int, spec: spec_mod.Spec | None = None) -> onnx.ModelProto:
    """A copy of the plain step with every site replaced by its plugin node; raises ExportError."""
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ExportError(f"num_beams must be a positive integer, got {num_beams!r}")
    spec = spec or spec_mod.load()
    sites = sites_of(model)
    if not sites:
        raise ExportError("the decoder step records no sites (metadata padfree.sites): export it again")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    needs_max_seqlen = False
    for site in sites:
        problems = site_problems(out, site)
        if problems:
            raise ExportError(f"site {site.scope} ({site.op}) is not closed: {'; '.join(problems[:5])}")
        if site.op not in spec.plugins:
            raise ExportError(f"site {site.scope}: {site.op} is not a plugin of the spec ({', '.join(spec.plugins)})")
        plugin = spec[site.op]
        fields = dict(site.fields)
        if "num_beams" in plugin.fields:
            fields["num_beams"] = num_beams
        try:
            attrs = spec.node_attributes(site.op, fields)
        except (ValueError, TypeError) as e:
            raise ExportError(f"site {site.scope}: {e}") from e
        roles = {**site.inputs, **_EXTRA_INPUTS.get(site.op, {})}
        try:
            inputs = [roles[name] for name in plugin.input_names(attrs)]
        except KeyError as e:
            raise ExportError(f"site {site.scope}: the spec's {site.op} takes {e.args[0]!r}, which the site does "
                              f"not record (roles {sorted(roles)})") from e
        needs_max_seqlen |= MAX_SEQLEN in inputs
        results = list(site.outputs.values())
        if len(results) != len(plugin.output_names(attrs)):
            raise ExportError(f"site {site.scope}: outputs {list(site.outputs)}, the spec's {site.op} has "
                              f"{plugin.output_names(attrs)}")
        removed = site_nodes(out, site)
        first = list(graph.node).index(removed[0])
        names = {id(n) for n in removed}
        kept = [n for n in graph.node if id(n) not in names]
        node = helper.make_node(site.op, inputs, results, name=site.scope, domain=spec.namespace, **attrs)
        kept.insert(first, node)
        del graph.node[:]
        graph.node.extend(kept)
        site.fields = {k: v for k, v in attrs.items() if k in plugin.fields}
    if needs_max_seqlen:
        at = [i.name for i in graph.input].index("cu_seqlens") + 1
        vi = helper.make_tensor_value_info(MAX_SEQLEN, TensorProto.INT32, [MAX_SEQLEN_DIM])
        inputs = list(graph.input)
        inputs.insert(at, vi)
        del graph.input[:]
        graph.input.extend(inputs)
    _drop_unused_initializers(graph)
    if spec.namespace not in {o.domain for o in out.opset_import}:
        out.opset_import.append(helper.make_opsetid(spec.namespace, int(spec.version)))
    meta = {p.key: p.value for p in out.metadata_props}
    meta.update({SITES_KEY: sites_metadata(sites), NUM_BEAMS_KEY: str(num_beams),
                 "padfree.spec_version": spec.version})
    del out.metadata_props[:]
    helper.set_model_props(out, meta)
    del graph.value_info[:]
    return shapes.infer_checked(out, spec, shapes.output_dims(model), "the swapped decoder step")


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def num_beams_of(model: onnx.ModelProto) -> int | None:
    """The cross-attention nodes' num_beams (one value for the graph), None without such nodes."""
    values = {helper.get_attribute_value(a) for n in model.graph.node if n.op_type == CROSS_ATTENTION
              for a in n.attribute if a.name == "num_beams"}
    if len(values) > 1:
        raise ExportError(f"the decoder step's cross-attention nodes disagree on num_beams: {sorted(values)}")
    return values.pop() if values else None


def set_num_beams(model: onnx.ModelProto, num_beams: int) -> onnx.ModelProto:
    """A copy with every cross-attention node's num_beams field (and the metadata) set: the step of
    another beam width; the only field that depends on it."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        if node.op_type == CROSS_ATTENTION:
            for a in node.attribute:
                if a.name == "num_beams":
                    a.i = num_beams
    meta = {p.key: p.value for p in out.metadata_props}
    if NUM_BEAMS_KEY in meta:
        meta[NUM_BEAMS_KEY] = str(num_beams)
        sites = json.loads(meta.get(SITES_KEY, "[]"))
        for s in sites:
            if "num_beams" in s.get("fields", {}):
                s["fields"]["num_beams"] = num_beams
        meta[SITES_KEY] = json.dumps(sites)
        del out.metadata_props[:]
        helper.set_model_props(out, meta)
    return out


def step_io(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits], [o.name for o in model.graph.output]
