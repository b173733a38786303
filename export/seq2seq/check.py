"""The CPU proof of a seq2seq export: ONNX Runtime generation vs Hugging Face's generate, float32.

The export's graphs generate through padfree.runtime's OnnxrtSeq2SeqGenerator (padfree.generation's
own searches, the step's logits from decoder_step.onnx) on one batch of sources of mixed lengths
(the first two exactly the longest and 1 token long; ids never a special token), greedy and beam
search, and the reference model generates the same batch with HF's generate and the same options.
Both decoder steps are checked: decoder_step.onnx (the sites) and decoder_step.padfree.onnx (the
plugin nodes, run through their ONNX Runtime references, export/reference.py): the swap is proven
by the same comparison as the step it came from. An export in fp16 / bf16 has its engine graphs
(encoder.<dtype>.onnx, cross_kv.<dtype>.onnx, decoder_step.padfree.onnx) in that dtype: they run cast
back to float32 and are compared, by the same rules, with the float32 graphs whose every value is
rounded to the dtype (export/precision.py's round_values): both compute in float32 on the same values,
so the rules and tolerances stay float32's; the fp16 / bf16 arithmetic is the GPU tests'.

An export with a generation graph (generation.padfree.onnx: a whole greedy generation, encoder to
tokens, in one graph) has it run too, on the references of its plugin nodes (the Loop body's
included), against HF's greedy generate of its max_new_tokens.

Greedy must give HF's tokens exactly. Beam search (num_beams hypotheses returned per source) must give
HF's tokens and sequences_scores within `tol` (default: 1e-4 per 12 layers of the deeper stack, at least
1e-4, the encoder check's rule: the two sides sum in different orders and the difference grows with
depth) for every hypothesis whose score is more than `tol`
from its neighbours' in HF's ranking; closer ones are near-ties (float rounding may order them either
way), counted and reported, and at most a quarter of the hypotheses may be near-ties (more means the
batch cannot tell a right step from a slightly wrong one). A wrong weight or a wrong op changes
tokens or scores far past 1e-4 on such models; rounding differences between ONNX Runtime's and
torch's float32 kernels stay around 1e-6.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from padfree.generation.inputs import padded_batch

from ..compare import FP32_RTOL_PER_12_LAYERS

__all__ = ["CheckResult", "check", "draw_sources", "fp32_tolerance"]


def fp32_tolerance(manifest: dict) -> float:
    """The sequences_scores tolerance for an export described by its seq2seq.json."""
    layers = max(manifest["encoder"]["layers"], manifest["decoder"]["layers"])
    return FP32_RTOL_PER_12_LAYERS * max(1.0, layers / 12)


@dataclass
class CheckResult:
    ok: bool
    lines: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


def draw_sources(config, batch: int, max_seqlen: int, seed: int) -> list[list[int]]:
    special = {getattr(config, name, None) for name in ("pad_token_id", "eos_token_id", "bos_token_id",
                                                        "decoder_start_token_id", "forced_eos_token_id")}
    allowed = torch.tensor([i for i in range(config.vocab_size) if i not in special])
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_seqlen + 1, (batch,), generator=gen).tolist()
    lengths[:2] = [max_seqlen, 1][:batch]
    return [allowed[torch.randint(len(allowed), (n,), generator=gen)].tolist() for n in lengths]



def _hf(model, sources, **options):
    ids, mask = padded_batch(sources, model.config.pad_token_id)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=mask, **options)


def _pad_to(t: torch.Tensor, width: int, fill: int) -> torch.Tensor:
    if t.shape[1] >= width:
        return t
    return torch.cat([t, torch.full((t.shape[0], width - t.shape[1]), fill, dtype=t.dtype)], dim=1)


def _fill(model) -> int:
    gc = model.generation_config
    pad = gc.pad_token_id if gc.pad_token_id is not None else gc.eos_token_id
    eos = gc.eos_token_id[0] if isinstance(gc.eos_token_id, list) else gc.eos_token_id
    return pad if pad else eos


def check(out_dir, reference, batch: int = 8, max_seqlen: int = 16, max_new_tokens: int = 16, num_beams: int = 4,
          seed: int = 0, tol: float | None = None, generator=None, steps: tuple[str, ...] | None = None) -> CheckResult:
    """reference: the HF model (object) the export came from. generator: an OnnxrtSeq2SeqGenerator over
    out_dir (then only it is checked). steps: which decoder steps generate, "plain" (decoder_step.onnx)
    and "plugins" (decoder_step.padfree.onnx, its plugin nodes expanded by their ONNX Runtime
    references); default both where the export has the second. HF generates once; every step is
    compared with it and must pass, but an fp16 / bf16 export's "plugins" graphs, which are compared
    with its float32 graphs rounded to that dtype."""
    from padfree.runtime.backends.onnxrt_seq2seq import OnnxrtSeq2SeqGenerator

    manifest = json.loads((Path(out_dir) / "seq2seq.json").read_text())
    dtype = manifest.get("dtype", "fp32")
    if tol is None:
        tol = fp32_tolerance(manifest)
    if generator is not None:
        generators = [(generator.step_kind, generator)]
    else:
        if steps is None:
            steps = ("plain", "plugins") if "decoder_step_plugins" in manifest["files"] else ("plain",)
        generators = [(kind, OnnxrtSeq2SeqGenerator(out_dir, step=kind)) for kind in steps]
    model = reference.float().eval()
    max_seqlen = min(max_seqlen, generators[0][1].encoder_positions)
    sources = draw_sources(model.config, batch, max_seqlen, seed)
    result = CheckResult(True, lengths=[len(s) for s in sources])
    fill = _fill(model)
    greedy = dict(max_new_tokens=max_new_tokens, num_beams=1, num_return_sequences=1, do_sample=False)
    beam = dict(max_new_tokens=max_new_tokens, num_beams=num_beams, num_return_sequences=num_beams,
                do_sample=False, return_dict_in_generate=True, output_scores=True)
    hf = (_hf(model, sources, **greedy), _hf(model, sources, **beam), "HF's")
    rounded = None
    for kind, gen in generators:
        reference = hf
        if kind == "plugins" and dtype != "fp32":
            if rounded is None:
                ref = OnnxrtSeq2SeqGenerator(out_dir, step="plain", rounded=True)
                rounded = (ref.generate(sources, **greedy), ref.generate(sources, **beam),
                           f"the float32 graphs' rounded to {dtype}")
            reference = rounded
        ref_greedy, ref_beam, name = reference
        label = _label(gen)
        ok_greedy = _compare_greedy(result, label, ref_greedy, gen.generate(sources, **greedy), batch, fill, name)
        ok_beam = _compare_beam(result, label, ref_beam, gen.generate(sources, **beam), batch, num_beams, fill, tol,
                                name)
        result.ok = result.ok and ok_greedy and ok_beam
    if "generation" in manifest:
        generators = gen = rounded = None   # their sessions hold every weight, as the joined graph does again
        result.ok = _check_generation_graph(result, Path(out_dir), manifest, model, sources, fill, tol) and result.ok
    return result


def _check_generation_graph(result: CheckResult, out_dir: Path, manifest: dict, model, sources, fill: int,
                            tol: float) -> bool:
    """generation.padfree.onnx against HF's generate of its max_new_tokens (float32), or, for an fp16 /
    bf16 export, cast back to float32 against the float32 step graphs rounded to the dtype (the other
    engine graphs' rule)."""
    from padfree.runtime.backends.onnxrt_seq2seq import OnnxrtSeq2SeqGenerator

    facts, dtype, batch = manifest["generation"], manifest.get("dtype", "fp32"), len(sources)
    graph, scores = _run_generation_graph(out_dir, manifest, sources, dtype)
    n = facts["max_new_tokens"]
    label = (f"{manifest['files']['generation']} (one graph: the encoder, cross_kv and a Loop of {n} "
             f"{facts['search']} steps{'' if dtype == 'fp32' else f', {dtype} cast back to float32'})")
    beam = facts["search"] == "beam"
    options = dict(max_new_tokens=n, num_beams=facts.get("num_beams", 1),
                   num_return_sequences=facts.get("num_return_sequences", 1), do_sample=False,
                   **({"return_dict_in_generate": True, "output_scores": True} if beam else {}))
    if dtype == "fp32":
        reference, name = _hf(model, sources, **options), f"HF's ({n} new tokens)"
    else:
        rounded = OnnxrtSeq2SeqGenerator(out_dir, step="plain", rounded=True)
        reference = rounded.generate(sources, **options)
        name = f"the float32 graphs' rounded to {dtype} ({n} new tokens)"
    if beam:
        returned = options["num_return_sequences"]
        found = _Generated(torch.from_numpy(graph.reshape(batch * returned, -1)).long(),
                           torch.from_numpy(scores.reshape(-1)))
        return _compare_beam(result, label, reference, found, batch, returned, fill, tol, name,
                             beams=options["num_beams"])
    ok = _compare_greedy(result, label, reference, torch.from_numpy(graph).long(), batch, fill, name)
    # HF stops once every source has ended; the graph runs its fixed N steps, the rest pad
    return ok or _equal_up_to_padding(reference, graph, fill)


@dataclass
class _Generated:
    sequences: torch.Tensor
    sequences_scores: torch.Tensor


def _run_generation_graph(out_dir: Path, manifest: dict, sources: list[list[int]], dtype: str = "fp32"):
    """generation.padfree.onnx on ONNX Runtime (its plugin nodes, the Loop body's too, on their
    references; an fp16 / bf16 graph cast back to float32): (sequences [B, 1 + N] or [B, n_ret, 1 + N],
    scores [B, n_ret] or None), as the graph returns them (all N steps, no trimming)."""
    from padfree.runtime.backends.onnxrt_generation import generation_session, run_generation_graph

    session = generation_session(out_dir / manifest["files"]["generation"], dtype)
    found = run_generation_graph(session, sources)
    return found["sequences"], found.get("scores")


def _equal_up_to_padding(reference: torch.Tensor, graph, fill: int) -> bool:
    width = max(reference.shape[1], graph.shape[1])
    return bool((_pad_to(reference, width, fill) == _pad_to(torch.from_numpy(graph).long(), width, fill)).all())


def _label(gen) -> str:
    if gen.step_kind == "plain":
        return gen.step_file.name
    label = (f"{gen.step_file.name} (plugin nodes on their ONNX Runtime references; num_beams {gen.step_num_beams} "
             f"as exported, other widths with that field set to theirs)")
    if gen.dtype == "fp32" and not gen.packed_encoder:
        return label
    label = f"{gen.graph_files['encoder'].name} + {gen.graph_files['cross_kv'].name} + {label}"
    return label if gen.dtype == "fp32" else f"{label}, {gen.dtype} cast back to float32"


def _compare_greedy(result: CheckResult, label: str, ref, out, batch: int, fill: int, name: str = "HF's") -> bool:
    width = max(ref.shape[1], out.shape[1])
    same = (_pad_to(ref, width, fill) == _pad_to(out, width, fill)).all(dim=1)
    result.lines.append(f"{label}: greedy: {int(same.sum())} of {batch} sequences equal {name} token for token "
                        f"(lengths reference {ref.shape[1]}, padfree {out.shape[1]})")
    for b in (~same).nonzero().flatten().tolist()[:3]:
        result.lines.append(f"  source {b}: reference {ref[b].tolist()} vs {out[b].tolist()}")
    return bool(same.all()) and ref.shape == out.shape


def _compare_beam(result: CheckResult, label: str, ref, out, batch: int, num_beams: int, fill: int,
                  tol: float, name: str = "HF's", beams: int | None = None) -> bool:
    """num_beams: the hypotheses returned per source; beams: the search's width where it is wider."""
    width = max(ref.sequences.shape[1], out.sequences.shape[1])
    rs = _pad_to(ref.sequences, width, fill).view(batch, num_beams, width)
    ps = _pad_to(out.sequences, width, fill).view(batch, num_beams, width)
    rsc, psc = ref.sequences_scores.view(batch, num_beams), out.sequences_scores.view(batch, num_beams)
    near, compared, wrong, worst = 0, 0, [], 0.0
    for b in range(batch):
        for i in range(num_beams):
            if any(abs(float(rsc[b, i] - rsc[b, j])) <= tol for j in (i - 1, i + 1) if 0 <= j < num_beams):
                near += 1
                continue
            compared += 1
            error = abs(float(rsc[b, i] - psc[b, i]))
            worst = max(worst, error)
            if not torch.equal(rs[b, i], ps[b, i]) or error > tol:
                wrong.append((b, i, error))
    total = batch * num_beams
    result.lines.append(f"{label}: beam search ({beams or num_beams} beams, {num_beams} returned): "
                        f"{compared - len(wrong)} of "
                        f"{compared} hypotheses equal {name} with sequences_scores within {tol:g} (max error "
                        f"{worst:.2e}); near-ties (not compared): {near} of {total}")
    for b, i, _error in wrong[:3]:
        result.lines.append(f"  source {b} rank {i}: reference {rs[b, i].tolist()} ({float(rsc[b, i]):.6f}) vs "
                            f"{ps[b, i].tolist()} ({float(psc[b, i]):.6f})")
    if near > total // 4:
        result.lines.append(f"  {near} near-ties: this batch cannot tell the export right from slightly wrong")
    return not wrong and near <= total // 4
