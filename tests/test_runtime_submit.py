"""padfree.runtime's host path on the CPU: Runtime.submit (batches in flight at once, double-buffered
staging), the one-pass packing of a list of sequences against a per-sequence reference, and the
vectorized chunk plan. The backend is ToyBackend (tests/_runtime_double.py), whose answer is
recomputed independently from the unpacked sequences; test_runtime_gpu.py has the GPU side."""
from __future__ import annotations

import array
import os
import sys
import sysconfig

import numpy as np
import pytest
import torch
from _runtime_double import (
    MAX_SEQLEN,
    VOCAB,
    ToyBackend,
    check_padded,
    check_per_sequence,
    random_sequences,
)

from padfree.ops._tensors import InputError
from padfree.runtime import PendingRun, Runtime, _inputs
from padfree.runtime._inputs import checked_host_batch, to_host_batch
from padfree.runtime._sequences import pack
from padfree.runtime._staging import Staging

# ---------------------------------------------------------------------------------------------
# submit(): several batches in flight, results in any order
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_submitted_batches_keep_their_own_inputs_and_outputs(seed, output):
    """Four batches submitted before any result is read: the staging buffers alternate and the
    backend's output buffer is overwritten by every call, so each result must have been copied out
    of both in time. Read in reverse order, each still equals its own reference."""
    rng = np.random.default_rng(seed)
    backend = ToyBackend(max_tokens=200, max_batch=16)
    rt = Runtime(backend, output=output)
    batches = [random_sequences(rng, int(n)) for n in rng.integers(1, 17, size=4)]
    pending = [rt.submit(seqs, token_type_ids=types, padded=i % 2 == 1) for i, (seqs, types) in enumerate(batches)]
    assert all(isinstance(p, PendingRun) and p.done() for p in pending)  # a CPU backend finishes in submit
    for i, p in reversed(list(enumerate(pending))):
        seqs, types = batches[i]
        out = p.result()
        if i % 2:
            check_padded(out, seqs, max(len(s) for s in seqs), types)
        else:
            check_per_sequence(out, seqs, types)
        assert p.result() is out  # result() may be read again
    kind = torch.Tensor if output == "torch" else np.ndarray
    assert isinstance(pending[0].result()["pooler_output"], kind)


def test_run_is_submit_then_result(seed):
    rng = np.random.default_rng(seed)
    seqs, types = random_sequences(rng, 9)
    rt = Runtime(ToyBackend())
    ran = rt.run(seqs, token_type_ids=types, output="numpy")
    submitted = rt.submit(seqs, token_type_ids=types, output="numpy").result()
    assert ran.keys() == submitted.keys()
    for a, b in zip(ran["last_hidden_state"], submitted["last_hidden_state"]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ran["pooler_output"], submitted["pooler_output"])
    assert "done" in repr(rt.submit(seqs))


def test_submit_refuses_bad_input_before_enqueueing():
    backend = ToyBackend()
    rt = Runtime(backend)
    with pytest.raises(InputError, match="token id 100 at sequence 1, position 0"):
        rt.submit([[1, 2], [VOCAB]])
    with pytest.raises(ValueError, match="output must be one of"):
        rt.submit([[1]], output="list")
    assert backend.calls == []


class _Bfloat16Toy(ToyBackend):
    """ToyBackend's outputs in bfloat16, which numpy lacks."""

    def execute_packed(self, *args):
        return {k: v.to(torch.bfloat16) for k, v in super().execute_packed(*args).items()}


def _bf16(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def test_bfloat16_outputs_become_float32_in_numpy(seed):
    rng = np.random.default_rng(seed)
    seqs, _ = random_sequences(rng, 5)
    want = Runtime(ToyBackend()).run(seqs, output="numpy")  # float32, rounded to bfloat16 here
    out = Runtime(_Bfloat16Toy(), output="numpy").run(seqs)
    for got, ref in zip(out["last_hidden_state"], want["last_hidden_state"]):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, _bf16(ref))
    np.testing.assert_array_equal(out["pooler_output"], _bf16(want["pooler_output"]))
    padded = Runtime(_Bfloat16Toy()).run(seqs, padded=True, output="numpy")["last_hidden_state"]
    assert padded.dtype == np.float32
    for i, ref in enumerate(want["last_hidden_state"]):
        np.testing.assert_array_equal(padded[i, :len(ref)], _bf16(ref))
        assert not padded[i, len(ref):].any()


