"""padfree.runtime (Runtime, EncoderBackend), padfree.polygraphy_runners and `padfree run`.

CPU tests drive the Runtime's host logic (validation, packing, splitting, unpacking) through
ToyBackend, a backend test double whose per-token function has an answer computed independently
here from the unpacked sequences. GPU tests serve a tiny random BertModel through the PyTorch path
and compare with HF eager (float64 on the CPU) and with ONNX Runtime through polygraphy.
"""
from __future__ import annotations

import argparse
import json
from collections import OrderedDict

import numpy as np
import pytest
import torch

from padfree.ops._tensors import InputError
from padfree.runtime import EncoderBackend, Limits, Runtime
from padfree.runtime._plan import plan_chunks
from padfree.runtime._staging import ALIGN_ELEMENTS

VOCAB, TYPES, MAX_SEQLEN, HIDDEN = 100, 3, 24, 5


# ---------------------------------------------------------------------------------------------
# The backend test double and its independent reference
# ---------------------------------------------------------------------------------------------

def token_value(ids, positions, types, hidden=HIDDEN):
    """out[t, h] of ToyBackend: exact in float32 for these ranges."""
    ids, positions, types = (np.asarray(x, dtype=np.float64)[..., None] for x in (ids, positions, types))
    return ids + 128.0 * positions + 16384.0 * types + 0.25 * np.arange(hidden)


def expected_sequence(ids, types=None):
    ids = np.asarray(ids)
    types = np.zeros_like(ids) if types is None else np.asarray(types)
    return token_value(ids, np.arange(len(ids)), types)


def expected_pooler(ids):
    ids = np.asarray(ids, dtype=np.float64)
    return ids.sum() + len(ids) * np.arange(HIDDEN)


class ToyBackend:
    """The backend protocol on the CPU. It checks every call against the contract, records the
    chunk sizes, and returns its outputs in one static NaN-poisoned buffer that the next call
    overwrites, as a CUDA-graph replay does: the Runtime must copy them out."""

    output_names = ["last_hidden_state", "pooler_output"]
    device = "cpu"

    def __init__(self, max_tokens=64, max_batch=8, max_seqlen=MAX_SEQLEN, type_vocab_size=TYPES,
                 position_bug=0, vocab_size=VOCAB):
        self.limits = Limits(max_tokens=max_tokens, max_batch=max_batch, max_seqlen=max_seqlen,
                             vocab_size=vocab_size, type_vocab_size=type_vocab_size, dtype=torch.float32)
        self.calls: list[tuple[int, int]] = []
        self._tokens = torch.empty(max_tokens, HIDDEN)
        self._pooled = torch.empty(max_batch, HIDDEN)
        self.position_bug = position_bug  # a wrong backend, to show the comparisons can fail

    def execute_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, stream):
        assert stream is None
        for t in (input_ids, cu_seqlens) + ((token_type_ids,) if token_type_ids is not None else ()):
            assert t.dtype == torch.int32 and t.dim() == 1 and t.is_contiguous()
        T, B = input_ids.numel(), cu_seqlens.numel() - 1
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        assert 1 <= B <= self.limits.max_batch and 1 <= T <= self.limits.max_tokens
        assert cu_seqlens[0] == 0 and cu_seqlens[-1] == T and min(lengths) >= 1
        assert max_seqlen == max(lengths) <= self.limits.max_seqlen
        if token_type_ids is not None:
            assert token_type_ids.numel() == T
        self.calls.append((B, T))
        positions = np.concatenate([np.arange(n) for n in lengths]) + self.position_bug
        types = np.zeros(T) if token_type_ids is None else token_type_ids.numpy()
        self._tokens.fill_(float("nan"))
        self._pooled.fill_(float("nan"))
        self._tokens[:T] = torch.from_numpy(token_value(input_ids.numpy(), positions, types))
        for b in range(B):
            self._pooled[b] = torch.from_numpy(expected_pooler(input_ids[cu_seqlens[b]:cu_seqlens[b + 1]].numpy()))
        return {"last_hidden_state": self._tokens[:T], "pooler_output": self._pooled[:B]}


def random_sequences(rng, batch, max_len=MAX_SEQLEN, with_edges=True, type_vocab=TYPES):
    lengths = rng.integers(1, max_len + 1, size=batch)
    if with_edges and batch >= 2:
        lengths[rng.choice(batch, 2, replace=False)] = [1, max_len]
    return ([rng.integers(0, VOCAB, size=n) for n in lengths],
            [rng.integers(0, type_vocab, size=n) for n in lengths])


def pad(seqs, width=None, fill=0):
    width = width or max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), fill, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


def as_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


def check_per_sequence(out, seqs, types=None):
    hidden = out["last_hidden_state"]
    assert len(hidden) == len(seqs)
    for i, s in enumerate(seqs):
        want = expected_sequence(s, None if types is None else types[i])
        np.testing.assert_array_equal(as_numpy(hidden[i]), want.astype(np.float32))
    pooled = as_numpy(out["pooler_output"])
    np.testing.assert_array_equal(pooled, np.stack([expected_pooler(s) for s in seqs]).astype(np.float32))


