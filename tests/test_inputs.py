"""Padded integer model inputs on the GPU -> packed int32 inputs (padfree.ops.inputs), against a
PyTorch reference on fresh random batches; packed buffers poisoned, capacity tails checked."""
from __future__ import annotations

import pytest
import torch
from _packing import cu_of, random_lengths

from padfree import ops
from padfree.ops.inputs import FLAG_NAMES

VOCAB, TYPE_VOCAB = 1000, 3
POISON = -7
FLAG = {name: bit for bit, name in FLAG_NAMES.items()}


def padded_batch(gen, batch, width, id_dtype, mask_dtype, types):
    """Right-padded ids / mask / types with arbitrary (out-of-vocabulary) ids in the padding."""
    lengths = random_lengths(gen, batch, width)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    ids = torch.randint(0, VOCAB, (batch, width), generator=gen)
    ids[~mask] = torch.randint(-5, 10 * VOCAB, (int((~mask).sum()),), generator=gen)  # never read
    type_ids = torch.randint(0, TYPE_VOCAB, (batch, width), generator=gen) if types else None
    return (lengths, ids.to(id_dtype).cuda(), mask.to(mask_dtype).cuda(),
            None if type_ids is None else type_ids.to(id_dtype).cuda(), mask)


@pytest.mark.gpu
@pytest.mark.parametrize("batch, width", [(1, 1), (1, 128), (7, 33), (128, 64), (3, 512)])
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
@pytest.mark.parametrize("types", [True, False])
def test_stats_and_pack_match_reference(seed, batch, width, id_dtype, mask_dtype, types):
    gen = torch.Generator().manual_seed(seed)
    lengths, ids, mask, type_ids, host_mask = padded_batch(gen, batch, width, id_dtype, mask_dtype, types)
    stats = ops.padded_input_stats(ids, mask, type_ids, VOCAB, TYPE_VOCAB).cpu()
    total = int(lengths.sum())
    assert torch.equal(stats[:batch], lengths.to(torch.int32))
    assert stats[batch:].tolist() == [0, total, int(lengths.max())]

    capacity, guard = 2 * batch + 1, 5  # a bucket's larger batch, and poisoned ids past the total
    packed_ids = torch.full((total + guard,), POISON, dtype=torch.int32, device="cuda")
    packed_types = torch.full_like(packed_ids, POISON) if types else None
    cu_seqlens = torch.full((capacity + 1,), POISON, dtype=torch.int32, device="cuda")
    ops.pack_padded_inputs(ids, type_ids, stats[:batch].cuda(), packed_ids, packed_types, cu_seqlens)
    expected_cu = torch.cat([cu_of(lengths), torch.full((capacity - batch,), total, dtype=torch.int32)])
    assert torch.equal(cu_seqlens.cpu(), expected_cu)
    assert torch.equal(packed_ids[:total].cpu(), ids.cpu()[host_mask].to(torch.int32))
    assert (packed_ids[total:] == POISON).all(), "wrote past the total"
    if types:
        assert torch.equal(packed_types[:total].cpu(), type_ids.cpu()[host_mask].to(torch.int32))
        assert (packed_types[total:] == POISON).all()


@pytest.mark.gpu
def test_no_mask_means_every_position(seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (4, 9), generator=gen).cuda()
    assert ops.padded_input_stats(ids, None, None, VOCAB, 0).cpu().tolist() == [9, 9, 9, 9, 0, 36, 9]
    out = torch.full((7,), POISON, dtype=torch.int32, device="cuda")  # a reused buffer: stats zeroed first
    out[4:] = 99
    assert ops.padded_input_stats(ids, None, None, VOCAB, 0, out=out) is out
    assert out.cpu().tolist() == [9, 9, 9, 9, 0, 36, 9]