# ---------------------------------------------------------------------------------------------
# Double-buffered staging
# ---------------------------------------------------------------------------------------------

class _Event:
    """Stands in for a torch.cuda.Event: records whether the host waited for it."""

    def __init__(self):
        self.waited = 0

    def synchronize(self):
        self.waited += 1


def test_staging_alternates_buffers_and_waits_for_the_copy_out_of_one():
    staging = Staging(torch.device("cpu"))
    ids = np.arange(10, dtype=np.int64)
    staging.upload([ids], None)
    staging.upload([ids + 1], None)
    first, second = staging._buffers
    assert first.host.data_ptr() != second.host.data_ptr()
    # a copy out of the first buffer still queued: the next upload into it must wait for it first
    first.copied, first.in_flight = _Event(), True
    out = staging.upload([ids + 2], None)[0]
    assert first.copied.waited == 1 and not first.in_flight
    np.testing.assert_array_equal(out.numpy(), ids + 2)
    np.testing.assert_array_equal(first.array[:10], ids + 2)   # written into the first buffer again
    np.testing.assert_array_equal(second.array[:10], ids + 1)  # the other one untouched


def test_staging_segments_are_aligned_and_buffers_grow():
    staging = Staging(torch.device("cpu"))
    arrays = [np.arange(n, dtype=np.int64) for n in (3, 70, 1)]
    views = staging.upload(arrays, None)
    base = views[0].data_ptr()
    for v, a in zip(views, arrays):
        assert (v.data_ptr() - base) % 256 == 0
        np.testing.assert_array_equal(v.numpy(), a)
    small = staging.capacity
    staging.upload([np.zeros(5000, dtype=np.int64)], None)
    assert staging.capacity >= 5000 > small


# ---------------------------------------------------------------------------------------------
# One-pass packing of a list of sequences
# ---------------------------------------------------------------------------------------------

def _reference(seqs):
    arrays = [np.asarray(s.numpy() if isinstance(s, torch.Tensor) else s).astype(np.int64) for s in seqs]
    return np.concatenate(arrays), np.array([len(a) for a in arrays])


@pytest.mark.parametrize("form", ["list", "int32", "uint16", "int64", "torch", "torch_int32", "mixed"])
def test_packing_matches_the_per_sequence_reference(seed, form):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=int(rng.integers(2, 50)))  # "mixed" needs two forms
    seqs = [rng.integers(0, 2**15, size=n) for n in lengths]
    convert = {"list": lambda s: s.tolist(), "int32": lambda s: s.astype(np.int32),
               "uint16": lambda s: s.astype(np.uint16), "int64": lambda s: s,
               "torch": torch.from_numpy, "torch_int32": lambda s: torch.from_numpy(s.astype(np.int32)),
               "mixed": None}[form]
    given = ([x.tolist() if i % 3 == 0 else x if i % 3 == 1 else torch.from_numpy(x) for i, x in enumerate(seqs)]
             if convert is None else [convert(s) for s in seqs])
    want_ids, want_lengths = _reference(seqs)
    host = to_host_batch(given, token_type_ids=[np.zeros(n, dtype=np.int64) for n in lengths])
    np.testing.assert_array_equal(host.input_ids, want_ids)
    np.testing.assert_array_equal(host.lengths, want_lengths)
    np.testing.assert_array_equal(host.cu_seqlens, np.concatenate(([0], np.cumsum(want_lengths))))
    assert host.token_type_ids.shape == want_ids.shape and not host.token_type_ids.any()
    assert host.padded_width == want_lengths.max()
    assert (pack(given) is None) == (form == "mixed")  # mixed forms take the per-sequence path


