"""padfree.torch.cublaslt and padfree.torch.gemms: the encoder's projections through torch or a tuned
cuBLASLt algorithm, against a float64 reference on fresh random data, outputs poisoned first."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from padfree.torch import gemm_tuning as tuning_mod, gemms as gemms_mod
from padfree.torch.ffn import FfnUp

gpu = pytest.mark.gpu
ENUM_SAMPLE = 24  # enumerated configurations run per test (of ~1400 on the H100)


def reference(x, w, bias=None, acc=None, act=None):
    y = x.double() @ w.double().t()
    if bias is not None:
        y = y + bias.double()
    if act == "gelu_tanh":
        y = F.gelu(y, approximate="tanh")
    elif act == "relu":
        y = torch.relu(y)
    if acc is not None:
        y = y + acc.double()
    return y


def close(got, want, tol):
    err = ((got.double() - want).norm() / want.norm()).item()
    assert torch.isfinite(got).all(), "non-finite output (poison left, or overflow)"
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"


def operands(rows, k, n, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    new = dict(device="cuda", dtype=dtype)
    return (torch.randn(rows, k, generator=gen, **new), torch.randn(n, k, generator=gen, **new) / k ** 0.5,
            torch.randn(n, generator=gen, **new), torch.randn(rows, n, generator=gen, **new))


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("epilogue,accumulate", [("default", False), ("default", True), ("gelu_bias", False),
                                                 ("relu_bias", False)])
@pytest.mark.parametrize("rows", [1, 77, 4160])
def test_linear_every_candidate(dtype, epilogue, accumulate, rows, seed):
    """Every candidate the heuristic lists (first 8) computes the same GEMM and epilogue."""
    from padfree.torch import cublaslt
    k, n = 256, 384
    code = {"default": cublaslt.EPILOGUE_DEFAULT, "gelu_bias": cublaslt.EPILOGUE_GELU_BIAS,
            "relu_bias": cublaslt.EPILOGUE_RELU_BIAS}[epilogue]
    x, w, bias, acc = operands(rows, k, n, dtype, seed)
    lin = cublaslt.Linear(rows, k, n, dtype, epilogue=code, accumulate=accumulate)
    want = reference(x, w, bias if epilogue != "default" else None, acc if accumulate else None,
                     {"gelu_bias": "gelu_tanh", "relu_bias": "relu"}.get(epilogue))
    candidates = lin.candidates(8)
    assert candidates, "cuBLASLt listed no algorithm without workspace"
    for algo, info in candidates:
        assert info.workspace_size == 0
        out = acc.clone() if accumulate else torch.full((rows, n), float("nan"), device="cuda", dtype=dtype)
        lin(x, w, out, bias if epilogue != "default" else None, None, algo)
        close(out, want, 1e-2)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("epilogue,accumulate", [("default", True), ("gelu_bias", False)])
def test_linear_enumerated_configurations(dtype, epilogue, accumulate, seed):
    """Configurations beyond the heuristic's list (Linear.enumerate), a spread of ENUM_SAMPLE of them
    with the workspace they ask for, compute the same GEMM and epilogue."""
    from padfree.torch import cublaslt
    rows, k, n = 4160, 256, 384
    code = cublaslt.EPILOGUE_GELU_BIAS if epilogue == "gelu_bias" else cublaslt.EPILOGUE_DEFAULT
    x, w, bias, acc = operands(rows, k, n, dtype, seed)
    lin = cublaslt.Linear(rows, k, n, dtype, epilogue=code, accumulate=accumulate, max_workspace=1 << 20)
    workspace = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    want = reference(x, w, bias if epilogue != "default" else None, acc if accumulate else None,
                     "gelu_tanh" if epilogue == "gelu_bias" else None)
    configs = lin.enumerate()
    assert len(configs) > len(lin.candidates(8)), "enumeration found no more than the heuristic lists"
    assert all(info.index == -1 and info.workspace_size <= 1 << 20 for _, info in configs)
    step = max(1, len(configs) // ENUM_SAMPLE)
    for algo, _info in configs[seed % step::step]:
        out = acc.clone() if accumulate else torch.full((rows, n), float("nan"), device="cuda", dtype=dtype)
        try:
            lin(x, w, out, bias if epilogue != "default" else None, workspace, algo)
        except cublaslt.CublasLtError:
            continue  # accepted by AlgoCheck, refused at the call: the tuner skips these too
        close(out, want, 1e-2)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("search", ["heuristic", "exhaustive"])
def test_encoder_gemms_tuned(dtype, search, seed, monkeypatch):
    """Tuning at a small size (the row floor lowered) picks something for every projection, and each
    projection computes qkv / out += / act(up + b) / down += against float64. The exhaustive search
    screens a spread of the enumerated configurations (all of them take seconds per problem)."""
    from padfree.torch import cublaslt
    monkeypatch.setattr(tuning_mod, "KEEP_MARGIN", 10.0)  # take cuBLASLt's best even when torch is faster
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    enumerate_all = cublaslt.Linear.enumerate
    monkeypatch.setattr(cublaslt.Linear, "enumerate", lambda self: enumerate_all(self)[seed % 7::ENUM_SAMPLE])
    rows, hidden, inter = 320, 128, 512
    up = FfnUp("tanh", True, None)
    g = gemms_mod.EncoderGemms(rows, hidden, inter, dtype, torch.device("cuda", torch.cuda.current_device()), up,
                               tune=True, search=search)
    assert all(c.startswith("cublaslt") for c in g.choices().values()), g.choices()
    check_projections(g, rows, hidden, inter, dtype, seed)


@gpu
def test_runner_ups_swap_in_and_out(seed, monkeypatch):
    """A problem offers the candidate timed second (RUNNER_UP_MARGIN widened so every one does): swap()
    runs it, labels say so, a second swap restores the pick, and either way the projections compute
    against float64."""
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    monkeypatch.setattr(tuning_mod, "_runner_up", {})
    monkeypatch.setattr(tuning_mod, "RUNNER_UP_MARGIN", 1e9)
    rows, hidden, inter, dtype = 96, 128, 512, torch.float16
    g = gemms_mod.EncoderGemms(rows, hidden, inter, dtype, torch.device("cuda", torch.cuda.current_device()),
                               FfnUp("tanh", True, None), tune=True)
    assert sorted(g.alternatives()) == ["down", "out", "qkv", "up"]
    picked = g.choices()
    for name in g.alternatives():
        g.swap(name)
    swapped = g.choices()
    assert all(swapped[name] != picked[name] for name in picked), (picked, swapped)
    check_projections(g, rows, hidden, inter, dtype, seed)
    for name in g.alternatives():
        g.swap(name)
    assert g.choices() == picked
    check_projections(g, rows, hidden, inter, dtype, seed + 1)
    # larger problems offer theirs where RUNNER_UP_MAX_ROWS allows (the same cached tuning)
    monkeypatch.setattr(tuning_mod, "RUNNER_UP_MAX_ROWS", None)

    def large():
        return gemms_mod.EncoderGemms(tuning_mod.SMALL_ROWS + 64, hidden, inter, dtype,
                                      torch.device("cuda", torch.cuda.current_device()), FfnUp("tanh", True, None),
                                      tune=True)
    big = large()
    assert sorted(big.alternatives()) == ["down", "out", "qkv", "up"]
    for name in big.alternatives():
        big.swap(name)
    check_projections(big, tuning_mod.SMALL_ROWS + 64, hidden, inter, dtype, seed + 2)
    monkeypatch.setattr(tuning_mod, "RUNNER_UP_MAX_ROWS", tuning_mod.SMALL_ROWS)
    assert large().alternatives() == []


def check_projections(g, rows, hidden, inter, dtype, seed):
    """Each of g's projections, qkv / out += / act(up + b) / down +=, against float64."""
    x, w_qkv, _, _ = operands(rows, hidden, 3 * hidden, dtype, seed)
    out = torch.full((rows, 3 * hidden), float("nan"), device="cuda", dtype=dtype)
    g.qkv(x, w_qkv, out)
    close(out, reference(x, w_qkv), 1e-2)
    x, w_o, _, acc = operands(rows, hidden, hidden, dtype, seed + 1)
    want = reference(x, w_o, acc=acc)
    g.out_residual(x, w_o, acc)
    close(acc, want, 1e-2)
    x, w_up, b_up, _ = operands(rows, hidden, inter, dtype, seed + 2)
    out = torch.full((rows, inter), float("nan"), device="cuda", dtype=dtype)
    g.up(x, w_up, b_up, out)
    close(out, reference(x, w_up, b_up, act="gelu_tanh"), 1e-2)
    x, w_d, _, acc = operands(rows, inter, hidden, dtype, seed + 3)
    want = reference(x, w_d, acc=acc)
    g.down_residual(x, w_d, acc)
    close(acc, want, 1e-2)