@pytest.mark.gpu
@pytest.mark.parametrize("batch, width", [(1, 5), (16, 256), (128, 128)])
def test_host_stats_is_a_stream_ordered_copy(seed, batch, width):
    """The pinned host copy of flags / total / longest, read after synchronizing, equals the device's."""
    gen = torch.Generator().manual_seed(seed)
    lengths, ids, mask, _, _ = padded_batch(gen, batch, width, torch.int64, torch.int64, False)
    host = torch.full((3,), POISON, dtype=torch.int32).pin_memory()
    stats = ops.padded_input_stats(ids, mask, None, VOCAB, 0, host_stats=host)
    torch.cuda.current_stream().synchronize()
    assert host.tolist() == [0, int(lengths.sum()), int(lengths.max())] == stats[batch:].tolist()
    mask[0, 0] = 3  # and a flag arrives too
    ops.padded_input_stats(ids, mask, None, VOCAB, 0, host_stats=host)
    torch.cuda.current_stream().synchronize()
    assert host[0] & FLAG["a mask value other than 0 and 1"]


@pytest.mark.gpu
@pytest.mark.parametrize("make", [lambda: torch.zeros(3, dtype=torch.int32),
                                  lambda: torch.zeros(4, dtype=torch.int32).pin_memory(),
                                  lambda: torch.zeros(3, dtype=torch.int64).pin_memory(),
                                  lambda: torch.zeros(3, dtype=torch.int32, device="cuda")])
def test_host_stats_must_be_pinned_int32_of_three(make):
    ids = torch.zeros(2, 4, dtype=torch.int64, device="cuda")
    with pytest.raises(ops.InputError, match="host_stats: expected a pinned"):
        ops.padded_input_stats(ids, None, None, VOCAB, 0, host_stats=make())


def _packer_buffers(tokens, capacity, types):
    packed = torch.full((tokens,), POISON, dtype=torch.int32, device="cuda")
    return (packed, torch.full_like(packed, POISON) if types else None,
            torch.full((capacity + 1,), POISON, dtype=torch.int32, device="cuda"))


# 9x40 and 1x1: one CTA; 70x512, 1000x8 and 2048x4 (its scans in chunks): a cooperative grid; 3000
# rows: past 2048, five operations
@pytest.mark.gpu
@pytest.mark.parametrize("types", [True, False])
@pytest.mark.parametrize("batch, width", [(9, 40), (1, 1), (70, 512), (1000, 8), (2048, 4), (3000, 4)])
def test_packer_matches_the_checked_calls_on_every_call(seed, types, batch, width):
    """PaddedInputPacker's first call (checked bindings) and later ones (one prepare_padded_inputs call
    for a known layout) both equal padded_input_stats + pack_padded_inputs, batch after fresh batch."""
    gen = torch.Generator().manual_seed(seed)
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, TYPE_VOCAB)
    checked = []
    checked_call = packer._checked
    packer._checked = lambda *args: (checked.append(1), checked_call(*args))
    got = _packer_buffers(batch * width + 3, batch + 7, types)  # the same buffers every call
    for _ in range(3):
        lengths, ids, mask, type_ids, _ = padded_batch(gen, batch, width, torch.int64, torch.int64, types)
        total = int(lengths.sum())
        for g in got:
            if g is not None:
                g.fill_(POISON)
        assert packer(ids, mask, type_ids, *got) == (0, total, int(lengths.max()))
        want = _packer_buffers(batch * width + 3, batch + 7, types)
        stats = ops.padded_input_stats(ids, mask, type_ids, VOCAB, TYPE_VOCAB)
        ops.pack_padded_inputs(ids, type_ids, stats[:batch], *want)
        for g, w in zip(got, want):
            if w is not None:
                assert torch.equal(g.cpu(), w.cpu())
        assert (got[0][total:] == POISON).all()
    assert len(checked) == 1, "later calls with the same layout and buffers skip the checked path"