def check_padded(out, seqs, width, types=None):
    hidden = as_numpy(out["last_hidden_state"])
    assert hidden.shape == (len(seqs), width, HIDDEN)
    for i, s in enumerate(seqs):
        want = expected_sequence(s, None if types is None else types[i])
        np.testing.assert_array_equal(hidden[i, :len(s)], want.astype(np.float32))
        assert (hidden[i, len(s):] == 0).all(), f"padding rows of sequence {i} are not zero"
    np.testing.assert_array_equal(as_numpy(out["pooler_output"]),
                                  np.stack([expected_pooler(s) for s in seqs]).astype(np.float32))


# ---------------------------------------------------------------------------------------------
# Input forms and output forms
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("output", ["torch", "numpy"])
@pytest.mark.parametrize("with_types", [False, True])
def test_list_of_sequences(seed, output, with_types):
    rng = np.random.default_rng(seed)
    seqs, types = random_sequences(rng, 7)
    # every accepted element form in one batch: Python list, numpy int32, torch int64, numpy uint16
    forms = [list(map(int, seqs[0])), seqs[1].astype(np.int32), torch.from_numpy(seqs[2]),
             seqs[3].astype(np.uint16)] + seqs[4:]
    rt = Runtime(ToyBackend(), output=output)
    out = rt.run(forms, token_type_ids=types if with_types else None)
    check_per_sequence(out, seqs, types if with_types else None)
    kind = torch.Tensor if output == "torch" else np.ndarray
    assert all(isinstance(x, kind) for x in out["last_hidden_state"])


@pytest.mark.parametrize("array", [np.asarray, torch.from_numpy])
@pytest.mark.parametrize("mask_dtype", [np.int64, np.int32, bool])
def test_padded_batch(seed, array, mask_dtype):
    rng = np.random.default_rng(seed)
    seqs, types = random_sequences(rng, 6)
    width = MAX_SEQLEN + 3  # wider than the longest sequence: outputs keep the input's width
    ids, mask = pad(seqs, width, fill=rng.integers(0, VOCAB))  # padding ids are ignored, whatever they are
    type_ids, _ = pad(types, width)
    rt = Runtime(ToyBackend())
    args = (array(ids), array(mask.astype(mask_dtype)))
    check_padded(rt.run(*args, token_type_ids=array(type_ids), padded=True), seqs, width, types)
    check_padded(rt.run(*args, token_type_ids=array(type_ids), padded=True, output="numpy"), seqs, width, types)
    check_per_sequence(rt.run(*args, token_type_ids=array(type_ids)), seqs, types)


def test_list_input_padded_output_and_hf_mapping(seed):
    rng = np.random.default_rng(seed)
    seqs, types = random_sequences(rng, 5)
    rt = Runtime(ToyBackend())
    check_padded(rt.run(seqs, padded=True), seqs, max(len(s) for s in seqs))
    ids, mask = pad(seqs)
    type_ids, _ = pad(types)
    encoding = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                "token_type_ids": torch.from_numpy(type_ids)}  # what an HF tokenizer returns
    check_per_sequence(rt.run(encoding), seqs, types)


def test_padded_batch_without_mask_is_all_tokens(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(3, 9))
    check_per_sequence(Runtime(ToyBackend()).run(ids), list(ids))


# ---------------------------------------------------------------------------------------------
# Splitting into chunks
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_batch,max_tokens", [(3, 64), (8, 30), (2, 24), (1, 24)])
def test_split_batches_keep_order(seed, max_batch, max_tokens):
    rng = np.random.default_rng(seed)
    seqs, types = random_sequences(rng, 17)
    backend = ToyBackend(max_tokens=max_tokens, max_batch=max_batch)
    out = Runtime(backend).run(seqs, token_type_ids=types)
    check_per_sequence(out, seqs, types)
    assert len(backend.calls) > 1
    assert sum(b for b, _ in backend.calls) == len(seqs)
    assert sum(t for _, t in backend.calls) == sum(len(s) for s in seqs)


def test_runtime_limits_tighten_and_cannot_exceed_backend(seed):
    rng = np.random.default_rng(seed)
    seqs, _ = random_sequences(rng, 9)
    backend = ToyBackend()
    check_padded(Runtime(backend, max_batch=2).run(seqs, padded=True), seqs, MAX_SEQLEN)
    assert max(b for b, _ in backend.calls) <= 2
    with pytest.raises(ValueError, match="max_batch=9 exceeds"):
        Runtime(ToyBackend(max_batch=8), max_batch=9)


