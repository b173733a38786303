"""padfree.ops.GuardedGraph: a captured graph that runs only where device-side totals fit its ranges
(and PaddedInputPacker.enqueue, which writes those totals without a read-back)."""
from __future__ import annotations

import pytest
import torch

from padfree import ops

from test_inputs import VOCAB, TYPE_VOCAB, _packer_buffers, padded_batch


def _counting_graph(counter: torch.Tensor) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        counter.add_(1)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, stream=stream):
        counter.add_(1)
    return graph


@pytest.mark.gpu
def test_guarded_graph_runs_exactly_within_its_ranges():
    counter = torch.zeros(4, device="cuda")
    graph = _counting_graph(counter)
    stats = torch.full((3,), -1, dtype=torch.int32, device="cuda")
    guarded = ops.GuardedGraph(graph, stats, (10, 20), (3, 5))
    cases = [((0, 10, 3), True), ((0, 20, 5), True), ((0, 15, 4), True), ((0, 9, 4), False), ((0, 21, 4), False),
             ((0, 15, 2), False), ((0, 15, 6), False), ((1, 15, 4), False), ((16, 15, 4), False), ((0, 0, 0), False)]
    runs = 0
    for values, expected in cases:
        counter.fill_(-3.0)  # poisoned: a skipped graph leaves it so
        before = float(counter[0])
        stats.copy_(torch.tensor(values, dtype=torch.int32))
        guarded.launch()
        torch.cuda.synchronize()
        assert guarded.fits(*values) == expected, values
        assert (counter == before + (1 if expected else 0)).all(), values
        runs += expected
    assert runs == 3
    guarded.close()
    guarded.close()  # idempotent


@pytest.mark.gpu
def test_guarded_graph_refuses_bad_arguments():
    counter = torch.zeros(1, device="cuda")
    graph = _counting_graph(counter)
    stats = torch.zeros(3, dtype=torch.int32, device="cuda")
    with pytest.raises(ops.InputError, match="min <= max"):
        ops.GuardedGraph(graph, stats, (5, 4), (1, 1))
    with pytest.raises(ops.InputError, match="total range"):
        ops.GuardedGraph(graph, stats, (0, 4), (1, 1))
    with pytest.raises(ops.InputError, match="stats"):
        ops.GuardedGraph(graph, stats.long(), (1, 4), (1, 1))
    with pytest.raises(ops.InputError, match="CUDA"):
        ops.GuardedGraph(graph, stats.cpu(), (1, 4), (1, 1))
    plain = torch.cuda.CUDAGraph()  # no keep_graph: no cudaGraph_t to clone
    with torch.cuda.graph(plain):
        counter.add_(1)
    with pytest.raises(RuntimeError):
        ops.GuardedGraph(plain, stats, (1, 4), (1, 1))


@pytest.mark.gpu
def test_packer_enqueue_writes_totals_for_a_known_layout(seed):
    gen = torch.Generator().manual_seed(seed)
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, TYPE_VOCAB)
    buffers = _packer_buffers(40 * 30, 50, False)
    _, ids, mask, _, _ = padded_batch(gen, 40, 30, torch.int64, torch.int64, False)
    assert not packer.enqueue(ids, mask, None, *buffers)  # a new layout: nothing enqueued
    packer(ids, mask, None, *buffers)
    for _ in range(3):
        lengths, ids, mask, _, host_mask = padded_batch(gen, 40, 30, torch.int64, torch.int64, False)
        packer.totals.fill_(-1)
        buffers[0].fill_(-7)
        assert packer.enqueue(ids, mask, None, *buffers)
        expected = (0, int(lengths.sum()), int(lengths.max()))
        assert packer.results() == expected
        assert tuple(packer.totals.tolist()) == expected
        assert torch.equal(buffers[0][:expected[1]].cpu(), ids.cpu()[host_mask].to(torch.int32))
    assert not packer.enqueue(ids[:, :20].contiguous(), mask[:, :20].contiguous(), None, *buffers)


@pytest.mark.gpu
def test_packer_enqueue_launches_a_guarded_graph_behind_the_prepare(seed):
    """enqueue(..., then=guarded): the prepare step and the guarded graph in one C call; the graph
    reads the totals that this call's prepare step wrote, so it runs for good inputs only."""
    gen = torch.Generator().manual_seed(seed)
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, TYPE_VOCAB)
    buffers = _packer_buffers(40 * 30, 50, False)
    _, ids, mask, _, _ = padded_batch(gen, 40, 30, torch.int64, torch.int64, False)
    packer(ids, mask, None, *buffers)
    counter = torch.zeros(1, device="cuda")
    guarded = ops.GuardedGraph(_counting_graph(counter), packer.totals, (1, 40 * 30), (1, 30))
    for bad in (False, True, False):
        lengths, ids, mask, _, _ = padded_batch(gen, 40, 30, torch.int64, torch.int64, False)
        if bad:
            mask[3, 0] = 2
        counter.fill_(-5.0)  # poisoned: a skipped graph leaves it so
        assert packer.enqueue(ids, mask, None, *buffers, then=guarded)
        flags, total, longest = packer.results()
        torch.cuda.synchronize()
        assert (flags != 0) == bad and total == int(lengths.sum()) - bad
        assert float(counter) == (-5.0 if bad else -4.0)
        assert guarded.fits(flags, total, longest) == (not bad)
    guarded.close()