# 6 rows: one CTA prepares them; 75 rows: a cooperative grid of ten CTAs
@pytest.mark.gpu
@pytest.mark.parametrize("batch", [6, 75])
def test_packer_reports_flags_and_cut_batches_and_repacks(seed, batch):
    gen = torch.Generator().manual_seed(seed)
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, TYPE_VOCAB)
    lengths, ids, mask, _, host_mask = padded_batch(gen, batch, 30, torch.int64, torch.int64, False)
    total = int(lengths.sum())
    small = _packer_buffers(total - 1, batch, False)  # one token short: a cut batch, nothing past it
    assert packer(ids, mask, None, *small) == (0, total, int(lengths.max()))
    large = _packer_buffers(total + 2, batch + 2, False)
    packer.repack(ids, None, large[0], None, large[2])
    assert torch.equal(large[0][:total].cpu(), ids.cpu()[host_mask].to(torch.int32))
    assert (large[0][total:] == POISON).all()
    # the same layout, so one prepare call: every flag still arrives
    bad_value, empty, holed, bad_id = mask.clone(), mask.clone(), mask.clone(), ids.clone()
    full = batch - 1  # random_lengths' full row (so each change below flags only itself), in the last CTA
    bad_value[full, 3] = 2
    empty[2] = 0
    holed[full, 0] = 0
    bad_id[full, 0] = VOCAB
    flags, _, _ = packer(ids, bad_value, None, *small)
    assert flags & FLAG["a mask value other than 0 and 1"]  # and the row is not ones then zeros
    for m, i, flag in ((empty, ids, "an empty sequence"), (holed, ids, "a mask row that is not ones then zeros"),
                       (mask, bad_id, "a token id out of range")):
        flags, _, _ = packer(i, m, None, *small)
        assert flags == FLAG[flag], flag


@pytest.mark.gpu
def test_packer_checks_each_new_layout():
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, TYPE_VOCAB)
    ids = torch.zeros(2, 4, dtype=torch.int64, device="cuda")
    bufs = _packer_buffers(8, 2, False)
    assert packer(ids, None, None, *bufs) == (0, 8, 4)
    with pytest.raises(ops.InputError, match="input_ids: expected dtype"):
        packer(ids.double(), None, None, *bufs)
    with pytest.raises(ops.InputError, match="contiguous"):
        packer(torch.zeros(4, 2, dtype=torch.int64, device="cuda").t(), None, None, *bufs)
    with pytest.raises(ops.InputError, match="cu_seqlens"):
        packer(ids, None, None, bufs[0], None, bufs[2][:2])  # capacity 1 < batch 2


@pytest.mark.gpu
def test_packer_repacks_the_last_calls_lengths_after_its_scratch_grew(seed):
    """Each layout's input plan keeps the lengths buffer it was made with; a larger batch's layout
    grows the packer's buffer; repack() must still read where the last call wrote."""
    gen = torch.Generator().manual_seed(seed)
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, TYPE_VOCAB)
    bufs = _packer_buffers(50 * 20, 60, False)
    small = padded_batch(gen, 3, 20, torch.int64, torch.int64, False)
    packer(small[1], small[2], None, *bufs)  # plan for 3 rows, on a 6-row lengths buffer
    packer(*padded_batch(gen, 50, 20, torch.int64, torch.int64, False)[1:3], None, *bufs)  # grows it
    lengths, ids, mask, _, host_mask = padded_batch(gen, 3, 20, torch.int64, torch.int64, False)
    assert packer.enqueue(ids, mask, None, *bufs)
    total = int(lengths.sum())
    assert packer.results() == (0, total, int(lengths.max()))
    other = _packer_buffers(total + 3, 4, False)
    packer.repack(ids, None, other[0], None, other[2])
    assert torch.equal(other[0][:total].cpu(), ids.cpu()[host_mask].to(torch.int32))
    assert torch.equal(other[2].cpu(), torch.cat([cu_of(lengths), torch.tensor([total], dtype=torch.int32)]))


def _flags(ids, mask, types=None, type_vocab=TYPE_VOCAB) -> int:
    return int(ops.padded_input_stats(ids, mask, types, VOCAB, type_vocab)[ids.shape[0]])


@pytest.mark.gpu
def test_each_flag(seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (3, 8), generator=gen).cuda()
    mask = torch.ones(3, 8, dtype=torch.int64, device="cuda")
    mask[1, 5:] = 0
    assert _flags(ids, mask) == 0
    bad = mask.clone(); bad[2, 3] = 2
    assert _flags(ids, bad) & FLAG["a mask value other than 0 and 1"]
    bad = mask.clone(); bad[2, 3] = -1
    assert _flags(ids, bad) & FLAG["a mask value other than 0 and 1"]
    holed = mask.clone(); holed[0, 2] = 0
    assert _flags(ids, holed) == FLAG["a mask row that is not ones then zeros"]
    left = mask.clone(); left[1] = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    assert _flags(ids, left) == FLAG["a mask row that is not ones then zeros"]
    empty = mask.clone(); empty[2] = 0
    assert _flags(ids, empty) == FLAG["an empty sequence"]
    for bad_id in (-1, VOCAB):
        out = ids.clone(); out[1, 4] = bad_id
        assert _flags(out, mask) == FLAG["a token id out of range"]
    padding = ids.clone(); padding[1, 6] = -1  # a padded position: not a token
    assert _flags(padding, mask) == 0
    types = torch.zeros_like(ids); types[0, 7] = TYPE_VOCAB
    assert _flags(ids, mask, types) == FLAG["a token type id out of range"]
    assert _flags(ids, mask, torch.zeros_like(ids), type_vocab=0) == FLAG["a token type id out of range"]