def test_plan_chunks_is_greedy_contiguous_and_within_limits(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        max_tokens = int(rng.integers(1, 50))
        max_batch = int(rng.integers(1, 10))
        lengths = rng.integers(1, max_tokens + 1, size=int(rng.integers(1, 40)))
        chunks = plan_chunks(lengths, max_batch, max_tokens)
        cu = np.concatenate(([0], np.cumsum(lengths)))
        assert chunks[0].first == 0 and chunks[-1].stop == len(lengths)
        for a, b in zip(chunks, chunks[1:]):
            assert a.stop == b.first and a.token_stop == b.token_start
            # greedy: the chunk closed only because the next sequence did not fit
            assert a.batch == max_batch or a.tokens + lengths[b.first] > max_tokens
        for c in chunks:
            assert 1 <= c.batch <= max_batch and c.tokens <= max_tokens
            assert (c.token_start, c.token_stop) == (cu[c.first], cu[c.stop])
            assert c.max_seqlen == lengths[c.first:c.stop].max()


# ---------------------------------------------------------------------------------------------
# Staging buffer reuse, and outputs the caller keeps
# ---------------------------------------------------------------------------------------------

def test_staging_grows_geometrically_and_outputs_survive_later_runs(seed):
    rng = np.random.default_rng(seed)
    rt = Runtime(ToyBackend(max_tokens=400, max_batch=32))
    batches = [random_sequences(rng, n)[0] for n in (2, 20, 3, 30)]
    outputs, capacities = [], []
    for seqs in batches:
        outputs.append(rt.run(seqs))
        capacities.append(rt._staging.capacity)
    assert capacities[0] % ALIGN_ELEMENTS == 0
    assert capacities == sorted(capacities)            # never shrinks
    assert capacities[2] == capacities[1]               # a smaller batch reuses the buffer
    for seqs, out in zip(batches, outputs):             # earlier results were not overwritten
        check_per_sequence(out, seqs)


# ---------------------------------------------------------------------------------------------
# Bad input: clear InputError, before anything reaches the backend
# ---------------------------------------------------------------------------------------------

def _bad_inputs():
    ok = [[1, 2, 3], [4, 5]]
    ids, mask = pad(ok)
    holed = mask.copy()
    holed[0] = [1, 0, 1]
    right_padded_wrong = mask.copy()
    right_padded_wrong[1] = [0, 1, 1]
    two = mask.copy()
    two[0, 0] = 2
    return [
        ("empty list", ([],), {}, "empty batch"),
        ("empty sequence", ([[1, 2], []],), {}, "sequence 1 is empty"),
        ("empty torch sequence", ([torch.tensor([1]), torch.tensor([], dtype=torch.int64)],), {},
         "sequence 1 is empty"),
        ("too long", ([[1] * (MAX_SEQLEN + 1)],), {}, f"sequence 0 has {MAX_SEQLEN + 1} tokens"),
        ("id too large", ([[1, 2], [3, VOCAB]],), {}, f"token id {VOCAB} at sequence 1, position 1"),
        ("negative id", ([[1, -1]],), {}, "token id -1 at sequence 0, position 1"),
        ("huge uint64", ([np.array([2**63 + 5], dtype=np.uint64)],), {}, "out of range"),
        ("float ids", ([[1.0, 2.0]],), {}, "integer token ids"),
        ("bool ids", ([np.array([True, False])],), {}, "integer token ids"),
        ("float tensor ids", (torch.rand(2, 3),), {}, "integer token ids"),
        ("flat list", ([1, 2, 3],), {}, "flat list of ids"),
        ("2-D sequence", ([np.ones((2, 2), dtype=np.int64)],), {}, "1-D sequence"),
        ("string", ("hello",), {}, "expected a list of token sequences"),
        ("3-D padded", (np.ones((1, 2, 3), dtype=np.int64),), {}, r"\[batch, seq\]"),
        ("zero width", (np.ones((2, 0), dtype=np.int64),), {}, "width 0"),
        ("zero rows", (np.ones((0, 4), dtype=np.int64),), {}, "empty batch"),
        ("holed mask", (ids, holed), {}, "row 0 is not left-aligned"),
        ("left padding", (ids, right_padded_wrong), {}, "row 1 is not left-aligned"),
        ("all-zero row", (ids, mask * np.array([[1], [0]])), {}, "sequence 1 is empty"),
        ("mask of 2", (ids, two), {}, "only 0 and 1"),
        ("float mask", (ids, mask.astype(np.float32)), {}, "integer or bool mask"),
        ("mask shape", (ids, mask[:, :2]), {}, "attention_mask: expected shape"),
        ("ragged with mask", ([[1, 2], [3]], [[1, 1], [1]]), {}, "ragged"),
        ("types shape", (ids, mask), {"token_type_ids": np.zeros((2, 2), dtype=np.int64)},
         "token_type_ids: expected shape"),
        ("types count", (ok,), {"token_type_ids": [[0, 0, 0]]}, "list of 2 sequences"),
        ("types length", (ok,), {"token_type_ids": [[0, 0, 0], [0]]}, r"token_type_ids\[1\]: expected 2 ids"),
        ("type too large", (ok,), {"token_type_ids": [[0, 0, 0], [0, TYPES]]},
         f"token type id {TYPES} at sequence 1, position 1"),
        ("mapping twice", ({"input_ids": ids, "attention_mask": mask}, mask), {}, "given both"),
        ("mapping without ids", ({"ids": ids},), {}, "needs 'input_ids'"),
    ]


@pytest.mark.parametrize("label,args,kwargs,message", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_bad_input_raises_input_error(label, args, kwargs, message):
    backend = ToyBackend()
    with pytest.raises(InputError, match=message):
        Runtime(backend).run(*args, **kwargs)
    assert backend.calls == []


def test_check_packed_refuses_what_a_backend_must_not_get():
    """The execute_packed contract (int32, contiguous, on the backend's device) checked without reading
    values: a host tensor handed to a CUDA backend would reach TensorRT as a raw address."""
    from padfree.runtime.backends.base import check_packed
    ids = torch.tensor([5, 6, 7], dtype=torch.int32)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    check_packed(ids, cu, 2, cu.clone(), cpu)   # accepted where the device matches
    strided = torch.zeros(6, dtype=torch.int32)[::2]
    for args, device, message in [
        ((ids, cu, 2, None), cuda, "input_ids: expected a tensor on device cuda:0, got one on cpu"),
        ((ids.long(), cu, 2, None), cpu, "input_ids: expected dtype torch.int32"),
        ((ids, cu.long(), 2, None), cpu, "cu_seqlens: expected dtype torch.int32"),
        ((strided, cu, 2, None), cpu, "input_ids: expected a contiguous tensor"),
        ((ids.view(1, 3), cu, 2, None), cpu, r"input_ids: expected shape \[\*\]"),
        ((ids[:0], cu, 2, None), cpu, "at least one token"),
        ((ids, cu[:1], 2, None), cpu, "batch >= 1"),
        ((ids, cu, 0, None), cpu, "max_seqlen: expected a positive int"),
        ((ids, cu, True, None), cpu, "max_seqlen"),
        ((ids, cu, 2.0, None), cpu, "max_seqlen"),
        ((ids, cu, 2, ids[:2]), cpu, r"token_type_ids: expected shape \[3\]"),
        ((ids, cu, 2, ids.float()), cpu, "token_type_ids: expected dtype torch.int32"),
        ((ids.numpy(), cu, 2, None), cpu, "expected a torch.Tensor"),
    ]:
        with pytest.raises(InputError, match=message):
            check_packed(*args, device)


def test_ids_past_int32_refused_without_table_sizes():
    """A model that records no vocabulary sizes still gets no id that int32 staging would wrap
    (2**32 + 1 would arrive as the valid-looking id 1)."""
    backend = ToyBackend(vocab_size=None, type_vocab_size=None)
    rt = Runtime(backend)
    largest = [[1, 2**31 - 1]]
    check_per_sequence(rt.run(largest, token_type_ids=[[0, 2**31 - 1]]), largest, [[0, 2**31 - 1]])
    calls = len(backend.calls)
    for args, kwargs, what in [(([[1, 2**31]],), {}, "token id 2147483648 at sequence 0, position 1"),
                               (([[3], [1, 2**32 + 1]],), {}, "token id 4294967297 at sequence 1, position 1"),
                               ((torch.tensor([[5, 2**40]]), torch.ones(1, 2, dtype=torch.int64)), {}, "token id"),
                               (([[1, 2]],), {"token_type_ids": [[0, 2**32]]}, "token type id 4294967296")]:
        with pytest.raises(InputError, match=what + r".*\[0, 2\*\*31\)"):
            rt.run(*args, **kwargs)
    assert len(backend.calls) == calls


def test_token_types_refused_for_a_model_without_them():
    with pytest.raises(InputError, match="no token type embeddings"):
        Runtime(ToyBackend(type_vocab_size=0)).run([[1, 2]], token_type_ids=[[0, 0]])


def test_sequence_longer_than_max_tokens_is_refused():
    with pytest.raises(InputError, match="max_tokens 10"):
        Runtime(ToyBackend(max_tokens=10)).run([[1] * 11])


# ---------------------------------------------------------------------------------------------
# Backend contract, sources, options
# ---------------------------------------------------------------------------------------------

class _MissingOutput(ToyBackend):
    def execute_packed(self, *args):
        return {"last_hidden_state": super().execute_packed(*args)["last_hidden_state"]}


class _WrongRows(ToyBackend):
    def execute_packed(self, *args):
        out = super().execute_packed(*args)
        return {**out, "last_hidden_state": out["last_hidden_state"][:-1]}


@pytest.mark.parametrize("backend,message", [(_MissingOutput, "returned no 'pooler_output'"),
                                             (_WrongRows, "expected 3 rows")])
def test_backend_breaking_the_contract_is_reported(backend, message):
    with pytest.raises(RuntimeError, match=message):
        Runtime(backend()).run([[1, 2, 3]])


def test_sources_and_options_are_checked():
    with pytest.raises(TypeError, match="convert it with padfree.torch.from_hf"):
        Runtime(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="got int"):
        Runtime(3)
    with pytest.raises(ValueError, match="backend runs on cpu"):
        Runtime(ToyBackend(), stream=123)
    with pytest.raises(ValueError, match="output must be one of"):
        Runtime(ToyBackend(), output="list")
    with pytest.raises(ValueError, match="output must be one of"):
        Runtime(ToyBackend()).run([[1]], output="jax")
    with pytest.raises(TypeError, match="limits.max_seqlen"):
        Runtime(type("B", (), {"limits": {"max_tokens": 4, "max_batch": 2}, "output_names": [],
                               "device": "cpu", "execute_packed": None})())


def test_engine_source_goes_to_the_engine_backend(tmp_path):
    from padfree.engines.errors import EngineFormatError

    (tmp_path / "model.engine").write_bytes(b"not an engine")
    with pytest.raises(EngineFormatError, match="sidecar"):
        Runtime(tmp_path / "model.engine")


class _FakeConfig:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _FakeEncoder(torch.nn.Module):
    """A PadfreeEncoder stand-in on the CPU: forward_packed is ToyBackend's function."""

    def __init__(self, config, pooler=True):
        super().__init__()
        self.config = config
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.pooler = torch.nn.Identity() if pooler else None
        self._toy = ToyBackend(max_tokens=4096, max_batch=512, max_seqlen=4096)

    def forward_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids=None):
        return self._toy.execute_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids, None)