@gpu
@pytest.mark.parametrize("layers, cold", [(1, False), (12, True)])
def test_weights_timed_cold_where_a_forward_streams_them(layers, cold, seed, monkeypatch):
    """BERT-base's weights over 12 layers exceed the L2, so its GEMMs at few rows are timed on copies of
    the weights that cycle through twice the L2; one layer's stay hot, and so are timed hot. Either way
    the tuned projections compute against float64."""
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    rows, hidden, inter, dtype = 96, 768, 3072, torch.float16
    device = torch.device("cuda", torch.cuda.current_device())
    g = gemms_mod.EncoderGemms(rows, hidden, inter, dtype, device, FfnUp("tanh", True, None), tune=True,
                               layers=layers)
    problems = [key[1] for key in tuning_mod._chosen]
    assert len(problems) == 4 and all(p.cold_weights == cold for p in problems), problems
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    for p in problems:
        copies = tuning_mod.weight_copies(p, device)
        assert (copies * p.in_features * p.out_features * 2 >= 2 * l2) if cold else copies == 1
    check_projections(g, rows, hidden, inter, dtype, seed)


@gpu
@pytest.mark.parametrize("calls", [1, 3])
@pytest.mark.parametrize("keep", [False, True])
def test_graph_drops_counter_memsets(calls, keep, seed, monkeypatch):
    """workspaces.CounterSlots: captured cuBLASLt calls whose algorithm takes a workspace, each with its
    own slot, zeroed once at the graph's start: the memset cuBLASLt puts before each call is removed
    (none with PADFREE_COUNTER_MEMSETS=keep), and every replay (outputs and slots poisoned before it)
    still computes each GEMM against float64."""
    from padfree.torch import cublaslt
    from padfree.torch.workspaces import CounterSlots, keeping_cuda_graph
    if keep:
        monkeypatch.setenv("PADFREE_COUNTER_MEMSETS", "keep")
    rows, k, n = 8192, 768, 768
    lin = cublaslt.Linear(rows, k, n, torch.float16, max_workspace=1 << 20)
    found = [(algo, info) for algo, info in lin.candidates(8) + lin.enumerate() if 0 < info.workspace_size <= 1024]
    if not found:
        pytest.skip("this device's cuBLASLt lists no algorithm with a small workspace for the problem")
    algo, info = found[0]
    problems = [operands(rows, k, n, torch.float16, seed + c)[:2] for c in range(calls)]
    outs = [torch.empty(rows, n, device="cuda", dtype=torch.float16) for _ in range(calls)]
    slots = CounterSlots(calls, info.workspace_size, torch.device("cuda", torch.cuda.current_device()))

    def forward():
        slots.start()
        for (x, w), out in zip(problems, outs):
            lin(x, w, out, None, slots.take(), algo)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()  # eager, with cuBLASLt's memsets
        graph = keeping_cuda_graph()
        graph.capture_begin()
        forward()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    assert slots.drop_memsets(graph) == (0 if keep else calls)
    for _ in range(2):
        for out in outs:
            out.fill_(float("nan"))
        slots.buffer.fill_(255)
        graph.replay()
        for (x, w), out in zip(problems, outs):
            close(out, reference(x, w), 1e-2)


