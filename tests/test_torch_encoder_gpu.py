"""padfree.torch on the GPU: the real kernels, eager and through CUDA graphs, against HF eager in fp32
(TF32 off) and fp16."""
from __future__ import annotations

import gc
import math
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from _encoder_models import ARCHS, check_padded_output, hf_reference, make_model, random_batch, rel_err  # noqa: E402

from padfree.ops import InputError  # noqa: E402
from padfree.torch import from_hf  # noqa: E402

# ---- GPU: the real kernels -----------------------------------------------------------------------------

def poison_allocator(megabytes: int = 256) -> None:
    """Fill the caching allocator's free blocks with NaN, so that a buffer the encoder allocates but
    fails to write shows up as NaN rather than as zeros or stale values."""
    block = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32, device="cuda")
    block.fill_(float("nan"))
    del block


TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_encoder_matches_hf_eager(arch, dtype, graphs, head_dim, seed, no_tf32):
    rng = np.random.default_rng(seed)
    model = make_model(arch, hidden=2 * head_dim, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=dtype, use_graphs=graphs)
    ids, mask, type_ids = random_batch(model, 7, 128, rng, types=arch == "bert")
    poison_allocator()
    out = encoder(ids.cuda(), mask.cuda(), None if type_ids is None else type_ids.cuda())
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, type_ids, "cuda", torch.float32)
    check_padded_output(out, ref_hidden, ref_pooled, mask, TOLERANCE[dtype])
    # the list form and host inputs go through the same packed forward
    sequences = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    type_lists = None if type_ids is None else [row[m.bool()].tolist() for row, m in zip(type_ids, mask)]
    listed = encoder(sequences, token_type_ids=type_lists)
    assert torch.equal(listed.last_hidden_state, out.last_hidden_state)
    assert graphs == bool(encoder.graph_buckets)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_head_dim_32_model_matches_hf_eager(dtype, graphs, seed, no_tf32):
    """MiniLM-L6-H384's shape (6 layers, hidden 384, 12 heads of 32; bge-small's and e5-small's head
    size): lengths past one 128-key tile, at depth. On the CPU in float16 this composition is ~1.5e-3
    from float64 HF, well inside the tolerance."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=384, heads=12, layers=6, positions=256, seed=seed)
    encoder = from_hf(model, dtype=dtype, use_graphs=graphs)
    ids, mask, type_ids = random_batch(model, 16, 200, rng, types=True)
    poison_allocator()
    out = encoder(ids.cuda(), mask.cuda(), type_ids.cuda())
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, type_ids, "cuda", torch.float32)
    check_padded_output(out, ref_hidden, ref_pooled, mask, TOLERANCE[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_one_sequence_matches_hf_eager(dtype, graphs, seed, no_tf32):
    """A batch of one: the pooler reads the sequence's row 0 in place (no first-token gather). With
    graphs, the second call of each shape takes the speculative route through the guarded graph."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=dtype, use_graphs=graphs)
    for width in (1, 37, 128):
        ids, mask, type_ids = random_batch(model, 1, width, rng, types=True,
                                           lengths=[int(rng.integers(1, width + 1))])
        ref_hidden, ref_pooled = hf_reference(model, ids, mask, type_ids, "cuda", torch.float32)
        for _ in range(2):
            poison_allocator()
            out = encoder(ids.cuda(), mask.cuda(), type_ids.cuda())
            check_padded_output(out, ref_hidden, ref_pooled, mask, TOLERANCE[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_forward_packed_matches_padded_call(arch, seed):
    rng = np.random.default_rng(seed)
    model = make_model(arch, hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float16)
    ids, mask, _ = random_batch(model, 5, 96, rng)
    lengths = mask.sum(1)
    cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32).cuda()
    packed_ids = ids[mask.bool()].to(torch.int32).cuda()
    out = encoder.forward_packed(packed_ids, cu, int(lengths.max()))
    padded = encoder(ids.cuda(), mask.cuda())
    torch.testing.assert_close(out["last_hidden_state"], padded.last_hidden_state[mask.bool().cuda()],
                               rtol=0, atol=0)
    again = encoder.forward_packed(packed_ids.flip(0), cu, int(lengths.max()))  # same bucket, other data
    assert not torch.equal(again["last_hidden_state"], out["last_hidden_state"])
    assert torch.equal(out["last_hidden_state"], padded.last_hidden_state[mask.bool().cuda()]), \
        "copy=True outputs must not alias the graph's static buffers"


@pytest.mark.gpu
def test_bucket_reuse_with_different_batches(seed, no_tf32):
    """Batches of other sizes that fall into one bucket replay one graph and stay correct."""
    rng = np.random.default_rng(seed)
    model = make_model("roberta", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float32)
    eager = from_hf(model, dtype=torch.float32, use_graphs=False)
    # all four: 257..320 tokens, 3..4 sequences, longest <= 128 -> one bucket
    for batch, lengths in ((3, [100, 128, 90]), (4, [80, 60, 70, 100]), (3, [128, 128, 10]), (4, [1, 100, 128, 90])):
        ids, mask, _ = random_batch(model, batch, 128, rng, lengths=lengths)
        out = encoder(ids.cuda(), mask.cuda())
        ref = eager(ids.cuda(), mask.cuda())
        torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.pooler_output, ref.pooler_output, rtol=1e-5, atol=1e-5)
        ref_hidden, ref_pooled = hf_reference(model, ids, mask, None, "cuda", torch.float32)
        check_padded_output(out, ref_hidden, ref_pooled, mask, 1e-4)
    assert len(encoder.graph_buckets) == 1, encoder.graph_buckets
    assert encoder._graphs.get(encoder.graph_buckets[0]).replays == 4


