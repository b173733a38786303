"""The CPU proof of a seq2seq export: ONNX Runtime generation vs Hugging Face's generate, float32.

The export's three graphs generate through padfree.runtime's OnnxrtSeq2SeqGenerator (padfree.generation's
own searches, the step's logits from decoder_step.onnx) on one batch of sources of mixed lengths
(the first two exactly the longest and 1 token long; ids never a special token), greedy and beam
search, and the reference model generates the same batch with HF's generate and the same options.

Greedy must give HF's tokens exactly. Beam search (num_beams hypotheses returned per source) must give
HF's tokens and sequences_scores within `tol` for every hypothesis whose score is more than `tol`
from its neighbours' in HF's ranking; closer ones are near-ties (float rounding may order them either
way), counted and reported, and at most a quarter of the hypotheses may be near-ties (more means the
batch cannot tell a right step from a slightly wrong one). A wrong weight or a wrong op changes
tokens or scores far past 1e-4 on such models; rounding differences between ONNX Runtime's and
torch's float32 kernels stay around 1e-6.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from padfree.generation.inputs import padded_batch

__all__ = ["CheckResult", "check", "draw_sources"]


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
          seed: int = 0, tol: float = 1e-4, generator=None) -> CheckResult:
    """reference: the HF model (object) the export came from. generator: an OnnxrtSeq2SeqGenerator over
    out_dir (made here when None)."""
    if generator is None:
        from padfree.runtime.backends.onnxrt_seq2seq import OnnxrtSeq2SeqGenerator
        generator = OnnxrtSeq2SeqGenerator(out_dir)
    model = reference.float().eval()
    max_seqlen = min(max_seqlen, generator.encoder_positions)
    sources = draw_sources(model.config, batch, max_seqlen, seed)
    result = CheckResult(True, lengths=[len(s) for s in sources])

    ref = _hf(model, sources, max_new_tokens=max_new_tokens, num_beams=1, do_sample=False)
    out = generator.generate(sources, max_new_tokens=max_new_tokens, num_beams=1, do_sample=False)
    width = max(ref.shape[1], out.shape[1])
    fill = _fill(model)
    same = (_pad_to(ref, width, fill) == _pad_to(out, width, fill)).all(dim=1)
    greedy_ok = bool(same.all()) and ref.shape == out.shape
    result.lines.append(f"greedy: {int(same.sum())} of {batch} sequences equal HF's token for token "
                        f"(lengths HF {ref.shape[1]}, padfree {out.shape[1]})")
    for b in (~same).nonzero().flatten().tolist()[:3]:
        result.lines.append(f"  source {b}: HF {ref[b].tolist()} vs {out[b].tolist()}")

    options = dict(max_new_tokens=max_new_tokens, num_beams=num_beams, num_return_sequences=num_beams,
                   do_sample=False, return_dict_in_generate=True, output_scores=True)
    ref = _hf(model, sources, **options)
    out = generator.generate(sources, **options)
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
    beam_ok = not wrong and near <= total // 4
    result.lines.append(f"beam search ({num_beams} beams, {num_beams} returned): {compared - len(wrong)} of {compared} "
                        f"hypotheses equal HF's with sequences_scores within {tol:g} (max error {worst:.2e}); "
                        f"near-ties (not compared): {near} of {total}")
    for b, i, _error in wrong[:3]:
        result.lines.append(f"  source {b} rank {i}: HF {rs[b, i].tolist()} ({float(rsc[b, i]):.6f}) vs "
                            f"{ps[b, i].tolist()} ({float(psc[b, i]):.6f})")
    if near > total // 4:
        result.lines.append(f"  {near} near-ties: this batch cannot tell the export right from slightly wrong")
    result.ok = greedy_ok and beam_ok
    return result