def test_counter_slots_hand_out_aligned_slots_in_turn():
    from padfree.torch.workspaces import SLOT_ALIGNMENT, CounterSlots
    slots = CounterSlots(3, 4, torch.device("cpu"))
    assert slots.slot_bytes == SLOT_ALIGNMENT and slots.buffer.numel() == 4 * SLOT_ALIGNMENT
    slots.buffer.fill_(7)
    slots.start()
    assert (slots.buffer == 0).all()
    taken = [slots.take().data_ptr() - slots.buffer.data_ptr() for _ in range(4)]
    assert taken == [0, SLOT_ALIGNMENT, 2 * SLOT_ALIGNMENT, 0]  # a fourth call reuses the first slot
    assert slots.drop_memsets(None) == 0  # more calls than slots: the graph keeps its memsets
    with pytest.raises(ValueError):
        CounterSlots(0, 4, torch.device("cpu"))


def test_untuned_gemms_are_torch_calls():
    """Without tuning (eager runs, fp32, CPU) every projection is torch's own call."""
    rows, hidden, inter = 5, 8, 16
    up = FfnUp("relu", False, None)
    g = gemms_mod.EncoderGemms(rows, hidden, inter, torch.float64, torch.device("cpu"), up, tune=True)
    assert set(g.choices().values()) == {"torch"}
    gen = torch.Generator().manual_seed(0)
    x, w, acc = (torch.randn(rows, hidden, generator=gen, dtype=torch.float64),
                 torch.randn(3 * hidden, hidden, generator=gen, dtype=torch.float64),
                 torch.randn(rows, hidden, generator=gen, dtype=torch.float64))
    out = torch.empty(rows, 3 * hidden, dtype=torch.float64)
    g.qkv(x, w, out)
    torch.testing.assert_close(out, x @ w.t())
    w_o = torch.randn(hidden, hidden, generator=gen, dtype=torch.float64)
    want = acc + x @ w_o.t()
    g.out_residual(x, w_o, acc)
    torch.testing.assert_close(acc, want)


