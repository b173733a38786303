"""Programmatic edges from padfree's kernels into other libraries' kernels (padfree.ops.graph_edges,
padfree.torch.edges): the probe finds a consumer that does not wait, the check keeps only consumers
found waiting whose relaxed copy reproduces the graph, a graph after the check stays exact, and an
encoder's relaxed graphs compute exactly what its captured ones do."""
from __future__ import annotations

import pytest
import torch

from padfree import ops
from padfree.torch import edges


def _capture(x, gamma, beta, w, consumer):
    """A graph: padfree's LayerNorm of x, then consumer(normalized) (another library's kernel)."""
    def forward():
        return consumer(ops.layernorm(x, gamma, beta, 1e-5), w)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()  # warm-up outside the capture (cuBLAS handle, workspace)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, stream=stream):
        out = forward()
    return graph, out


class _FakeExec:
    """GraphExec stand-in: the 'graph' writes batch-dependent values, and a copy relaxed for a
    function in `racy` writes something else (what a consumer that does not wait would do)."""
    def __init__(self, state, functions, racy):
        self.state, self.broken = state, any(f in racy for f in functions)

    def launch(self):
        self.state["out"].copy_(self.state["x"] * 2 + (1 if self.broken else 0))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_check_relaxes_only_consumers_that_wait_and_whose_copy_reproduces_the_graph():
    x, out = torch.arange(8.0), torch.empty(8)
    state, racy, relaxed_in_place = {"x": x, "out": out}, {22}, []
    verdicts = {11: True, 22: True, 33: True, 44: False}  # 55: never probed

    class FakeOps:
        class graph_edges:
            consumers = staticmethod(lambda graph, device: [11, 22, 33, 44, 55])
            GraphExec = staticmethod(lambda graph, functions, device: _FakeExec(state, functions, racy))
            relax_edges = staticmethod(lambda graph, functions, device: relaxed_in_place.extend(functions))

    batches = [x.clone(), x + 100]
    kept = edges.relax_captured(1, FakeOps, torch.device("cpu"), lambda k: x.copy_(batches[k]), [out], verdicts)
    assert kept == [11, 33] and relaxed_in_place == [11, 33]
    assert torch.equal(x, batches[0])  # the captured batch is back in place
    racy.update({11, 33})
    relaxed_in_place.clear()
    assert edges.relax_captured(1, FakeOps, torch.device("cpu"), lambda k: x.copy_(batches[k]), [out], verdicts) == []
    assert relaxed_in_place == []


_CONSUMERS = {"gemm": (lambda h, w: h @ w, lambda h, w, out: torch.matmul(h, w, out=out)),
              "elementwise": (lambda h, w: h * 2.0, lambda h, w, out: torch.mul(h, 2.0, out=out))}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(_CONSUMERS))
def test_probe_and_check_keep_the_graph_exact(name):
    consumer, consume_into = _CONSUMERS[name]
    torch.manual_seed(0)
    # torch's elementwise kernels do not wait on their producer; the probe must say so
    rows, hidden = 2048, 768
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.float16)
    gamma = torch.randn(hidden, device="cuda", dtype=torch.float16)
    beta = torch.randn(hidden, device="cuda", dtype=torch.float16)
    w = torch.randn(hidden, hidden, device="cuda", dtype=torch.float16) / 32
    graph, out = _capture(x, gamma, beta, w, consumer)
    raw = graph.raw_cuda_graph()
    found = ops.graph_edges.consumers(raw, x.device)
    assert len(found) == 1

    probe_out = torch.empty_like(out)
    probe = edges.Probe(torch.empty_like(x), lambda t: consume_into(t, w, probe_out), probe_out,
                        lambda: probe_out.fill_(float("nan")))
    verdicts = edges.probe_consumer(probe, ops, x.device, torch.cuda.Stream())
    assert list(verdicts) == found  # the probe ran the forward's kernel
    if name == "elementwise":
        assert verdicts == {found[0]: False}  # it ran during the copy's spin: stale input
    # the GEMM: on the H100 (CUDA 13.0) cuBLASLt's kernel did not wait either; its
    # verdict is whatever the probe found, and the graph below must stay exact with it

    batches = [x.clone(), torch.randn_like(x)]
    relaxed = edges.relax_captured(raw, ops, x.device, lambda k: x.copy_(batches[k]), [out], verdicts)
    assert torch.equal(x, batches[0])
    assert relaxed == [f for f, waits in verdicts.items() if waits]
    for trial in range(8):  # the graph computes its reference, relaxed or not
        k = trial % 2
        x.copy_(batches[k])
        out.fill_(float("nan"))
        graph.replay()
        want = consumer(ops.layernorm(batches[k], gamma, beta, 1e-5), w)
        assert torch.equal(out, want), (trial, relaxed)


