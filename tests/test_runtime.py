"""padfree.runtime (Runtime, EncoderBackend) on the CPU: input and output forms, chunks, staging,
bad input and the backend contract.

The tests drive the Runtime's host logic (validation, packing, splitting, unpacking) through
ToyBackend (tests/_runtime_double.py), a backend test double whose per-token function has an answer
computed independently from the unpacked sequences.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from _runtime_double import (
    MAX_SEQLEN,
    TYPES,
    VOCAB,
    ToyBackend,
    check_padded,
    check_per_sequence,
    expected_sequence,
    pad,
    random_sequences,
)

from padfree.ops._tensors import InputError
from padfree.runtime import EncoderBackend, Limits, Runtime, _inputs
from padfree.runtime._plan import plan_chunks
from padfree.runtime._staging import ALIGN_ELEMENTS

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


@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_packed_output(seed, output):
    """packed=True: the per-token outputs as one [T, H] block with the batch's cu_seqlens (on the host,
    int32) beside them; the per-sequence ones as ever. Chunked (max_batch 3), so the block is gathered
    from several backend calls."""
    rng = np.random.default_rng(seed)
    seqs, types = random_sequences(rng, 8)
    rt = Runtime(ToyBackend(max_batch=3), output=output)
    out = rt.run(seqs, token_type_ids=types, packed=True)
    cu = out["cu_seqlens"]
    kind = torch.Tensor if output == "torch" else np.ndarray
    assert isinstance(cu, kind) and cu.dtype in (torch.int32, np.int32) and not getattr(cu, "is_cuda", False)
    np.testing.assert_array_equal(np.asarray(cu), np.concatenate([[0], np.cumsum([len(s) for s in seqs])]))
    packed = out["last_hidden_state"]
    assert isinstance(packed, kind) and packed.shape[0] == int(cu[-1])
    check_per_sequence({"last_hidden_state": [packed[int(cu[i]):int(cu[i + 1])] for i in range(len(seqs))],
                        "pooler_output": out["pooler_output"]}, seqs, types)
    with pytest.raises(ValueError, match="choose one"):
        rt.run(seqs, padded=True, packed=True)


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


@pytest.mark.parametrize("packer", ["compiled", "python"])
@pytest.mark.parametrize("label,args,kwargs,message", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_bad_input_raises_input_error(label, args, kwargs, message, packer, monkeypatch):
    """The same message whichever packer runs (the compiled one declines, the Python path words it)."""
    if packer == "python":
        monkeypatch.setattr(_inputs, "_hostpack", None)
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


def test_backends_declare_their_per_sequence_outputs():
    """One name, two shapes: a backend's per_sequence_outputs decides, names decide only without it."""
    from padfree.runtime import per_sequence_outputs_of
    from padfree.runtime.backends.engine import per_sequence_from_sidecar

    class Named:
        output_names = ["last_hidden_state", "pooler_output", "logits"]
    assert per_sequence_outputs_of(Named()) == {"pooler_output"}
    declared = Named()
    declared.per_sequence_outputs = {"logits"}
    assert per_sequence_outputs_of(declared) == {"logits"}
    declared.per_sequence_outputs = {"sentence_embedding"}
    with pytest.raises(TypeError, match="not among its output_names"):
        per_sequence_outputs_of(declared)

    def sidecar(io, ids_shape, outputs):
        return {"model": {"io": io}, "inputs": [{"name": "input_ids", "dtype": "int32", "shape": ids_shape}],
                "outputs": [{"name": n, "dtype": "float32", "shape": s} for n, s in outputs.items()]}
    assert per_sequence_from_sidecar(sidecar("packed", ["total_tokens"], {"logits": ["batch", 3]})) == {"logits"}
    assert per_sequence_from_sidecar(sidecar("packed", ["total_tokens"], {"logits": ["total_tokens", 3]})) == set()
    assert per_sequence_from_sidecar(sidecar("padded", ["batch", "sequence"], {
        "start_logits": ["batch", "sequence"], "logits": ["batch", 2]})) == {"logits"}
    assert per_sequence_from_sidecar(sidecar("packed", ["?"], {"logits": ["batch", 3]})) is None
    assert per_sequence_from_sidecar({"model": {"io": "packed"}, "inputs": [{"name": "input_ids"}],
                                      "outputs": [{"name": "logits"}]}) is None