def test_unknown_gemm_search_is_refused():
    with pytest.raises(ValueError, match="search"):
        gemms_mod.EncoderGemms(5, 8, 16, torch.float64, torch.device("cpu"), FfnUp("relu", False, None), tune=True,
                               search="fastest")


@gpu
def test_tuning_file_round_trip(tmp_path, seed, monkeypatch):
    """save_tuning then load_tuning in a fresh process state gives the same choices without timing
    anything, and the loaded algorithms compute the projection; another device's file gives none."""
    from padfree.torch.gemm_tuning import load_tuning, save_tuning
    monkeypatch.setattr(tuning_mod, "KEEP_MARGIN", 10.0)
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    device = torch.device("cuda", torch.cuda.current_device())
    rows, hidden, inter = 320, 128, 512
    up = FfnUp("tanh", True, None)
    tuned = gemms_mod.EncoderGemms(rows, hidden, inter, torch.float16, device, up, tune=True)
    path = tmp_path / "tuning.json"
    assert save_tuning(path, device) == 4
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    monkeypatch.setattr(tuning_mod, "_tune", lambda *a: pytest.fail("tuned again instead of loading"))
    assert load_tuning(path, device) == 4
    loaded = gemms_mod.EncoderGemms(rows, hidden, inter, torch.float16, device, up, tune=True)
    assert loaded.choices() == tuned.choices()
    x, w, _, _ = operands(rows, hidden, 3 * hidden, torch.float16, seed)
    out = torch.full((rows, 3 * hidden), float("nan"), device="cuda", dtype=torch.float16)
    loaded.qkv(x, w, out)
    close(out, reference(x, w), 1e-2)
    doc = json.loads(path.read_text())
    doc["device"] = "another GPU"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    assert load_tuning(path, device) == 0


@pytest.mark.parametrize("text", ["not json", '{"format": "something else", "entries": []}',
                                  '{"format": "padfree-gemm-tuning/1"}'])
def test_tuning_file_that_is_not_one_is_refused(tmp_path, text):
    from padfree.torch.gemm_tuning import load_tuning
    path = tmp_path / "tuning.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a usable padfree GEMM tuning file"):
        load_tuning(path, torch.device("cuda", 0))


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tuned_gemm_vs_float64(dtype, seed, monkeypatch):
    """TunedGemm (the decode step's output projection) on a cuBLASLt pick (KEEP_MARGIN forces one) against
    float64, its output's memory poisoned first, at a vocabulary-shaped problem; at another row count or a
    strided x it falls back to torch's call, still right."""
    monkeypatch.setattr(tuning_mod, "KEEP_MARGIN", 10.0)
    monkeypatch.setattr(tuning_mod, "_chosen", {})
    device = torch.device("cuda", torch.cuda.current_device())
    rows, k, n = 48, 256, 8256
    x, w = operands(rows, k, n, dtype, seed)[:2]
    gemm = gemms_mod.TunedGemm(rows, k, n, dtype, device, cold_weights=True, weight=w)
    assert gemm.lt is not None and gemm.label.startswith("cublaslt")
    torch.full((rows, n), float("nan"), dtype=dtype, device=device)   # freed: the next block of that size
    close(gemm(x, w), reference(x, w), 2e-3)
    close(gemm(x[:rows - 1], w), reference(x[:rows - 1], w), 2e-3)
    wide = torch.randn(rows, 2 * k, device=device, dtype=dtype)[:, ::2]
    close(gemm(wide, w), reference(wide, w), 2e-3)


@gpu
def test_tuned_gemm_keeps_torch_where_nothing_is_tuned(seed, monkeypatch, caplog):
    """search="none", fp32 and a tuning that fails (here: out of memory) leave torch's call, which still
    computes the GEMM; the failure is logged, not raised."""
    device = torch.device("cuda", torch.cuda.current_device())
    assert gemms_mod.TunedGemm(16, 64, 256, torch.float16, device, search="none").lt is None
    assert gemms_mod.TunedGemm(16, 64, 256, torch.float32, device).lt is None

    def out_of_memory(*_args, **_kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
    monkeypatch.setattr(tuning_mod, "choose", out_of_memory)
    gemm = gemms_mod.TunedGemm(16, 64, 256, torch.float16, device)
    assert gemm.lt is None and "keeps torch's call" in caplog.text
    x, w = operands(16, 64, 256, torch.float16, seed)[:2]
    close(gemm(x, w), reference(x, w), 2e-3)
    with pytest.raises(ValueError, match="search"):
        gemms_mod.TunedGemm(16, 64, 256, torch.float16, device, search="fastest")