@pytest.mark.parametrize("model_type,pad,max_pos,type_vocab,max_seqlen",
                         [("bert", 0, 40, 2, 40), ("roberta", 1, 42, 1, 40), ("distilbert", 0, 40, None, 40)])
def test_encoder_backend_limits_from_config(seed, model_type, pad, max_pos, type_vocab, max_seqlen):
    config = _FakeConfig(model_type=model_type, pad_token_id=pad, max_position_embeddings=max_pos,
                         vocab_size=VOCAB, **({} if type_vocab is None else {"type_vocab_size": type_vocab}))
    encoder = _FakeEncoder(config, pooler=model_type != "distilbert")
    rt = Runtime(encoder, max_batch=3)
    assert isinstance(rt.backend, EncoderBackend)
    assert rt.limits.max_seqlen == max_seqlen and rt.limits.max_batch == 3
    assert rt.limits.type_vocab_size == (type_vocab or 0) and rt.limits.dtype == torch.float32
    assert rt.output_names == (["last_hidden_state"] if model_type == "distilbert"
                               else ["last_hidden_state", "pooler_output"])
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, VOCAB, size=n) for n in (1, max_seqlen, 7, 3, 5)]
    if model_type == "roberta":  # its padding id may not sit inside a sequence (the next test)
        seqs = [np.where(s == pad, pad + 1, s) for s in seqs]
    assert rt.limits.position_pad_id == (pad if model_type == "roberta" else None)
    out = rt.run(seqs, padded=True)
    for i, s in enumerate(seqs):
        np.testing.assert_array_equal(out["last_hidden_state"][i, :len(s)].numpy(), expected_sequence(s))
    with pytest.raises(InputError, match=f"more than this model serves \\(max_seqlen {max_seqlen}"):
        rt.run([[1] * (max_seqlen + 1)])