@pytest.mark.gpu
@pytest.mark.parametrize("gemm_search", ["heuristic", "none"])
def test_capture_after_runs_a_new_bucket_eagerly_first(seed, no_tf32, gemm_search):
    """capture_after=2: a bucket's first two calls run eagerly (no graph), the third captures and the
    fourth replays; every call equals HF float32 (gemm_search="none": torch's GEMM calls captured)."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float32, capture_after=2, gemm_search=gemm_search)
    counts = []
    for lengths in ([100, 128, 90], [80, 60, 70, 100], [128, 128, 10], [1, 100, 128, 90]):   # one bucket
        ids, mask, _ = random_batch(model, len(lengths), 128, rng, lengths=lengths)
        poison_allocator()
        out = encoder(ids.cuda(), mask.cuda())
        ref_hidden, ref_pooled = hf_reference(model, ids, mask, None, "cuda", torch.float32)
        check_padded_output(out, ref_hidden, ref_pooled, mask, 1e-4)
        counts.append(len(encoder.graph_buckets))
    assert counts == [0, 0, 1, 1]
    assert encoder._graphs.get(encoder.graph_buckets[0]).replays == 2
    with pytest.raises(InputError, match="capture_after"):
        from_hf(model, dtype=torch.float32, capture_after=-1)
    with pytest.raises(InputError, match="gemm_search"):
        from_hf(model, dtype=torch.float32, gemm_search="fastest")


@pytest.mark.gpu
def test_graph_lru_evicts(seed):
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float16, max_graphs=2)
    for width in (10, 40, 100, 10):  # buckets of 16, 64, 128 positions, then the first again
        encoder(torch.randint(2, 90, (1, width), device="cuda"))
    assert [b.max_seqlen for b in encoder.graph_buckets] == [128, 16]


@pytest.mark.gpu
def test_device_inputs_are_packed_on_the_device(seed, monkeypatch):
    """Valid padded tensors (on the GPU or the CPU) of every accepted dtype never take the host route,
    and match the host route's output (numpy inputs)."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float16)
    ids, mask, type_ids = random_batch(model, 6, 100, rng, types=True)
    expected = encoder(ids.numpy(), mask.numpy(), type_ids.numpy()).last_hidden_state  # the host route
    monkeypatch.setattr(encoder._device_inputs, "_on_host", lambda *a: pytest.fail("took the host route"))
    for id_dtype, mask_dtype in ((torch.int64, torch.int64), (torch.int32, torch.bool), (torch.int64, torch.uint8)):
        for where in ("cuda", "cpu"):
            got = encoder(ids.to(where, id_dtype), mask.to(where, mask_dtype), type_ids.to(where, id_dtype))
            assert torch.equal(got.last_hidden_state, expected), (id_dtype, mask_dtype, where)
    assert torch.equal(encoder(ids.cuda()).last_hidden_state, encoder(ids).last_hidden_state)  # no mask


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
def test_weight_prefetch_changes_no_result(arch, seed):
    """The LayerNorms' L2 prefetch of the next GEMMs' weights (on by default for small buckets) is a
    hint: eager forwards with it forced on and off are bit-equal."""
    rng = np.random.default_rng(seed)
    model = make_model(arch, hidden=128, heads=2, positions=512, seed=seed)
    ids, mask, _ = random_batch(model, 8, 512, rng, lengths=rng.integers(200, 513, 8).tolist())
    outs = []
    for prefetch in (True, False):
        encoder = from_hf(model, dtype=torch.float16, use_graphs=False)
        encoder.prefetch_weights = prefetch
        assert encoder._prefetches(int(mask.sum())) == prefetch
        outs.append(encoder(ids.cuda(), mask.cuda()))
    assert torch.equal(outs[0].last_hidden_state, outs[1].last_hidden_state)
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, None, "cuda", torch.float32)
    if ref_pooled is not None:  # DistilBERT and ELECTRA have no pooler
        assert torch.equal(outs[0].pooler_output, outs[1].pooler_output)
    check_padded_output(outs[0], ref_hidden, ref_pooled, mask, 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("use_graphs", [True, False])
def test_input_buffer_grows_and_packs_again(seed, monkeypatch, use_graphs):
    """GPU inputs are packed into the encoder's input buffer before their total is known; a batch that
    does not fit grows the buffer (dropping the graphs that read the old one) and is packed again.
    Outputs equal those of host inputs, before and after, for both routes."""
    import padfree.torch.encoder as encoder_module
    monkeypatch.setattr(encoder_module, "INPUT_TOKENS", 64)
    monkeypatch.setattr(encoder_module, "INPUT_BATCH", 2)
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float16, use_graphs=use_graphs)
    for batch, width in ((2, 20), (5, 100), (2, 20), (3, 128)):
        ids, mask, type_ids = random_batch(model, batch, width, rng, types=True)
        on_host = encoder(ids.numpy(), mask.numpy(), type_ids.numpy()).last_hidden_state  # numpy: the host route
        on_gpu = encoder(ids.cuda(), mask.cuda(), type_ids.cuda()).last_hidden_state
        assert torch.equal(on_gpu, on_host), (batch, width)
    assert encoder._inputs.input_ids.shape[0] >= int(mask.sum())
    if use_graphs:
        assert all(b.tokens <= encoder._inputs.input_ids.shape[0] for b in encoder.graph_buckets)


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["cuda", "cpu"])  # CPU tensors are checked on the GPU too
def test_bad_inputs_on_gpu_raise_input_error(seed, where):
    model = make_model("bert", hidden=128, heads=2, positions=64, seed=seed)
    encoder = from_hf(model, dtype=torch.float16)
    ids = torch.randint(1, 90, (2, 8), device=where)
    ones = torch.ones(2, 8, dtype=torch.int64, device=where)
    holed = ones.clone()
    holed[0, 2] = 0
    with pytest.raises(InputError, match="row 0 is not left-aligned"):
        encoder(ids, holed)
    empty = ones.clone()
    empty[1] = 0
    with pytest.raises(InputError, match="sequence 1 is empty"):
        encoder(ids, empty)
    with pytest.raises(InputError, match="more than"):
        encoder(torch.randint(1, 90, (1, 65), device=where))
    bad = ids.clone()
    bad[1, 5] = -1
    with pytest.raises(InputError, match="sequence 1, position 5"):
        encoder(bad, ones)
    with pytest.raises(InputError, match="only 0 and 1"):
        encoder(ids, ones * 2)
    with pytest.raises(InputError, match="dtype"):
        encoder(ids.float(), ones)
    with pytest.raises(InputError, match="device"):
        encoder.forward_packed(ids[0].int().cpu(), torch.tensor([0, 8], dtype=torch.int32), 8)
    with pytest.raises(InputError, match="token type"):
        from_hf(make_model("distilbert", hidden=128, positions=64), dtype=torch.float16)(
            ids, ones, torch.zeros_like(ids))
    # a padded position may hold any id: only tokens are embedded and checked
    tail = ids.clone()
    tail[0, 7] = 10**6
    half = ones.clone()
    half[0, 7] = 0
    assert torch.isfinite(encoder(tail, half).last_hidden_state).all()


