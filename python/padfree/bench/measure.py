"""One process's measurements for `padfree bench`: the models, each shape's row and the result
record. padfree.bench.processes runs one of these per system; padfree.commands.bench drives both."""
from __future__ import annotations

import datetime
import json
import time

from .. import env
from .timing import floor_graph, host_loop_ms, kernel_profile, lengths_for, time_ms, torch_attention_ops


def _shape(text: str) -> tuple[int, int]:
    batch, max_seqlen = text.lower().split("x")
    return int(batch), int(max_seqlen)


def build_models(layers: int, hf_impls: tuple[str, ...], with_padfree: bool, gemm_search: str = "heuristic",
                 gemm_tuning: str | None = None, programmatic_edges: bool = False):
    """BERT-base with random weights (seed 0) in fp16 on the GPU: HF copies (attn_implementation in
    hf_impls) and padfree's encoder (or None)."""
    import torch
    import transformers

    import padfree.torch as pt
    config = transformers.BertConfig(num_hidden_layers=layers)  # defaults are BERT-base
    torch.manual_seed(0)
    source = transformers.BertModel(config).eval()
    models = {}
    for impl in hf_impls:
        model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=layers, attn_implementation=impl))
        model.load_state_dict(source.state_dict())
        models[impl] = model.to(device="cuda", dtype=torch.float16).eval()
    encoder = pt.from_hf(source, dtype=torch.float16, device="cuda", gemm_search=gemm_search,
                         gemm_tuning=gemm_tuning, programmatic_edges=programmatic_edges) if with_padfree else None
    return models, encoder


def bench_shape(batch: int, max_seqlen: int, timed: dict, args, vocab_size: int) -> dict:
    """One shape's row. timed: {"hf": {impl: model}, "compile": module, "padfree": encoder,
    "varlen_attn": encoder, "reference": HF sdpa model for padfree's accuracy}, each where present."""
    import torch
    lengths = lengths_for(batch, max_seqlen)
    tokens = sum(lengths)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1000, vocab_size, (batch, max_seqlen), generator=gen)
    mask = (torch.arange(max_seqlen)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids, mask = (ids * mask).cuda(), mask.cuda()
    row = {"batch": batch, "max_seqlen": max_seqlen, "total_tokens": tokens, "longest": max(lengths),
           "padding_fraction": 1 - tokens / (batch * max_seqlen), "ms": {}}
    ms = row["ms"]
    with torch.no_grad():
        for impl, model in timed.get("hf", {}).items():
            ms[f"hf_{impl}"] = time_ms(lambda: model(input_ids=ids, attention_mask=mask), args.reps, args.warmup)  # noqa: B023 - timed here
        if "compile" in timed:
            ms["compile"] = time_ms(lambda: timed["compile"](input_ids=ids, attention_mask=mask), args.reps,
                                    max(args.warmup, 5))
        if "padfree" in timed:
            _bench_padfree(row, ids, mask, lengths, timed, args)
    add_ratios(row)
    return row


def _bench_padfree(row: dict, ids, mask, lengths: list[int], timed: dict, args) -> None:
    import torch
    encoder, fa_encoder, ms = timed["padfree"], timed.get("varlen_attn"), row["ms"]
    t0 = time.perf_counter()
    encoder(ids, mask)  # captures the bucket's graph, tuning its GEMMs first
    torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - t0
    ms["padfree"] = time_ms(lambda: encoder(ids, mask), args.reps, args.warmup)
    ms["padfree_gpu"] = time_ms(lambda: encoder(ids, mask), args.reps, args.warmup, gpu_only=True)
    ids_cpu, mask_cpu = ids.cpu(), mask.cpu()
    ms["padfree_host_inputs"] = time_ms(lambda: encoder(ids_cpu, mask_cpu), args.reps, args.warmup)
    packed = {"input_ids": ids[mask.bool()].to(torch.int32),
              "cu_seqlens": torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32),
              "max_seqlen": max(lengths)}
    ms["padfree_packed"] = time_ms(lambda: encoder.forward_packed(**packed), args.reps, args.warmup)
    if fa_encoder is not None:
        ms["padfree_packed_with_varlen_attn"] = time_ms(lambda: fa_encoder.forward_packed(**packed),
                                                       args.reps, args.warmup)
    ms["floor"], flops = floor_graph(encoder.weights, row["total_tokens"], args.reps)
    row["floor_tflops"] = flops / (ms["floor"] * 1e-3) / 1e12
    # accuracy after every timing: the reference's kernels run on the caller's stream only
    valid = mask.bool()
    ours = encoder(ids, mask).last_hidden_state.float()
    if "reference" in timed:
        ref = timed["reference"](input_ids=ids, attention_mask=mask).last_hidden_state.float()
        row["rel_err_vs_hf_sdpa"] = float((ours[valid] - ref[valid]).norm() / ref[valid].norm())
    if fa_encoder is not None:
        ref = fa_encoder(ids, mask).last_hidden_state.float()
        row["rel_err_vs_varlen_attn_variant"] = float((ours[valid] - ref[valid]).norm() / ref[valid].norm())
    row["bucket"] = encoder.graph_buckets[-1]._asdict()
    row["gemms"] = encoder.gemm_choices(encoder.graph_buckets[-1])
    if args.profile:
        row["profile_mode"], row["profile"] = kernel_profile(encoder, packed)