def test_padding_id_inside_a_roberta_sequence_is_refused():
    """HF numbers RoBERTa positions around the padding id (every later token moves by one), padfree
    numbers tokens in order: such a sequence is refused, where it sits named, not answered differently."""
    roberta = pytest.importorskip("transformers.models.roberta.modeling_roberta")
    pad_id = 1
    hf = roberta.RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor([[5, pad_id, 7]]), pad_id)
    assert hf.tolist() != [[pad_id + 1, pad_id + 2, pad_id + 3]]  # what padfree would use: the two disagree
    backend = ToyBackend()
    backend.limits = Limits(**{**backend.limits.__dict__, "position_pad_id": pad_id})
    rt = Runtime(backend)
    with pytest.raises(InputError, match="token id 1 \\(the padding id\\) at sequence 1, position 2"):
        rt.run([[5, 7], [6, 8, pad_id, 9]])
    ids, mask = pad([np.array([5, 7]), np.array([6, 8, 9])], fill=pad_id)
    check_padded(rt.run(ids, mask, padded=True), [[5, 7], [6, 8, 9]], 3)  # as padding it is fine
    with pytest.raises(InputError, match="the padding id"):
        rt.run(ids)  # no mask: every position is a token, the padding id included


def test_device_inputs_find_the_padding_id_only_in_tokens():
    """The PyTorch path's device packer does not look for the id; DeviceInputs does before using it."""
    from padfree.torch.inputs import DeviceInputs
    limits = Limits(max_tokens=64, max_batch=8, max_seqlen=8, position_pad_id=1)
    inputs = DeviceInputs(limits, torch.device("cpu"), None, None)
    ids = torch.tensor([[5, 7, 1], [6, 1, 9]])
    assert inputs._holds_pad_id(ids, torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert not inputs._holds_pad_id(ids, torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert inputs._holds_pad_id(ids, None)
    inputs.limits = Limits(max_tokens=64, max_batch=8, max_seqlen=8)
    assert not inputs._holds_pad_id(ids, None)


@pytest.mark.parametrize("limit", ["max_batch", "max_tokens"])
@pytest.mark.parametrize("value", [0, -3, True, 2.5])
def test_chunk_limits_must_be_positive_ints(limit, value):
    """0 used to mean "unset" (`max_batch or default`): every value given is now taken or refused."""
    with pytest.raises(ValueError, match=f"{limit} must be a positive int"):
        Runtime(ToyBackend(), **{limit: value})
    config = _FakeConfig(model_type="bert", pad_token_id=0, max_position_embeddings=40, vocab_size=VOCAB)
    with pytest.raises(ValueError, match=f"{limit} must be a positive int"):
        EncoderBackend(_FakeEncoder(config), **{limit: value})
    assert Runtime(ToyBackend(), **{limit: np.int64(1)}).limits.__dict__[limit] == 1


# ---------------------------------------------------------------------------------------------
# Polygraphy runners (CPU, with the test double)
# ---------------------------------------------------------------------------------------------

def padded_feeds(rng, iterations=3, batch=4, with_types=True, type_vocab=TYPES):
    feeds = []
    for _ in range(iterations):
        seqs, types = random_sequences(rng, batch, type_vocab=type_vocab)
        ids, mask = pad(seqs, MAX_SEQLEN)
        feed = OrderedDict(input_ids=ids, attention_mask=mask)
        if with_types:
            feed["token_type_ids"] = pad(types, MAX_SEQLEN)[0]
        feeds.append(feed)
    return feeds


def _reference_runner(garbage_in_padding: bool):
    """A polygraphy runner computing ToyBackend's function on padded arrays in numpy, independently
    of the Runtime; optionally with nonzero values in padding, as ONNX exports of HF models have."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    class Reference(BaseRunner):
        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            for name in ("input_ids", "attention_mask", "token_type_ids"):
                meta.add(name, np.int64, shape=("batch", "sequence"))
            return meta

        def infer_impl(self, feed):
            ids, mask, types = feed["input_ids"], feed["attention_mask"], feed["token_type_ids"]
            positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
            hidden = token_value(ids, positions, types).astype(np.float32)
            if not garbage_in_padding:
                hidden *= mask[..., None]
            pooled = (ids * mask).sum(1, keepdims=True) + mask.sum(1, keepdims=True) * np.arange(HIDDEN)
            self.inference_time = 0.0
            return OrderedDict(last_hidden_state=hidden, pooler_output=pooled.astype(np.float32))

    return Reference(name="reference")


@pytest.mark.parametrize("garbage_in_padding", [False, True])
def test_runtime_runner_in_comparator(seed, garbage_in_padding):
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    from padfree.polygraphy_runners import RuntimeRunner, mask_padding

    feeds = padded_feeds(np.random.default_rng(seed))
    compare = SimpleCompareFunc(atol=0, rtol=0)

    def compare_with(backend):
        runners = [RuntimeRunner(lambda: Runtime(backend, max_batch=3)), _reference_runner(garbage_in_padding)]
        results = Comparator.run(runners, data_loader=feeds)
        if garbage_in_padding:
            mask_padding(results, feeds)
        return bool(Comparator.compare_accuracy(results, compare_func=compare))

    assert compare_with(ToyBackend())
    assert not compare_with(ToyBackend(position_bug=1))


def test_runtime_runner_metadata_names_and_errors():
    from padfree.polygraphy_runners import RuntimeRunner

    with RuntimeRunner(Runtime(ToyBackend(type_vocab_size=0))) as runner:
        assert list(runner.get_input_metadata(use_numpy_dtypes=False)) == ["input_ids", "attention_mask"]
    with RuntimeRunner(Runtime(ToyBackend()), output_names={"last_hidden_state": "hidden"},
                       input_names=["input_ids", "attention_mask"]) as runner:
        assert list(runner.get_input_metadata(use_numpy_dtypes=False)) == ["input_ids", "attention_mask"]
        ids, mask = pad([[5, 6, 7], [8]])
        out = runner.infer({"input_ids": ids, "attention_mask": mask})
        assert list(out) == ["hidden", "pooler_output"] and out["hidden"].shape == (2, 3, HIDDEN)
        assert runner.last_inference_time() > 0
    with pytest.raises(ValueError, match="input_names"):
        with RuntimeRunner(Runtime(ToyBackend()), input_names=["ids"]):
            pass


# ---------------------------------------------------------------------------------------------
# Polygraphy with a real ONNX model on the CPU: RuntimeRunner over an HF-eager backend double vs
# ONNX Runtime on the model's ONNX export (checks feeds, input/output names, dtypes, padding)
# ---------------------------------------------------------------------------------------------

def tiny_bert(seed):
    """padfree.export's built-in tiny BERT (head_dim 64, 128 positions), every parameter random."""
    from padfree.export.models import BUILTIN, build

    config_cls, model_cls, fields = BUILTIN["tiny-bert"]
    return build(config_cls, model_cls, seed=seed, attn_implementation="eager", **fields)


def export_onnx(model, path):
    """The plain model.onnx of padfree.export (inputs input_ids, attention_mask, token_type_ids)."""
    import onnx

    from padfree.export.exporter import export_onnx as export

    onnx.save(export(model), str(path))
    return path


class HfEagerBackend:
    """The backend protocol over HF eager on the CPU: unpacks to a padded batch and runs the model."""

    device = "cpu"
    output_names = ["last_hidden_state", "pooler_output"]

    def __init__(self, model, max_batch=3):
        self.model = model
        c = model.config
        self.limits = Limits(max_tokens=4096, max_batch=max_batch, max_seqlen=c.max_position_embeddings,
                             vocab_size=c.vocab_size, type_vocab_size=c.type_vocab_size)

    @torch.no_grad()
    def execute_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, stream):
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        mask = torch.arange(max_seqlen)[None, :] < torch.tensor(lengths)[:, None]
        ids = torch.zeros(mask.shape, dtype=torch.int64)
        ids[mask] = input_ids.long()
        types = torch.zeros_like(ids)
        if token_type_ids is not None:
            types[mask] = token_type_ids.long()
        out = self.model(input_ids=ids, attention_mask=mask.long(), token_type_ids=types)
        return {"last_hidden_state": out.last_hidden_state[mask], "pooler_output": out.pooler_output}


def test_runtime_runner_vs_onnxruntime_on_cpu(seed, tmp_path):
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    from padfree.polygraphy_runners import RuntimeRunner, mask_padding

    model = tiny_bert(seed)
    path = export_onnx(model, tmp_path / "model.onnx")
    feeds = padded_feeds(np.random.default_rng(seed), batch=5, type_vocab=2)
    runners = [RuntimeRunner(Runtime(HfEagerBackend(model))), OnnxrtRunner(SessionFromOnnx(str(path)))]
    results = Comparator.run(runners, data_loader=feeds)
    mask_padding(results, feeds)
    assert bool(Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=1e-4, rtol=1e-4)))