@pytest.mark.gpu
def test_fp32_uses_exact_gelu_and_fp16_the_epilogue():
    model = make_model("bert", hidden=128, heads=2, positions=64)
    assert not from_hf(model, dtype=torch.float32).ffn_up.use_epilogue
    assert from_hf(model, dtype=torch.float16).ffn_up.use_epilogue
    assert math.isclose(from_hf(model, dtype=torch.float16).softmax_scale, 1 / 8)


@pytest.mark.gpu
@pytest.mark.skipif(not hasattr(torch._C, "_cuda_clearCublasWorkspaces"),
                    reason="torch without the cuBLAS workspace cache")
def test_graphs_survive_cublas_workspace_clearing(seed):
    """torch.compile's CUDA graphs (and torch's graph teardown) clear torch's cuBLAS workspace cache and
    release the memory; a captured forward must not be left writing to it. BERT-base's width at ~20K
    tokens, where torch's GEMM picks on the H100 take a workspace (a replay faulted there before)."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=768, heads=12, layers=1, positions=512, seed=seed)
    encoder = from_hf(model, dtype=torch.float16)
    ids, mask, _ = random_batch(model, 48, 512, rng, lengths=rng.integers(300, 513, 48).tolist())
    ids, mask = ids.cuda(), mask.cuda()
    first = encoder(ids, mask).last_hidden_state.clone()
    torch._C._cuda_clearCublasWorkspaces()  # what torch.compile(mode="reduce-overhead") does around a recording
    torch.cuda.empty_cache()
    poison_allocator(1024)
    again = encoder(ids, mask).last_hidden_state
    torch.cuda.synchronize()
    assert torch.isfinite(again).all()
    assert torch.equal(again, first)


@pytest.mark.gpu
def test_captured_forward_drops_counter_memsets(seed, monkeypatch):
    """At BERT-base width, the captured forward's cuBLASLt calls that take a workspace each get their
    own slot and the graph drops cuBLASLt's memsets of them: outputs equal, bit for bit, an encoder
    whose graph keeps them (PADFREE_COUNTER_MEMSETS=keep, same algorithms), and HF's within fp16
    tolerance."""
    from padfree.torch import capture as capture_mod, gemm_tuning as tuning_mod
    monkeypatch.setattr(tuning_mod, "KEEP_MARGIN", 10.0)  # cuBLASLt's best even where torch's call is faster
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    monkeypatch.setattr(capture_mod, "CHOOSE_IN_FORWARD", False)  # both encoders on the same algorithms
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=768, heads=12, layers=2, positions=512, seed=seed)
    ids, mask, _ = random_batch(model, 16, 512, rng, lengths=rng.integers(300, 513, 16).tolist())
    encoder = from_hf(model, dtype=torch.float16)
    poison_allocator()
    out = encoder(ids.cuda(), mask.cuda())
    (g,) = (encoder._graphs.get(b) for b in encoder.graph_buckets)
    if g.gemms.workspace_calls == 0:
        pytest.skip(f"no tuned pick takes a workspace on this device: {g.gemms.choices()}")
    assert g.dropped_memsets == g.gemms.workspace_calls
    monkeypatch.setenv("PADFREE_COUNTER_MEMSETS", "keep")
    kept = from_hf(model, dtype=torch.float16)
    same = kept(ids.cuda(), mask.cuda()).last_hidden_state
    (k,) = (kept._graphs.get(b) for b in kept.graph_buckets)
    assert k.dropped_memsets == 0 and k.gemms.choices() == g.gemms.choices()
    assert torch.equal(same, out.last_hidden_state)
    again = encoder(ids.cuda(), mask.cuda()).last_hidden_state  # a replay after the first
    assert torch.equal(again, same)
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, None, "cuda", torch.float32)
    check_padded_output(out, ref_hidden, ref_pooled, mask, 1e-2)


@pytest.mark.gpu
def test_in_forward_choices_chain_their_captures(seed, monkeypatch):
    """With every projection offering a runner-up (RUNNER_UP_MARGIN widened), the capture chooses
    each inside the forward, each choice reusing the forward the previous one left: one capture for
    the first pick, one per runner-up, then the bucket's graph. The choices made, the output matches
    HF's within fp16 tolerance."""
    from padfree.torch import gemm_tuning as tuning_mod
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    monkeypatch.setattr(tuning_mod, "_runner_up", {})
    monkeypatch.setattr(tuning_mod, "RUNNER_UP_MARGIN", 1e9)
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    ids, mask, _ = random_batch(model, 3, 100, rng)
    encoder = from_hf(model, dtype=torch.float16)
    records = []
    record = encoder._record
    monkeypatch.setattr(encoder, "_record", lambda graph, args: records.append(graph) or record(graph, args))
    poison_allocator()
    out = encoder(ids.cuda(), mask.cuda())
    (g,) = (encoder._graphs.get(b) for b in encoder.graph_buckets)
    offered = len(g.gemms.alternatives())
    assert offered == 4, g.gemms.choices()
    assert len(records) == 1 + offered + 1 and records[-1] is g.graph
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, None, "cuda", torch.float32)
    check_padded_output(out, ref_hidden, ref_pooled, mask, 1e-2)


