"""The searches' one-kernel bookkeeping (padfree.ops.beam_search_step / greedy_step) against the searches'
torch code, which the CPU tests hold to Hugging Face's generate.

Both run the same scripted decoder (fresh random logits per step, with eos made likely on random rows so
hypotheses finish at every stage, identical beams at the first step so candidates tie) from the same
state, and every state tensor must agree after every step: sequences over their whole width (positions
past the current length keep the fill value), pool membership and lengths, flags, the cache
indirection and the step counter. Scores agree to float32 rounding: the kernel divides by the length
penalty as HF does on CUDA (a multiply by the float32 reciprocal), the torch code by true division.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the search kernels)", allow_module_level=True)

from padfree.generation.beam_search import BeamSearch  # noqa: E402
from padfree.generation.decoder import Decoder  # noqa: E402
from padfree.generation.dispatch import DecoderOps  # noqa: E402
from padfree.generation.options import GenerationOptions  # noqa: E402
from padfree.generation.sampling import SingleSearch  # noqa: E402

DEVICE = torch.device("cuda", 0)
VOCAB = 50
EOS = [3, 7]


class ScriptedDecoder(Decoder):
    """Decoder's step counter, indirection, reorder and advance, with logits read from a table by the device
    step (no weights): the searches see exactly what a model would give them."""

    def __init__(self, ops: DecoderOps, table: torch.Tensor, batch: int, rows_per_source: int, capacity: int):
        self.ops, self.table = ops, table
        self.batch, self.rows_per_source = batch, rows_per_source
        self.rows, self.capacity = batch * rows_per_source, capacity
        identity = torch.arange(self.rows, dtype=torch.int32, device=DEVICE)[:, None].expand(self.rows, capacity)
        self.indir, self.indir_next = identity.contiguous(), identity.contiguous()
        self.step = torch.zeros(1, dtype=torch.int32, device=DEVICE)

    @property
    def device(self) -> torch.device:
        return DEVICE

    @property
    def vocab_size(self) -> int:
        return self.table.shape[-1]

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table.index_select(0, self.step.long()).view(self.rows, -1)


def _options(**overrides) -> GenerationOptions:
    base = dict(num_beams=4, do_sample=False, max_length=14, min_length=0, length_penalty=1.0, early_stopping=False,
                num_return_sequences=1, no_repeat_ngram_size=0, repetition_penalty=1.0, bad_words_single=[],
                bad_words_multi=[], forced_bos_token_id=None, forced_eos_token_id=None, eos_token_ids=[EOS[0]],
                pad_token_id=1, decoder_start_token_id=2, temperature=1.0, top_k=0, top_p=1.0, seed=None,
                return_dict_in_generate=False, output_scores=False)
    base.update(overrides)
    return GenerationOptions(**base)


def _table(seed: int, steps: int, batch: int, rows_per_source: int, eos: list[int]) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    rows = batch * rows_per_source
    table = torch.randn(steps, rows, VOCAB, generator=g, device=DEVICE) * 2.0
    for token in eos:   # eos near the top on ~30 % of (step, row)
        boost = (torch.rand(steps, rows, generator=g, device=DEVICE) < 0.3) * 6.0
        table[:, :, token] += boost
    table[0] = table[0, ::rows_per_source].repeat_interleave(rows_per_source, dim=0)  # beams start identical
    return table.view(steps, rows * VOCAB).contiguous()


def _state(search) -> dict[str, torch.Tensor]:
    names = ("running", "running_scores", "pool", "pool_scores", "pool_lengths", "pool_finished", "improvable",
             "done", "sequences", "generated", "unfinished")
    state = {n: getattr(search, n).clone() for n in names if hasattr(search, n)}
    state["step"] = search.decoder.step.clone()
    if search.options.num_beams > 1:
        step = int(search.decoder.step)
        state["indir"] = search.decoder.indir[:, :step].clone()   # columns past the step are never read
    return state


def _pair(options: GenerationOptions, batch: int, seed: int):
    ops = DecoderOps(DEVICE, 64)
    if ops.sources["beam_search_step"] != "kernel":
        pytest.skip(f"beam_search_step: {ops.sources['beam_search_step']}")
    table = _table(seed, options.max_length, batch, options.rows_per_source, options.eos_token_ids)
    make = BeamSearch if options.num_beams > 1 else SingleSearch
    searches = []
    for use_kernel in (True, False):
        decoder = ScriptedDecoder(ops, table, batch, options.rows_per_source, options.max_length - 1)
        search = make(decoder, options, None)
        if not use_kernel:
            search.kernel = None
        assert (search.kernel is not None) == use_kernel
        searches.append(search)
    return searches


# At the last step every candidate is finished and all running scores tie at -1e9: HF discards the
# running beams then, and torch.topk's order among equal values is unspecified, so only the pool counts.
RUNNING = ("running", "running_scores", "indir")


def _compare(kernel_state, torch_state, step, last=False):
    for name, ref in torch_state.items():
        if last and name in RUNNING:
            continue
        got = kernel_state[name]
        if got.dtype == torch.float32:
            torch.testing.assert_close(got, ref, rtol=2e-7, atol=0,
                                       msg=lambda m, name=name: f"step {step}, {name}: {m}")
        else:
            assert torch.equal(got, ref), f"step {step}, {name}: kernel {got.tolist()} != torch {ref.tolist()}"


BEAM_CASES = [
    # batch, beams, eos ids, early_stopping, length_penalty, max_length
    (1, 4, EOS[:1], False, 1.0, 14),
    (3, 4, EOS[:1], True, 1.0, 14),
    (5, 4, EOS, "never", 0.6, 20),
    (2, 5, EOS[:1], "never", -0.5, 9),
    (7, 2, EOS, False, 2.0, 17),
    (2, 16, EOS[:1], True, 1.0, 12),
    (4, 3, [], False, 1.0, 10),          # no eos: every hypothesis runs to max_length
    (2, 16, EOS[:1], "never", 1.0, 150),  # old rows past the kernel's shared memory: the workspace's scratch
]


@pytest.mark.parametrize("case", BEAM_CASES, ids=lambda c: f"b{c[0]}x{c[1]}_eos{len(c[2])}_{c[3]}_lp{c[4]}_L{c[5]}")
def test_beam_search_step_matches_the_torch_step(seed, case):
    batch, beams, eos, early, lp, max_length = case
    options = _options(num_beams=beams, eos_token_ids=eos, early_stopping=early, length_penalty=lp,
                       max_length=max_length)
    fused, reference = _pair(options, batch, seed)
    assert fused.keep == options.candidates_per_row * beams
    for step in range(max_length - 1):
        fused.step()
        reference.step()
        _compare(_state(fused), _state(reference), step, last=step == max_length - 2)
    assert bool(fused.done) == bool(reference.done)
    a, b = fused.result(), reference.result()
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(a.scores, b.scores, rtol=2e-7, atol=0)


def test_beam_search_step_captured_in_a_graph(seed):
    """The kernel reads and advances the device step, so one captured graph replays every step."""
    options = _options(num_beams=4, eos_token_ids=EOS, max_length=16)
    fused, reference = _pair(options, 3, seed)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        fused.step()                 # warm-up, step 0
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused.step()
    fused.reset()
    fused.decoder.step.zero_()
    fused.decoder.indir.copy_(reference.decoder.indir)
    for step in range(options.max_length - 1):
        graph.replay()
        reference.step()
        _compare(_state(fused), _state(reference), step, last=step == options.max_length - 2)


@pytest.mark.parametrize("eos", [EOS, []], ids=["eos", "no_eos"])
def test_greedy_step_matches_the_torch_step(seed, eos):
    options = _options(num_beams=1, eos_token_ids=eos, max_length=15)
    fused, reference = _pair(options, 6, seed)
    for step in range(options.max_length - 1):
        fused.step()
        reference.step()
        _compare(_state(fused), _state(reference), step)
    assert torch.equal(fused.result(), reference.result())


def test_beam_search_step_refuses_bad_arguments():
    from padfree.ops import InputError, beam_search_step
    from padfree.ops.search import new_beam_search_workspace

    batch, beams, L = 2, 4, 8
    rows = batch * beams
    t = dict(
        running=torch.zeros(batch, beams, L, dtype=torch.long, device=DEVICE),
        running_scores=torch.zeros(batch, beams, device=DEVICE),
        pool=torch.zeros(batch, beams, L, dtype=torch.long, device=DEVICE),
        pool_scores=torch.zeros(batch, beams, device=DEVICE),
        pool_lengths=torch.zeros(batch, beams, dtype=torch.long, device=DEVICE),
        pool_finished=torch.zeros(batch, beams, dtype=torch.bool, device=DEVICE),
        improvable=torch.ones(batch, dtype=torch.bool, device=DEVICE),
        done=torch.zeros(1, dtype=torch.bool, device=DEVICE),
        next_tokens=torch.zeros(rows, dtype=torch.long, device=DEVICE),
        parents=torch.zeros(rows, dtype=torch.int32, device=DEVICE),
        step=torch.zeros(1, dtype=torch.int32, device=DEVICE))
    ws = new_beam_search_workspace(batch, beams, L, 0, DEVICE)
    good = dict(cand_scores=torch.zeros(rows, 8, device=DEVICE),
                cand_ids=torch.zeros(rows, 8, dtype=torch.int32, device=DEVICE), eos_ids=None)

    def call(**change):
        beam_search_step(**{**good, **t, **change}, length_penalty=1.0, early_stopping=False, workspace=ws)

    call()      # valid
    with pytest.raises(InputError, match="keep"):
        call(cand_scores=torch.zeros(rows, 2, device=DEVICE), cand_ids=torch.zeros(rows, 2, dtype=torch.int32,
                                                                                    device=DEVICE))
    with pytest.raises(InputError, match="cand_ids"):
        call(cand_ids=torch.zeros(rows, 8, dtype=torch.long, device=DEVICE))
    with pytest.raises(InputError, match="pool_finished"):
        call(pool_finished=torch.zeros(batch, beams, dtype=torch.uint8, device=DEVICE))
    with pytest.raises(InputError, match="workspace"):
        beam_search_step(**good, **t, length_penalty=1.0, early_stopping=False, workspace=ws[:16])
    with pytest.raises(InputError, match="early_stopping"):
        beam_search_step(**good, **t, length_penalty=1.0, early_stopping="sometimes", workspace=ws)
    with pytest.raises(InputError, match="cache_indir"):
        beam_search_step(**good, **t, length_penalty=1.0, early_stopping=False, workspace=ws,
                         cache_indir=torch.zeros(rows, L - 2, dtype=torch.int32, device=DEVICE))


# ---- PadfreeBeamSearchStep's ONNX Runtime reference against the kernel -------------------------------
def _reference_session(fields: dict, plugin: str = "PadfreeBeamSearchStep"):
    """One plugin node expanded by padfree.export.reference, on ONNX Runtime (CPU)."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from padfree.export import reference, spec as spec_mod
    spec = spec_mod.load()
    attrs = spec.node_attributes(plugin, fields)
    names = spec[plugin].input_names(attrs)
    outs = spec[plugin].output_names(attrs)
    types = {"cand_scores": TensorProto.FLOAT, "running_scores": TensorProto.FLOAT,
             "pool_scores": TensorProto.FLOAT, "running": TensorProto.INT64, "pool": TensorProto.INT64,
             "pool_lengths": TensorProto.INT64, "sequences": TensorProto.INT64, "generated": TensorProto.INT64}
    node = helper.make_node(plugin, names, outs, domain=spec.namespace, **attrs)
    inputs = [helper.make_tensor_value_info(n, types.get(n, TensorProto.INT32), None) for n in names]
    graph = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, ir_version=10,   # an IR every ONNX Runtime of the opset reads
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(spec.namespace, 1)])
    session = ort.InferenceSession(reference.with_references(model).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session, names, outs


@pytest.mark.parametrize("case", BEAM_CASES, ids=lambda c: f"b{c[0]}x{c[1]}_eos{len(c[2])}_{c[3]}_lp{c[4]}_L{c[5]}")
def test_beam_search_step_reference_matches_the_kernel(seed, case):
    """The ONNX Runtime reference that `padfree check` runs for PadfreeBeamSearchStep, against the kernel
    the plugin calls, with the plugin's int32 flags, over a whole search: fresh descending candidates each
    step (ids in a small vocabulary with the eos ids, so hypotheses finish at every stage), every output
    after every step; scores to float32 rounding (division there, the reciprocal's multiply here)."""
    from padfree.ops import beam_search_step
    from padfree.ops.search import EARLY_STOPPING, new_beam_search_workspace
    batch, beams, eos, early, lp, max_length = case
    keep, rows = 2 * beams, batch * beams
    fields = {"num_beams": beams, "length_penalty": lp, "early_stopping": EARLY_STOPPING[early],
              "has_eos": int(bool(eos)), "own_workspace": 0}
    session, names, outs = _reference_session(fields)
    g = torch.Generator(device="cpu").manual_seed(seed)
    running = torch.full((batch, beams, max_length), 1, dtype=torch.int64)
    running[:, :, 0] = 2
    state = {"running": running, "running_scores": torch.full((batch, beams), -1e9), "pool": running.clone(),
             "pool_scores": torch.full((batch, beams), -1e9),
             "pool_lengths": torch.zeros(batch, beams, dtype=torch.int64),
             "pool_finished": torch.zeros(batch, beams, dtype=torch.int32),
             "improvable": torch.ones(batch, dtype=torch.int32)}
    state["running_scores"][:, 0] = 0.0
    gpu = {k: v.to(DEVICE).contiguous() for k, v in state.items()}
    eos_ids = torch.tensor(eos, dtype=torch.int32)
    workspace = new_beam_search_workspace(batch, beams, max_length, 0, DEVICE)
    done = torch.zeros(1, dtype=torch.bool, device=DEVICE)
    for step in range(max_length - 1):
        logprobs = torch.sort(torch.rand(rows, keep, generator=g).log() * 3.0, dim=1, descending=True).values
        cand_scores = (logprobs + state["running_scores"].reshape(rows, 1)).contiguous()
        cand_ids = torch.randint(0, 12, (rows, keep), generator=g, dtype=torch.int32)
        feed = {"cand_scores": cand_scores, "cand_ids": cand_ids, "step": torch.tensor([step], dtype=torch.int32),
                **state}
        if eos:
            feed["eos_ids"] = eos_ids
        want = dict(zip(outs, session.run(outs, {n: feed[n].numpy() for n in names})))
        next_tokens = torch.empty(rows, dtype=torch.int64, device=DEVICE).fill_(-7)
        parents = torch.empty(rows, dtype=torch.int32, device=DEVICE).fill_(-7)
        beam_search_step(cand_scores.to(DEVICE), cand_ids.to(DEVICE), eos_ids.to(DEVICE) if eos else None,
                         gpu["running"], gpu["running_scores"], gpu["pool"], gpu["pool_scores"], gpu["pool_lengths"],
                         gpu["pool_finished"], gpu["improvable"], done, next_tokens, parents,
                         torch.tensor([step], dtype=torch.int32, device=DEVICE), length_penalty=lp,
                         early_stopping=early, workspace=workspace)
        got = {f"{k}_out": v.cpu() for k, v in gpu.items()}
        got.update(next_tokens=next_tokens.cpu(), parents=parents.cpu())
        last = step == max_length - 2   # every candidate finishes: the running beams tie at -1e9 (see RUNNING)
        for name in outs:
            if last and name in ("running_out", "running_scores_out", "next_tokens", "parents"):
                continue
            ref = torch.from_numpy(want[name])
            if ref.dtype == torch.float32:
                torch.testing.assert_close(got[name], ref, rtol=2e-7, atol=0,
                                           msg=lambda m, n=name, s=step: f"step {s}, {n}: {m}")
            else:
                assert torch.equal(got[name], ref), \
                    f"step {step}, {name}: kernel {got[name].tolist()} != reference {ref.tolist()}"
        state = {k: got[f"{k}_out"].clone() for k in state}
    assert (state["pool_lengths"] > 0).any(), "no hypothesis finished"


@pytest.mark.parametrize("eos", [EOS, []], ids=["eos", "no_eos"])
def test_greedy_step_reference_matches_the_kernel(seed, eos):
    """PadfreeGreedyStep's ONNX Runtime reference against the kernel with the plugin's int32 flags over a
    whole search: fresh top-1 ids each step (a small vocabulary with the eos ids, so rows finish), every
    output after every step, exactly."""
    from padfree.ops import greedy_step
    rows, max_length, pad = 9, 12, 1
    session, names, outs = _reference_session({"pad_token_id": pad, "has_eos": int(bool(eos))}, "PadfreeGreedyStep")
    g = torch.Generator(device="cpu").manual_seed(seed)
    sequences = torch.full((rows, max_length), pad, dtype=torch.int64)
    sequences[:, 0] = 2
    state = {"sequences": sequences, "generated": torch.zeros(rows, dtype=torch.int64),
             "unfinished": torch.ones(rows, dtype=torch.int32)}
    gpu = {k: v.to(DEVICE).contiguous() for k, v in state.items()}
    eos_ids = torch.tensor(eos, dtype=torch.int32)
    done = torch.zeros(1, dtype=torch.bool, device=DEVICE)
    for step in range(max_length - 1):
        cand_ids = torch.randint(0, 10, (rows, 1), generator=g, dtype=torch.int32)
        feed = {"cand_ids": cand_ids, "step": torch.tensor([step], dtype=torch.int32), **state}
        if eos:
            feed["eos_ids"] = eos_ids
        want = dict(zip(outs, session.run(outs, {n: feed[n].numpy() for n in names})))
        next_tokens = torch.full((rows,), -7, dtype=torch.int64, device=DEVICE)
        greedy_step(cand_ids.to(DEVICE), eos_ids.to(DEVICE) if eos else None, gpu["sequences"], next_tokens,
                    gpu["generated"], gpu["unfinished"], done, torch.tensor([step], dtype=torch.int32, device=DEVICE),
                    pad_token_id=pad, advance=False)
        got = {f"{k}_out": v.cpu() for k, v in gpu.items()}
        got["next_tokens"] = next_tokens.cpu()
        for name in outs:
            ref = torch.from_numpy(want[name])
            assert torch.equal(got[name], ref), f"step {step}, {name}: kernel {got[name].tolist()} != {ref.tolist()}"
        state = {k: got[f"{k}_out"].clone() for k in state}
    if eos:
        assert (state["generated"] > 0).any(), "no row finished"