# ---------------------------------------------------------------------------------------------
# `padfree run` (CPU: the runtime is the test double)
# ---------------------------------------------------------------------------------------------

def _cli(monkeypatch, argv, backend):
    from padfree.commands import run as runtime_cli

    monkeypatch.setattr(runtime_cli, "open_runtime", lambda args: Runtime(backend))
    parser = argparse.ArgumentParser()
    runtime_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["run", *argv])
    return args.func(args)


def test_cli_json_list_writes_outputs(seed, tmp_path, monkeypatch, capsys):
    seqs, _ = random_sequences(np.random.default_rng(seed), 4)
    (tmp_path / "batch.json").write_text(json.dumps([s.tolist() for s in seqs]))
    assert _cli(monkeypatch, ["engine", "--input", str(tmp_path / "batch.json"), "-o",
                              str(tmp_path / "out.npz")], ToyBackend()) == 0
    printed = capsys.readouterr().out
    assert f"lengths {[len(s) for s in seqs]}" in printed and "pooler_output: [4, 5]" in printed
    saved = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(saved["cu_seqlens"], np.cumsum([0] + [len(s) for s in seqs]))
    np.testing.assert_array_equal(saved["last_hidden_state"],
                                  np.concatenate([expected_sequence(s) for s in seqs]).astype(np.float32))