@pytest.mark.parametrize("label,seqs", [
    ("float", [[1, 2], [3, 4.5]]),
    ("bool list", [[1, 2], [True, False]]),
    ("numpy bool first", [[np.True_, 2]]),
    ("past int64", [[1, 2**63]]),
    ("nested", [[1, 2], [[3], [4]]]),
    ("string", [[1, "2"]]),
    ("empty", [[1], []]),
    ("tuples", [(1, 2), (3,)]),
    ("2-D arrays", [np.zeros((2, 2), dtype=np.int64)] * 2),
    ("0-d array", [np.array(3), np.array(4)]),
    ("empty array", [np.array([1]), np.array([], dtype=np.int64)]),
    ("uint64", [np.array([1], dtype=np.uint64)]),
    ("bool array", [np.array([True])]),
    ("float tensor", [torch.tensor([1.0])]),
    ("2-D tensors", [torch.zeros(2, 2, dtype=torch.int64)] * 2),
    ("empty tensor", [torch.zeros(2, 2, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)]),
])
def test_packing_leaves_irregular_batches_to_the_per_sequence_path(label, seqs):
    """The one-pass path never decides an error: it declines, and the per-sequence path names the
    sequence (test_runtime.py's bad-input table checks those messages through run())."""
    assert pack(seqs) is None


# ---------------------------------------------------------------------------------------------
# The compiled packer (padfree._hostpack): the Python path's results, never its own errors
# ---------------------------------------------------------------------------------------------

try:
    from padfree import _hostpack as hostpack
except ImportError:
    hostpack = None
needs_hostpack = pytest.mark.skipif(hostpack is None, reason="padfree._hostpack is not built (no Python development"
                                    " headers when the package was built): the Runtime packs in Python")
_NO_PAD = -1


def test_the_packer_is_built_where_python_headers_are():
    """The build skips the extension only without Python's headers; anywhere else a missing module
    is a broken build, which the skips above would hide."""
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("no Python.h for this interpreter: the extension is not built here")
    assert hostpack is not None and _inputs._hostpack is hostpack


@needs_hostpack
@pytest.mark.parametrize("form", ["list", "tuple", "int8", "uint8", "int16", "uint16", "int32",
                                  "uint32", "int64", "strided", "reversed", "array.array", "mixed"])
def test_compiled_packer_matches_the_reference(seed, form):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, size=int(rng.integers(1, 200)))
    high = 100 if form in ("int8", "uint8") else 2**15
    seqs = [rng.integers(0, high, size=n) for n in lengths]
    convert = {"list": lambda s: s.tolist(), "tuple": lambda s: tuple(s.tolist()),
               "strided": lambda s: np.repeat(s, 2)[::2], "reversed": lambda s: s[::-1].copy()[::-1],
               "array.array": lambda s: array.array("q", s.tolist()), "mixed": None}.get(form)
    if form in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64"):
        convert = lambda s: s.astype(form)  # noqa: E731
    given = ([x.tolist() if i % 2 else x.astype(np.int32) for i, x in enumerate(seqs)] if convert is None
             else [convert(s) for s in seqs])
    want_ids, want_lengths = _reference(seqs)
    packed = hostpack.pack(given, high, _NO_PAD, int(lengths.max()))
    assert packed is not None
    ids, cu, got_lengths = (np.frombuffer(b, dtype=t) for b, t in zip(packed, (np.int32, np.int64, np.int64)))
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(cu, np.concatenate(([0], np.cumsum(want_lengths))))
    np.testing.assert_array_equal(got_lengths, want_lengths)
    assert packed[3] == lengths.max()
    assert hostpack.pack(given, high, _NO_PAD, int(lengths.max()) - 1) is None  # one sequence too long


class _Int(int):
    """An int whose __index__ could run anything: the packer must not call it."""
    def __index__(self):
        raise AssertionError("the compiled packer called an item's __index__")