def add_ratios(row: dict) -> None:
    """The ratios of the columns present (the systems' processes merge their times first)."""
    ms, ratios = row["ms"], {}
    if "padfree" in ms and "floor" in ms:
        ratios["padfree_over_floor"] = ms["padfree"] / ms["floor"]
        ratios["packed_over_floor"] = ms["padfree_packed"] / ms["floor"]
    if "compile" in ms and "padfree" in ms:
        ratios["compile_over_padfree"] = ms["compile"] / ms["padfree"]
    row["ratios"] = ratios


def measure(args, systems: list[str]) -> dict:
    """Every shape's row for `systems`, timed in this process."""
    import torch
    import transformers
    hf_impls = ("eager", "sdpa") if "hf" in systems else ()
    with_reference = "padfree" in systems and not args.no_hf  # HF sdpa, padfree's accuracy check
    # one HF sdpa model serves its column, torch.compile's source and the accuracy reference
    needs_sdpa = with_reference or "compile" in systems
    models, encoder = build_models(args.layers, hf_impls or (("sdpa",) if needs_sdpa else ()),
                                   "padfree" in systems, args.gemm_search, args.gemm_tuning, args.programmatic_edges)
    timed = {"hf": {impl: models[impl] for impl in hf_impls}}
    if "compile" in systems:
        timed["compile"] = torch.compile(models["sdpa"], mode="reduce-overhead", dynamic=False)
    if encoder is not None:
        timed["padfree"] = encoder
        if with_reference:
            timed["reference"] = models["sdpa"]
        if args.varlen_attn:
            from padfree.torch import PadfreeEncoder
            timed["varlen_attn"] = PadfreeEncoder(encoder.weights, encoder.config, ops=torch_attention_ops())
    vocab_size = transformers.BertConfig().vocab_size
    rows, host_ms = [], [host_loop_ms()]
    for batch, max_seqlen in [_shape(s) for s in args.shapes.split(",") if s]:
        rows.append(bench_shape(batch, max_seqlen, timed, args, vocab_size))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "profile"}), flush=True)
    return {"benchmark": "BERT-base encoder, fp16, random weights", "device": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "layers": args.layers, "systems": systems, "processes": "one",
            "encoder": repr(encoder), "programmatic_edges": args.programmatic_edges,
            # the library's A/B switches (attention.cu, common.cuh), so that a run says what it ran
            "environment": env.snapshot(),
            "host_loop_ms": {"start": host_ms[0], "end": host_loop_ms()},
            "lengths": "uniform in [0.2*max, max], torch.Generator seed 0",
            "timing": f"CUDA events per call, median of {args.reps} after {args.warmup} warm-up calls",
            "rows": rows}


