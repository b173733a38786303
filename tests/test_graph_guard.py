"""padfree.ops.GuardedGraph: a captured graph that runs only where device-side totals fit its ranges
(and PaddedInputPacker.enqueue, which writes those totals without a read-back)."""
from __future__ import annotations

import random

import pytest
import torch
from test_inputs import TYPE_VOCAB, VOCAB, _packer_buffers, padded_batch

from padfree import ops


def _counting_graph(counter: torch.Tensor) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        counter.add_(1)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, stream=stream):
        counter.add_(1)
    return graph


def _guarded_counter(seed, tokens: int, rows: int, longest: int):
    """A generator, a packer with its buffers (no token types), and a counting graph guarded over the
    packer's totals with ranges (1, tokens) and (1, longest)."""
    gen = torch.Generator().manual_seed(seed)
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, TYPE_VOCAB)
    buffers = _packer_buffers(tokens, rows, False)
    counter = torch.zeros(1, device="cuda")
    graph = _counting_graph(counter)
    return gen, packer, buffers, counter, graph, ops.GuardedGraph(graph, packer.totals, (1, tokens), (1, longest))


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


# 8x30 and 1x128: the prepare step is one CTA; 40x30: a cooperative grid
@pytest.mark.gpu
@pytest.mark.parametrize("batch, width", [(8, 30), (1, 128), (40, 30)])
@pytest.mark.parametrize("types", [False, True])
def test_packer_enqueue_launches_a_guarded_graph_behind_the_prepare(seed, batch, width, types):
    """enqueue(..., then=guarded): the prepare step and the guarded graph in one C call; the graph
    reads the totals that this call's prepare step wrote, so it runs for good inputs only, and only
    where they fit its ranges (a bad row, a total or longest outside them: skipped)."""
    gen = torch.Generator().manual_seed(seed)
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, TYPE_VOCAB)
    buffers = _packer_buffers(batch * width, batch + 5, types)
    _, ids, mask, type_ids, _ = padded_batch(gen, batch, width, torch.int64, torch.int64, types)
    packer(ids, mask, type_ids, *buffers)
    counter = torch.zeros(1, device="cuda")
    graph = _counting_graph(counter)
    everything = ops.GuardedGraph(graph, packer.totals, (1, batch * width), (1, width))
    runs = 0
    for case in ("good", "bad row", "good", "total outside", "longest outside", "good", "good"):
        lengths, ids, mask, type_ids, host_mask = padded_batch(gen, batch, width, torch.int64, torch.int64, types)
        total, longest = int(lengths.sum()), int(lengths.max())
        guarded = everything
        if case == "bad row":
            mask[batch // 2, 0] = 2
        elif case == "total outside":  # ranges that just miss this call's totals
            guarded = ops.GuardedGraph(graph, packer.totals, (total + 1, total + 1), (1, width))
        elif case == "longest outside":
            guarded = ops.GuardedGraph(graph, packer.totals, (1, batch * width), (longest + 1, longest + 1))
        counter.fill_(-5.0)  # poisoned: a skipped graph leaves it so
        for packed in buffers[:2]:
            if packed is not None:
                packed.fill_(-7)
        assert packer.enqueue(ids, mask, type_ids, *buffers, then=guarded)
        flags, got_total, got_longest = packer.results()
        torch.cuda.synchronize()
        ran = case == "good"
        assert (flags != 0) == (case == "bad row")
        assert float(counter) == (-4.0 if ran else -5.0), case
        assert guarded.fits(flags, got_total, got_longest) == ran, case
        if case != "bad row":
            assert (got_total, got_longest) == (total, longest)
            assert torch.equal(buffers[0][:total].cpu(), ids.cpu()[host_mask].to(torch.int32))
            if types:
                assert torch.equal(buffers[1][:total].cpu(), type_ids.cpu()[host_mask].to(torch.int32))
        runs += ran
        if guarded is not everything:
            guarded.close()
    assert runs == 4
    everything.close()


@pytest.mark.gpu
def test_guarded_graph_behind_many_layouts_and_other_totals(seed):
    """One guarded graph behind many input layouts (a plan each), and behind a packer whose totals
    it does not read: its guard reads its own stats."""
    gen, packer, buffers, counter, graph, guarded = _guarded_counter(seed, 16 * 64, 20, 64)
    widths = list(range(20, 31))
    for width in widths:
        _, ids, mask, _, _ = padded_batch(gen, 4, width, torch.int64, torch.int64, False)
        packer(ids, mask, None, *buffers)
    for width in widths + widths[:3]:
        lengths, ids, mask, _, _ = padded_batch(gen, 4, width, torch.int64, torch.int64, False)
        counter.fill_(-5.0)
        assert packer.enqueue(ids, mask, None, *buffers, then=guarded)
        assert packer.results() == (0, int(lengths.sum()), int(lengths.max()))
        torch.cuda.synchronize()
        assert float(counter) == -4.0, width
    # a guard over other stats: this call's totals do not decide it
    other_stats = torch.tensor([1, 1, 1], dtype=torch.int32, device="cuda")  # flags set: skip
    elsewhere = ops.GuardedGraph(graph, other_stats, (1, 16 * 64), (1, 64))
    for stats, expected in (([1, 1, 1], -5.0), ([0, 5, 5], -4.0)):
        other_stats.copy_(torch.tensor(stats, dtype=torch.int32))
        lengths, ids, mask, _, _ = padded_batch(gen, 4, 25, torch.int64, torch.int64, False)
        counter.fill_(-5.0)
        assert packer.enqueue(ids, mask, None, *buffers, then=elsewhere)
        assert packer.results() == (0, int(lengths.sum()), int(lengths.max()))
        torch.cuda.synchronize()
        assert float(counter) == expected, stats
    elsewhere.close()
    guarded.close()


@pytest.mark.gpu
def test_guarded_graph_behind_one_cta_and_grid_prepares(seed):
    """One guarded graph behind prepare steps of one CTA (one graph launch: that kernel in front of
    the graph), of a cooperative grid (a kernel launch, then the graph) and launched alone, in turn:
    each launch runs the body at most once, on that call's totals and packed ids."""
    gen, packer, buffers, counter, _, guarded = _guarded_counter(seed, 40 * 30, 45, 30)
    shapes = [(4, 30), (40, 30), (8, 20), (1, 30)]
    for batch, width in shapes:  # a plan each
        _, ids, mask, _, _ = padded_batch(gen, batch, width, torch.int64, torch.int64, False)
        packer(ids, mask, None, *buffers)
    order = shapes * 3
    random.Random(seed).shuffle(order)
    for i, (batch, width) in enumerate(order):
        lengths, ids, mask, _, host_mask = padded_batch(gen, batch, width, torch.int64, torch.int64, False)
        bad = i % 5 == 4
        if bad:
            mask[batch - 1, 0] = 2
        counter.fill_(-5.0)
        buffers[0].fill_(-7)
        assert packer.enqueue(ids, mask, None, *buffers, then=guarded)
        flags, total, longest = packer.results()
        torch.cuda.synchronize()
        assert float(counter) == (-5.0 if bad else -4.0), (batch, width, bad)
        assert (flags != 0) == bad
        if not bad:
            assert (total, longest) == (int(lengths.sum()), int(lengths.max()))
            assert torch.equal(buffers[0][:total].cpu(), ids.cpu()[host_mask].to(torch.int32))
        counter.fill_(-5.0)
        guarded.launch()  # alone: decided by the totals this call left
        torch.cuda.synchronize()
        assert float(counter) == (-5.0 if bad else -4.0)
    guarded.close()