def test_cli_json_padded_and_random(seed, tmp_path, monkeypatch, capsys):
    seqs, types = random_sequences(np.random.default_rng(seed), 3)
    ids, mask = pad(seqs)
    (tmp_path / "batch.json").write_text(json.dumps({"input_ids": ids.tolist(), "attention_mask": mask.tolist(),
                                                     "token_type_ids": pad(types)[0].tolist()}))
    _cli(monkeypatch, ["x", "--input", str(tmp_path / "batch.json"), "--padded", "-o", str(tmp_path / "p.npz")],
         ToyBackend())
    check_padded(dict(np.load(tmp_path / "p.npz")), seqs, ids.shape[1], types)
    backend = ToyBackend(max_batch=2)
    _cli(monkeypatch, ["x", "--random", f"5,{MAX_SEQLEN}", "--seed", str(seed % 1000), "--padded"], backend)
    printed = capsys.readouterr().out
    assert "last_hidden_state: [5, " in printed and "pooler_output: [5, 5]" in printed
    assert len(backend.calls) == 3  # 5 sequences of at most 24 tokens, 2 per chunk


def test_cli_writes_exactly_the_named_file_and_checks_it_first(seed, tmp_path, monkeypatch):
    seqs, _ = random_sequences(np.random.default_rng(seed), 3)
    (tmp_path / "batch.json").write_text(json.dumps([s.tolist() for s in seqs]))
    out = tmp_path / "outputs.bin"  # np.savez(path) would have written outputs.bin.npz
    assert _cli(monkeypatch, ["x", "--input", str(tmp_path / "batch.json"), "-o", str(out)], ToyBackend()) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.json", "outputs.bin"]  # no temporary left
    np.testing.assert_array_equal(np.load(out)["cu_seqlens"], np.cumsum([0] + [len(s) for s in seqs]))
    from padfree.outputs import OutputError
    backend = ToyBackend()
    with pytest.raises(OutputError, match="is a folder"):
        _cli(monkeypatch, ["x", "--input", str(tmp_path / "batch.json"), "-o", str(tmp_path)], backend)
    with pytest.raises(OutputError, match="is a file, not a folder"):
        _cli(monkeypatch, ["x", "--input", str(tmp_path / "batch.json"), "-o", str(out / "o.npz")], backend)
    assert backend.calls == []  # refused before anything ran