@pytest.mark.gpu
def test_gemm_tuning_file_written_and_checked(tmp_path, seed):
    """gemm_tuning: each capture rewrites the file (a tuning file another encoder then loads); a file
    that is not one is refused when the encoder is built."""
    import json
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    path = tmp_path / "gemms.json"
    encoder = from_hf(model, dtype=torch.float16, gemm_tuning=path)
    assert not path.exists()
    ids = torch.randint(2, 90, (2, 40), device="cuda")
    out = encoder(ids).last_hidden_state
    assert json.loads(path.read_text())["format"] == "padfree-gemm-tuning/1"
    again = from_hf(model, dtype=torch.float16, gemm_tuning=path)  # loads the file
    assert torch.equal(again(ids).last_hidden_state, out)
    path.write_text("{}")
    with pytest.raises(ValueError, match="tuning file"):
        from_hf(model, dtype=torch.float16, gemm_tuning=path)


@pytest.mark.gpu
def test_speculative_calls_match_ordinary_calls(seed, no_tf32, monkeypatch):
    """GPU inputs shaped as an earlier call's launch that call's graph behind a device-side guard: a
    batch of the same bucket is served by it without _execute (outputs equal to the ordinary call's),
    a batch of another bucket is skipped on the device and runs the ordinary way, after which its own
    graph is the guess."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float32)
    executed = []
    execute = encoder._execute
    monkeypatch.setattr(encoder, "_execute", lambda batch: (executed.append(batch.total_tokens), execute(batch))[1])
    short = [30, 25, 40, 33, 28]  # 156 tokens, longest 40: bucket (192, 8, 64)
    long = [120, 128, 100, 90, 110]  # 548 tokens, longest 128: another bucket
    poison_allocator()
    results = []
    for lengths in (short, short, short, long, long, short):
        ids, mask, type_ids = random_batch(model, 5, 128, rng, lengths=lengths, types=True)
        out = encoder(ids.cuda(), mask.cuda(), type_ids.cuda())
        ref_hidden, ref_pooled = hf_reference(model, ids, mask, type_ids, "cuda", torch.float32)
        check_padded_output(out, ref_hidden, ref_pooled, mask, 1e-4)
        results.append((ids, mask, type_ids, out.last_hidden_state.clone()))
    # ordinary calls: the first short one (no guess yet), then each batch whose bucket is not the guess's
    assert executed == [sum(short), sum(long), sum(short)], executed
    assert len(encoder.graph_buckets) == 2
    assert all(encoder._graphs.get(b).guarded for b in encoder.graph_buckets)
    # a speculative call computes what an ordinary one does: same graph, same inputs, same bits
    ids, mask, type_ids, out = results[2]
    encoder.clear_graphs()  # no guesses: ordinary calls
    again = encoder(ids.cuda(), mask.cuda(), type_ids.cuda()).last_hidden_state
    assert torch.equal(again, out)


@pytest.mark.gpu
def test_speculative_call_with_bad_inputs_raises_and_skips_the_graph(seed):
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=64, seed=seed)
    encoder = from_hf(model, dtype=torch.float16)
    ids, mask, _ = random_batch(model, 3, 48, rng, lengths=[48, 20, 33])
    ids, mask = ids.cuda(), mask.cuda()
    first = encoder(ids, mask).last_hidden_state
    graph = encoder._graphs.get(encoder.graph_buckets[0])
    static = graph.hidden.clone()
    holed = mask.clone()
    holed[1, 5] = 0
    with pytest.raises(InputError, match="row 1 is not left-aligned"):
        encoder(ids.flip(1), holed)
    bad = ids.clone()
    bad[2, 7] = 10**6
    with pytest.raises(InputError, match="sequence 2, position 7"):
        encoder(bad, mask)
    torch.cuda.synchronize()
    assert torch.equal(graph.hidden, static), "a flagged batch must not run the graph"
    assert graph.guarded, "the calls above were speculative"
    assert torch.equal(encoder(ids, mask).last_hidden_state, first)


@pytest.mark.gpu
def test_evicted_graphs_are_released_despite_guesses(seed):
    """A shape's guess names a bucket, not a graph: an evicted graph (its static outputs, its
    GuardedGraph) is freed, and the shape's next call recaptures and speculates again."""
    import gc
    import weakref
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float16, max_graphs=1)
    short = torch.randint(2, 90, (2, 20), device="cuda")
    first = encoder(short).last_hidden_state
    encoder(short)  # speculative: makes the guarded graph
    evicted = encoder._graphs.get(encoder.graph_buckets[0])
    assert evicted.guarded
    released = weakref.ref(evicted)
    del evicted
    encoder(torch.randint(2, 90, (2, 100), device="cuda"))  # another bucket: the first is evicted
    gc.collect()
    assert released() is None, "the evicted graph is still referenced"
    assert torch.equal(encoder(short).last_hidden_state, first)  # recaptured (ordinary)
    assert torch.equal(encoder(short).last_hidden_state, first)  # speculative on the new graph
    assert encoder._graphs.get(encoder.graph_buckets[0]).guarded