@pytest.mark.gpu
def test_delayed_copy_copies_and_checks_its_arguments():
    src = torch.randn(1000, 24, device="cuda", dtype=torch.float16)
    dst = torch.full_like(src, float("nan"))
    spin = torch.tensor([100_000], device="cuda")
    ops.graph_edges.delayed_copy(src, dst, spin)
    assert torch.equal(dst, src)
    with pytest.raises(ops.InputError, match="shape"):
        ops.graph_edges.delayed_copy(src, dst[:10], spin)
    with pytest.raises(ops.InputError, match="int64"):
        ops.graph_edges.delayed_copy(src, dst, spin.int())
    with pytest.raises(ops.InputError, match="multiple of 16 bytes"):
        ops.graph_edges.delayed_copy(src[:1, :3].contiguous(), dst[:1, :3].contiguous(), spin)
    with pytest.raises(ops.InputError, match="aligned"):
        ops.graph_edges.delayed_copy(src.view(-1)[4:12], dst.view(-1)[:8], spin)  # 8 bytes in


@pytest.mark.gpu
def test_graph_exec_relaxes_a_copy_only():
    x = torch.randn(256, 768, device="cuda", dtype=torch.float16)
    gamma, beta = torch.ones(768, device="cuda", dtype=torch.float16), torch.zeros(768, device="cuda",
                                                                                    dtype=torch.float16)
    w = torch.randn(768, 768, device="cuda", dtype=torch.float16)
    graph, out = _capture(x, gamma, beta, w, lambda h, w: h @ w)
    raw = graph.raw_cuda_graph()
    found = ops.graph_edges.consumers(raw, x.device)
    with ops.graph_edges.GraphExec(raw, found, x.device) as copy:
        assert copy.relaxed == 1
        copy.launch()
    assert ops.graph_edges.consumers(raw, x.device) == found  # the graph itself kept its full edge
    assert ops.graph_edges.relax_edges(raw, found, x.device) == 1
    assert ops.graph_edges.consumers(raw, x.device) == []
    with pytest.raises(ops.InputError, match="cudaGraph_t"):
        ops.graph_edges.consumers(0, x.device)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [[93], [200, 17, 256, 64]], ids=["1 sequence", "4 sequences"])
def test_encoder_relaxed_graphs_match_captured_ones(lengths):
    transformers = pytest.importorskip("transformers")
    from padfree.torch import from_hf
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=2)).eval()
    encoders = [from_hf(model, dtype=torch.float16, device="cuda", programmatic_edges=edges_on)
                for edges_on in (True, False)]
    seqlen = max(lengths)
    mask = (torch.arange(seqlen)[None] < torch.tensor(lengths)[:, None]).long().cuda()
    for trial in range(4):  # the same bucket, new tokens each time: stale rows would show
        ids = torch.randint(1000, 30000, (len(lengths), seqlen), device="cuda")
        got, want = (enc(ids, mask) for enc in encoders)
        assert torch.equal(got.last_hidden_state, want.last_hidden_state), trial
        assert torch.equal(got.pooler_output, want.pooler_output), trial