def test_cli_reports_bad_input(tmp_path, monkeypatch):
    from padfree.arguments import CommandError
    (tmp_path / "bad.json").write_text(json.dumps([[1, 2], [VOCAB]]))
    with pytest.raises(CommandError, match="bad input: token id 100 at sequence 1"):
        _cli(monkeypatch, ["x", "--input", str(tmp_path / "bad.json")], ToyBackend())
    (tmp_path / "odd.json").write_text(json.dumps({"ids": []}))
    with pytest.raises(CommandError, match="expected a list of token-id lists"):
        _cli(monkeypatch, ["x", "--input", str(tmp_path / "odd.json")], ToyBackend())


# ---------------------------------------------------------------------------------------------
# GPU: the PyTorch path
# ---------------------------------------------------------------------------------------------

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


def _hf_reference(model, seqs, types):
    """HF eager in float64 on the CPU, per sequence (no padding: rows are exact references)."""
    model = model.to("cpu").double()
    outs = []
    with torch.no_grad():
        for s, t in zip(seqs, types):
            o = model(input_ids=torch.as_tensor(s)[None], token_type_ids=torch.as_tensor(t)[None])
            outs.append((o.last_hidden_state[0], o.pooler_output[0]))
    return outs


def _rel(a, b):
    a, b = torch.as_tensor(a).double().cpu(), torch.as_tensor(b).double().cpu()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_runtime_vs_hf_eager(seed, dtype):
    import copy

    from padfree.torch import from_hf

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = tiny_bert(seed)
    rng = np.random.default_rng(seed)
    vocab, longest = model.config.vocab_size, model.config.max_position_embeddings
    lengths = rng.integers(1, longest + 1, size=13)
    lengths[:2] = [1, longest]
    seqs = [rng.integers(0, vocab, size=n) for n in lengths]
    types = [rng.integers(0, 2, size=n) for n in lengths]
    reference = _hf_reference(copy.deepcopy(model), seqs, types)
    tol = TOLERANCE[dtype]

    # max_batch 4 / max_tokens 300: the 13 sequences need several chunks
    rt = Runtime(from_hf(model, dtype=dtype, device="cuda"), max_batch=4, max_tokens=300)
    out = rt.run(seqs, token_type_ids=types)
    for i, (hidden, pooled) in enumerate(reference):
        assert out["last_hidden_state"][i].is_cuda and out["last_hidden_state"][i].dtype == dtype
        assert _rel(out["last_hidden_state"][i], hidden) < tol, f"sequence {i} (length {lengths[i]})"
        assert _rel(out["pooler_output"][i], pooled) < tol
    # padded in and out, numpy out; extra padding columns beyond the longest sequence
    width = longest + 3  # padding columns past the longest sequence the model serves
    ids, mask = pad(seqs, width, fill=rng.integers(0, vocab))
    type_ids = pad(types, width)[0]
    padded = rt.run(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(type_ids), padded=True,
                    output="numpy")
    hidden = padded["last_hidden_state"]
    assert hidden.shape == (13, width, model.config.hidden_size) and not np.isnan(hidden).any()
    for i, (ref_hidden, ref_pooled) in enumerate(reference):
        assert _rel(hidden[i, :lengths[i]], ref_hidden) < tol
        assert (hidden[i, lengths[i]:] == 0).all()
        assert _rel(padded["pooler_output"][i], ref_pooled) < tol


@pytest.mark.gpu
def test_gpu_runtime_honours_the_callers_stream(seed):
    from padfree.torch import from_hf

    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_bert(seed)
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, VOCAB, size=n) for n in rng.integers(1, 129, size=9)]
    encoder = from_hf(model, dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    rt = Runtime(encoder, stream=stream, max_batch=4)
    seen = []
    execute = rt.backend.execute_packed

    def spy(*args):
        seen.append((args[-1], torch.cuda.current_stream()))
        return execute(*args)

    rt.backend.execute_packed = spy
    expected = Runtime(encoder).run(seqs)["last_hidden_state"]  # one chunk, on the current stream
    rt.run(seqs)  # captures the graphs of this chunking first: a capture synchronizes the device
    torch.cuda.synchronize()
    seen.clear()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time queued ahead of the run on the stream
    out = rt.run(seqs)
    assert not stream.query(), "run() waited for the stream: it should only enqueue"
    stream.synchronize()
    assert seen and all(s == stream and cur == stream for s, cur in seen)
    for got, want in zip(out["last_hidden_state"], expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_torch_runner_vs_onnxruntime(seed, tmp_path):
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    from padfree.polygraphy_runners import TorchRunner, mask_padding

    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_bert(seed)
    path = export_onnx(model, tmp_path / "model.onnx")
    feeds = padded_feeds(np.random.default_rng(seed), batch=6, type_vocab=2)
    runners = [TorchRunner(model, from_hf_options={"dtype": torch.float32, "device": "cuda"}, max_batch=4),
               OnnxrtRunner(SessionFromOnnx(str(path)))]
    results = Comparator.run(runners, data_loader=feeds)
    mask_padding(results, feeds)
    assert bool(Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=1e-4, rtol=1e-3)))