@pytest.mark.gpu
def test_a_capture_drops_the_route_and_its_evicted_graph(seed, no_tf32):
    """The route holds its graph (and the guarded graph its C call launches): a capture, which may
    evict that graph, drops the route, so an evicted graph is released as without one."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=64, seed=seed)
    encoder = from_hf(model, dtype=torch.float32, max_graphs=1)
    ids, mask = (t.cuda() for t in random_batch(model, 3, 64, rng, lengths=[10, 7, 12])[:2])
    encoder(ids, mask)
    encoder(ids, mask)  # speculative: makes the route
    assert encoder._route is not None
    routed = weakref.ref(encoder._route.graph)
    lengths = [64, 50, 64]  # another bucket, captured by forward_packed (the route is not consulted)
    longer_ids, longer_mask = random_batch(model, 3, 64, rng, lengths=lengths)[:2]
    packed = longer_ids[longer_mask.bool()].to(torch.int32).cuda()
    cu_seqlens = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32, device="cuda")
    out = encoder.forward_packed(packed, cu_seqlens, max(lengths))
    ref_hidden, _ = hf_reference(model, longer_ids, longer_mask, None, "cuda", torch.float32)
    assert rel_err(out["last_hidden_state"].cpu(), ref_hidden.cpu()[longer_mask.bool()]) < 1e-4
    assert encoder._route is None
    gc.collect()
    assert routed() is None, "the evicted graph is still referenced"
    check_padded_output(encoder(ids, mask), *hf_reference(model, ids.cpu(), mask.cpu(), None, "cuda",
                                                          torch.float32), mask.cpu(), 1e-4)


@pytest.mark.gpu
def test_repeated_layouts_take_the_route(seed, no_tf32, monkeypatch):
    """A call laid out as the last speculative one takes its _Route (no guess, graph, buffer or plan
    lookups) and computes the bits an ordinary call does; another layout of the same shape (int32
    ids), a batch the route's bucket does not take, and a cleared encoder go the lookups' way."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=64, seed=seed)
    encoder = from_hf(model, dtype=torch.float32)
    lengths = [10, 7, 12]
    batches = [random_batch(model, 3, 64, rng, lengths=lengths)[:2] for _ in range(3)]
    ids, mask = (t.cuda() for t in batches[0])
    encoder(ids, mask)  # ordinary: remembers the bucket
    encoder(ids, mask)  # speculative through the lookups: makes the route
    assert encoder._route is not None
    lookups = []
    enqueue = encoder._device_inputs.enqueue
    monkeypatch.setattr(encoder._device_inputs, "enqueue", lambda *a, **k: (lookups.append(1), enqueue(*a, **k))[1])
    routed = []
    for cpu_ids, cpu_mask in batches[1:]:
        out = encoder(cpu_ids.cuda(), cpu_mask.cuda())
        ref_hidden, ref_pooled = hf_reference(model, cpu_ids, cpu_mask, None, "cuda", torch.float32)
        check_padded_output(out, ref_hidden, ref_pooled, cpu_mask, 1e-4)
        routed.append(out.last_hidden_state.clone())
    assert lookups == [], "same layout: the route, not the lookups"
    narrow = batches[1][0].cuda().int()
    other = encoder(narrow, batches[1][1].cuda()).last_hidden_state  # ordinary: the packer's first int32 call
    assert lookups == [1] and torch.equal(other, routed[0])
    encoder(narrow, batches[1][1].cuda())  # speculative through the lookups: the int32 layout's route
    assert lookups == [1, 1] and encoder._route is not None
    longer = random_batch(model, 3, 64, rng, lengths=[64, 64, 64])[:2]
    out = encoder(longer[0].cuda().int(), longer[1].cuda())  # the route's bucket does not take it
    ref_hidden, ref_pooled = hf_reference(model, *longer, None, "cuda", torch.float32)
    check_padded_output(out, ref_hidden, ref_pooled, longer[1], 1e-4)
    assert encoder._route is None
    encoder.clear_graphs()
    again = encoder(batches[2][0].cuda(), batches[2][1].cuda()).last_hidden_state  # ordinary
    assert torch.equal(again, routed[1])


@pytest.mark.gpu
@pytest.mark.parametrize("gemm_search", ["heuristic", "none"])
def test_captures_after_every_graph_is_dropped(gemm_search, seed):
    """A bucket captured after every kept graph is gone (clear_graphs(), or the one graph max_graphs=1
    keeps evicted by another bucket's) is captured and replayed again, with the same outputs: a graph
    pool handle whose graphs are all destroyed cannot be captured into again ("none": torch's own
    GEMM calls, whose cuBLAS workspaces torch allocates itself)."""
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float16, max_graphs=1, gemm_search=gemm_search)
    batches = [random_batch(model, 3, 32, rng, lengths=[32, 9, 20], types=True),
               random_batch(model, 9, 128, rng, types=True)]
    first = [encoder(ids.cuda(), mask.cuda(), types.cuda()).last_hidden_state.clone()
             for ids, mask, types in batches]
    for clear in (True, False):
        for (ids, mask, types), want in zip(batches, first):
            if clear:
                encoder.clear_graphs()
            got = encoder(ids.cuda(), mask.cuda(), types.cuda()).last_hidden_state
            assert len(encoder.graph_buckets) == 1
            assert torch.equal(got, want)