@pytest.mark.parametrize("label,seqs,upper,pad_id", [
    ("id == upper", [[1, 2], [3, 10]], 10, _NO_PAD),
    ("negative", [[1, -1]], 10, _NO_PAD),
    ("negative int8", [np.array([1, -1], dtype=np.int8)], 10, _NO_PAD),
    ("uint32 past upper", [np.array([2**32 - 1], dtype=np.uint32)], 2**31, _NO_PAD),
    ("pad id in a list", [[4, 5], [6, 1, 7]], 10, 1),
    ("pad id in an array", [np.array([4, 1])], 10, 1),
    ("float", [[1, 2], [3, 4.5]], 10, _NO_PAD),
    ("bool in a list", [[1, True]], 10, _NO_PAD),
    ("numpy bool", [[np.True_, 2]], 10, _NO_PAD),
    ("numpy scalars", [[np.int64(1), np.int64(2)]], 10, _NO_PAD),
    ("int subclass", [[1, _Int(2)]], 10, _NO_PAD),
    ("past int64", [[1, 2**63]], 10, _NO_PAD),
    ("nested", [[1, 2], [[3], [4]]], 10, _NO_PAD),
    ("string", [[1, "2"]], 10, _NO_PAD),
    ("empty list", [[1], []], 10, _NO_PAD),
    ("empty batch", [], 10, _NO_PAD),
    ("2-D arrays", [np.zeros((2, 2), dtype=np.int64)] * 2, 10, _NO_PAD),
    ("0-d array", [np.array(3)], 10, _NO_PAD),
    ("empty array", [np.array([1]), np.array([], dtype=np.int64)], 10, _NO_PAD),
    ("uint64", [np.array([1], dtype=np.uint64)], 10, _NO_PAD),
    ("bool array", [np.array([True])], 10, _NO_PAD),
    ("float array", [np.array([1.0])], 10, _NO_PAD),
    ("big-endian", [np.array([1], dtype=">i8")], 10, _NO_PAD),
    ("torch tensor", [torch.tensor([1])], 10, _NO_PAD),
    ("a generator", (x for x in [[1]]), 10, _NO_PAD),
    ("bytes", [b"\x01"], 10, _NO_PAD),
    ("bytearray", [bytearray(b"\x01")], 10, _NO_PAD),
])
@needs_hostpack
def test_compiled_packer_declines_what_it_does_not_take(label, seqs, upper, pad_id):
    """Every error, and every form but lists / tuples of ints and 1-D integer buffers, is left to the
    Python path, which words the message (or, for a bool in a list or a torch tensor, takes it)."""
    assert hostpack.pack(seqs, upper, pad_id, 100) is None


class _MutatingBuffer:
    """A buffer whose export (Python 3.12's __buffer__) empties another list of the batch."""
    def __init__(self, victim: list):
        self.victim, self.data = victim, np.arange(3, dtype=np.int64)

    def __buffer__(self, flags):
        self.victim.clear()
        return memoryview(self.data)


@needs_hostpack
@pytest.mark.skipif(sys.version_info < (3, 12), reason="a Python class exports a buffer from Python 3.12 (PEP 688)")
def test_compiled_packer_reads_lists_after_the_batch_s_own_code_ran():
    """A list emptied by another sequence's __buffer__ while the batch is packed: the packer reads it
    as it is then (empty: declined), never through a pointer taken before."""
    victim = list(range(1, 4000))
    assert hostpack.pack([victim, _MutatingBuffer(victim)], 10_000, _NO_PAD, 10_000) is None
    assert victim == []
    kept = list(range(1, 50))
    packed = hostpack.pack([kept, _MutatingBuffer([7])], 10_000, _NO_PAD, 10_000)
    assert np.frombuffer(packed[0], dtype=np.int32).tolist() == kept + [0, 1, 2]


def test_hostile_items_reach_the_python_path():
    """Items the packer declines (int subclasses, numpy scalars) are packed by the Python path, with the
    same values as plain ints."""
    seqs = [[np.int64(5), np.int64(6)], [7, 8, 9]]
    host = checked_host_batch(seqs, None, None, ToyBackend().limits)
    np.testing.assert_array_equal(host.input_ids, [5, 6, 7, 8, 9])


@needs_hostpack
def test_compiled_packer_refuses_a_bound_past_int32():
    with pytest.raises(ValueError, match="2\\*\\*31"):
        hostpack.pack([[1]], 2**31 + 1, _NO_PAD, 100)