@pytest.mark.gpu
def test_forbidden_id_is_flagged_only_in_tokens(seed):
    """A RoBERTa-style model's padding id inside a sequence is flagged (the HF-style call then takes the
    host route, which refuses it with its place); in the padding it is fine, and -1 checks nothing."""
    gen = torch.Generator().manual_seed(seed)
    pad = 1
    ids = torch.randint(2, VOCAB, (4, 9), generator=gen).cuda()
    mask = torch.ones(4, 9, dtype=torch.int64, device="cuda")
    mask[2, 4:] = 0
    forbidden = FLAG["the model's padding id as a token"]

    def flags(ids, mask, forbidden_id):
        return int(ops.padded_input_stats(ids, mask, None, VOCAB, 0, forbidden_id=forbidden_id)[4])

    assert flags(ids, mask, pad) == 0
    padded = ids.clone(); padded[2, 4:] = pad  # padding positions hold it: not tokens
    assert flags(padded, mask, pad) == 0
    for row, col in ((0, 0), (3, 8), (2, 3)):
        inside = ids.clone(); inside[row, col] = pad
        assert flags(inside, mask, pad) == forbidden, (row, col)
        assert flags(inside, mask, -1) == 0
        assert flags(inside, None, pad) == forbidden
    packer = ops.PaddedInputPacker(torch.device("cuda"), VOCAB, 0, pad)
    inside = ids.clone(); inside[1, 5] = pad
    packed, _, cu = _packer_buffers(64, 4, False)
    assert packer(inside, mask, None, packed, None, cu)[0] == forbidden
    assert packer(ids, mask, None, packed, None, cu)[0] == 0        # the planned route as well
    assert packer(inside, mask, None, packed, None, cu)[0] == forbidden
    with pytest.raises(ops.InputError, match="forbidden_id"):
        ops.padded_input_stats(ids, mask, None, VOCAB, 0, forbidden_id=-2)


@pytest.mark.gpu
def test_pack_stays_within_the_packed_buffers(seed):
    """seqlens that claim more than the buffers hold (a caller's mistake) write nothing past them."""
    ids = torch.arange(40, device="cuda").reshape(4, 10)
    seqlens = torch.tensor([10, 10, 10, 10], dtype=torch.int32, device="cuda")
    buffer = torch.full((30,), POISON, dtype=torch.int32, device="cuda")
    packed, cu = buffer[:25], torch.empty(5, dtype=torch.int32, device="cuda")
    ops.pack_padded_inputs(ids, None, seqlens, packed, None, cu)
    assert torch.equal(packed.cpu(), torch.arange(25, dtype=torch.int32))
    assert (buffer[25:] == POISON).all()


@pytest.mark.gpu
def test_bad_tensors_raise():
    ids = torch.zeros(2, 4, dtype=torch.int64, device="cuda")
    with pytest.raises(ops.InputError, match="input_ids: expected dtype"):
        ops.padded_input_stats(ids.float(), None, None, VOCAB, 0)
    with pytest.raises(ops.InputError, match="attention_mask: expected shape"):
        ops.padded_input_stats(ids, torch.ones(2, 5, device="cuda", dtype=torch.int64), None, VOCAB, 0)
    with pytest.raises(ops.InputError, match="token_type_ids: expected dtype"):
        ops.padded_input_stats(ids, None, ids.int(), VOCAB, 2)
    with pytest.raises(ops.InputError, match="contiguous"):
        ops.padded_input_stats(ids.t(), None, None, VOCAB, 0)
    with pytest.raises(ops.InputError, match="batch"):
        ops.padded_input_stats(ids[:0], None, None, VOCAB, 0)