@pytest.mark.parametrize("packer", ["compiled", "python"])
def test_both_packers_give_one_host_batch(seed, packer, monkeypatch):
    if packer == "python":
        monkeypatch.setattr(_inputs, "_hostpack", None)
    rng = np.random.default_rng(seed)
    seqs, types = random_sequences(rng, 37)
    backend = ToyBackend()
    host = checked_host_batch([s.tolist() for s in seqs], None, [t.astype(np.uint8) for t in types], backend.limits)
    want_ids, want_lengths = _reference(seqs)
    np.testing.assert_array_equal(host.input_ids, want_ids)
    np.testing.assert_array_equal(host.token_type_ids, np.concatenate(types))
    np.testing.assert_array_equal(host.lengths, want_lengths)
    np.testing.assert_array_equal(host.cu_seqlens, np.concatenate(([0], np.cumsum(want_lengths))))
    assert host.padded_width == want_lengths.max() and host.mask is None
    check_per_sequence(Runtime(backend).run(seqs, token_type_ids=types), seqs, types)


@pytest.mark.parametrize("seqs,message", [
    ([[1, 2], [3, 4.5]], "sequence 1: expected integer token ids, got dtype float64"),
    ([[1, 2], [True, False]], "sequence 1: expected integer token ids, got dtype bool"),
    ([[1, 2**64]], "sequence 0: expected integer token ids, got dtype object"),
    ([[1], [2, 3], []], "sequence 2 is empty"),
])
def test_irregular_lists_get_the_per_sequence_message(seqs, message):
    with pytest.raises(InputError, match=message):
        Runtime(ToyBackend()).run(seqs)


def test_token_types_of_another_length_are_named(seed):
    rng = np.random.default_rng(seed)
    seqs, types = random_sequences(rng, 6)
    types[4] = np.append(types[4], 0)
    with pytest.raises(InputError, match=rf"token_type_ids\[4\]: expected {len(seqs[4])} ids like sequence 4"):
        Runtime(ToyBackend()).run([s.tolist() for s in seqs], token_type_ids=[t.tolist() for t in types])


def test_padded_mask_checks(seed):
    """The right-padding check (first zero at the row's length, ones counted once) against the
    definition, on random masks: rows of ones then zeros pass, any other row is named."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(8, MAX_SEQLEN))
    rt = Runtime(ToyBackend())
    for _ in range(50):
        mask = (rng.random((8, MAX_SEQLEN)) < 0.8).astype(np.int64)
        lengths = rng.integers(1, MAX_SEQLEN + 1, size=8)
        aligned = (np.arange(MAX_SEQLEN)[None, :] < lengths[:, None]).astype(np.int64)
        rows = rng.random(8) < 0.2
        mask = np.where(rows[:, None], mask, aligned)
        bad = [i for i in range(8) if not np.array_equal(mask[i], np.sort(mask[i])[::-1])]
        empty = [i for i in range(8) if not mask[i].any()]
        if bad:
            with pytest.raises(InputError, match=f"attention_mask row {bad[0]} is not left-aligned"):
                rt.run(ids, mask)
        elif empty:
            with pytest.raises(InputError, match=f"sequence {empty[0]} is empty"):
                rt.run(ids, mask)
        else:
            out = rt.run(ids, mask, padded=True)
            check_padded(out, [ids[i, :mask[i].sum()] for i in range(8)], MAX_SEQLEN)



# ---------------------------------------------------------------------------------------------
# bench/runtime.py's host-only mode (the GPU columns run on the device machine)
# ---------------------------------------------------------------------------------------------

def test_bench_runtime_host_only_runs_on_cpu(tmp_path):
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "runtime.json"
    argv = ["--host-only", "--batch", "16", "--reps", "3", "--warmup", "1", "--out", str(out)]
    proc = subprocess.run([sys.executable, os.path.join(root, "bench", "runtime.py"), *argv],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["command"] and report["rows"]
    forms = ("lists", "numpy", "padded")
    for row in report["rows"]:
        assert row["batch"] == 16
        assert all(row["host_ms"][f"{kind}_{form}"] > 0 for kind in ("submit", "inputs") for form in forms)
        assert row["host_ms"]["torch_views"] > 0
