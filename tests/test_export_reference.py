"""The ONNX Runtime references of the plugin ops (padfree.export.reference) against float64 PyTorch
written from the spec, one plugin node at a time, on fresh random variable-length batches."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from padfree.export import reference, spec as spec_mod  # noqa: E402

SPEC = spec_mod.load()
F = torch.nn.functional


def run_plugin(name: str, inputs: dict[str, np.ndarray], fields: dict, n_out: int = 1,
               omit: tuple[str, ...] = ()) -> list[np.ndarray]:
    """One plugin node (as the exporter emits it, less the fields in `omit`: a node exported before
    they were added), expanded by reference.with_references, on ORT."""
    attrs = {k: v for k, v in SPEC.node_attributes(name, fields).items() if k not in omit}
    port_names = SPEC[name].input_names(attrs)
    assert sorted(port_names) == sorted(inputs), (port_names, list(inputs))
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(name, port_names, outs, domain=SPEC.namespace, **attrs)
    types = {np.dtype(np.int32): TensorProto.INT32, np.dtype(np.float32): TensorProto.FLOAT}
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, types[v.dtype], list(v.shape))
                                            for k, v in inputs.items()],
                              [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(SPEC.namespace, 1)])
    checked = reference.with_references(model)
    session = ort.InferenceSession(checked.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outs, inputs)


def batch(rng, batch_size=5, max_len=9):
    lengths = rng.integers(1, max_len + 1, batch_size)
    lengths[:2] = [max_len, 1]
    return lengths, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def ln64(x, gamma, beta, eps):
    x = torch.as_tensor(x, dtype=torch.float64)
    return F.layer_norm(x, x.shape[-1:], torch.as_tensor(gamma, dtype=torch.float64),
                        torch.as_tensor(beta, dtype=torch.float64), eps).numpy()


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("has_type,offset", [(1, 0), (0, 2)])
@pytest.mark.parametrize("layernorm", [1, 0, "field absent"])  # absent: its default, 1 (older exports)
def test_emb_layernorm(seed, has_type, offset, layernorm):
    rng = np.random.default_rng(seed)
    lengths, cu = batch(rng)
    t, h, vocab, types = int(cu[-1]), 16, 30, 3
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inputs = {"input_ids": rng.integers(0, vocab, t).astype(np.int32), "cu_seqlens": cu,
              "word_embeddings": f32(vocab, h), "position_embeddings": f32(lengths.max() + offset, h)}
    if layernorm != 0:
        inputs |= {"gamma": f32(h), "beta": f32(h)}
    if has_type:
        inputs |= {"token_type_ids": rng.integers(0, types, t).astype(np.int32), "token_type_embeddings": f32(types, h)}
    fields = {"epsilon": 1e-5, "position_offset": offset, "has_token_type": has_type,
              "has_layernorm": 0 if layernorm == 0 else 1}
    (got,) = run_plugin("PadfreeEmbLayerNorm", inputs, fields,
                        omit=("has_layernorm",) if layernorm == "field absent" else ())
    rows = []
    for b, n in enumerate(lengths):
        ids = slice(cu[b], cu[b] + n)
        x = inputs["word_embeddings"][inputs["input_ids"][ids]].astype(np.float64)
        x = x + inputs["position_embeddings"][offset + np.arange(n)]
        if has_type:
            x = x + inputs["token_type_embeddings"][inputs["token_type_ids"][ids]]
        rows.append(x)
    want = np.concatenate(rows)
    close(got, want if layernorm == 0 else ln64(want, inputs["gamma"], inputs["beta"], 1e-5))


@pytest.mark.parametrize("heads,head_dim", [(2, 64), (1, 128), (3, 8)])
def test_attention(seed, heads, head_dim):
    rng = np.random.default_rng(seed)
    lengths, cu = batch(rng)
    t, width = int(cu[-1]), heads * head_dim
    qkv = rng.standard_normal((t, 3 * width)).astype(np.float32)
    bias = rng.standard_normal(3 * width).astype(np.float32)
    scale = float(rng.uniform(0.05, 0.5))
    (got,) = run_plugin("PadfreeAttention", {"qkv": qkv, "qkv_bias": bias, "cu_seqlens": cu,
                                             "max_seqlen": np.zeros(lengths.max(), np.int32)},
                        {"num_heads": heads, "head_dim": head_dim, "softmax_scale": scale})
    x = torch.as_tensor(qkv + 0, dtype=torch.float64) + torch.as_tensor(bias, dtype=torch.float64)
    want = []
    for b, n in enumerate(lengths):
        q, k, v = x[cu[b]:cu[b] + n].view(n, 3, heads, head_dim).unbind(1)  # each [n, N, D]
        p = torch.softmax(torch.einsum("qnd,knd->nqk", q, k) * scale, -1)
        want.append(torch.einsum("nqk,knd->qnd", p, v).reshape(n, width))
    close(got, torch.cat(want).numpy())


def test_skip_layernorm_and_layernorm(seed):
    rng = np.random.default_rng(seed)
    x, r = (rng.standard_normal((7, 24)).astype(np.float32) for _ in range(2))
    bias, gamma, beta = (rng.standard_normal(24).astype(np.float32) for _ in range(3))
    (got,) = run_plugin("PadfreeSkipLayerNorm", {"x": x, "residual": r, "bias": bias, "gamma": gamma, "beta": beta},
                        {"epsilon": 1e-12})
    close(got, ln64(x.astype(np.float64) + bias + r, gamma, beta, 1e-12))
    (got,) = run_plugin("PadfreeLayerNorm", {"x": x, "gamma": gamma, "beta": beta}, {"epsilon": 1e-3})
    close(got, ln64(x, gamma, beta, 1e-3))


@pytest.mark.parametrize("approximate", [0, 1])
def test_bias_gelu(seed, approximate):
    rng = np.random.default_rng(seed)
    x = (3 * rng.standard_normal((6, 40))).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    (got,) = run_plugin("PadfreeBiasGelu", {"x": x, "bias": bias}, {"approximate": approximate})
    want = F.gelu(torch.as_tensor(x, dtype=torch.float64) + torch.as_tensor(bias, dtype=torch.float64),
                  approximate="tanh" if approximate else "none")
    close(got, want.numpy())


def test_remove_and_rebuild_padding(seed):
    rng = np.random.default_rng(seed)
    lengths, cu = batch(rng)
    b, s = len(lengths), int(lengths.max())
    mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
    padded = rng.standard_normal((b, s, 4)).astype(np.float32)
    packed, got_cu, total = run_plugin("PadfreeRemovePadding", {"padded": padded, "attention_mask": mask}, {},
                                       n_out=len(SPEC["PadfreeRemovePadding"].outputs))
    np.testing.assert_array_equal(got_cu, cu)
    assert total.shape == () and total.dtype == np.int32 and total == lengths.sum()  # the size tensor
    np.testing.assert_array_equal(packed, np.concatenate([padded[i, :n] for i, n in enumerate(lengths)]))
    (rebuilt,) = run_plugin("PadfreeRebuildPadding", {"packed": packed, "cu_seqlens": cu, "attention_mask": mask}, {})
    np.testing.assert_array_equal(rebuilt, padded * mask[..., None])  # exact zeros in padded rows


# ---- the decoder step: R = sources x beams hypotheses, a cache of L positions ---------------------------
@pytest.mark.parametrize("heads,head_dim,step", [(2, 8, 0), (3, 4, 5), (1, 16, 9)])
def test_decoder_self_attention(seed, heads, head_dim, step):
    rng = np.random.default_rng(seed)
    rows, cap, width = 6, 10, heads * head_dim
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inputs = {"qkv": f32(rows, 3 * width), "qkv_bias": f32(3 * width), "k_cache": f32(rows, heads, cap, head_dim),
              "v_cache": f32(rows, heads, cap, head_dim),
              "cache_indir": rng.integers(0, rows, (rows, cap)).astype(np.int32), "step": np.array([step], np.int32)}
    scale = float(rng.uniform(0.1, 0.5))
    ctx, k_out, v_out = run_plugin("PadfreeDecoderSelfAttention", inputs,
                                   {"num_heads": heads, "head_dim": head_dim, "softmax_scale": scale}, n_out=3)
    d = {k: torch.as_tensor(v, dtype=torch.float64 if v.dtype == np.float32 else torch.int64)
         for k, v in inputs.items()}
    q, k_new, v_new = (d["qkv"] + d["qkv_bias"]).view(rows, 3, heads, head_dim).unbind(1)
    k_cache, v_cache = d["k_cache"].clone(), d["v_cache"].clone()
    k_cache[:, :, step], v_cache[:, :, step] = k_new, v_new  # each row's own slot
    close(k_out, k_cache.numpy()), close(v_out, v_cache.numpy())
    # untouched positions are bit-exact copies
    others = [t for t in range(cap) if t != step]
    np.testing.assert_array_equal(k_out[:, :, others], inputs["k_cache"][:, :, others])
    want = []
    for r in range(rows):
        src = [int(d["cache_indir"][r, t]) for t in range(step)] + [r]  # history rows, own row at step
        keys = torch.stack([k_cache[s, :, t] for t, s in enumerate(src)], 1)  # [H, step+1, D]
        values = torch.stack([v_cache[s, :, t] for t, s in enumerate(src)], 1)
        p = torch.softmax(torch.einsum("hd,htd->ht", q[r], keys) * scale, -1)
        want.append(torch.einsum("ht,htd->hd", p, values).reshape(width))
    close(ctx, torch.stack(want).numpy())


@pytest.mark.parametrize("beams,heads,head_dim,cut", [(2, 2, 8, False), (1, 3, 4, False), (3, 1, 16, True)])
def test_decoder_cross_attention(seed, beams, heads, head_dim, cut):
    rng = np.random.default_rng(seed)
    lengths, cu = batch(rng)
    t, width, rows = int(cu[-1]), heads * head_dim, len(lengths) * beams
    max_seqlen = int(lengths.max()) - 2 if cut else int(lengths.max())  # cut: longer sources are cut there
    inputs = {"q": rng.standard_normal((rows, width)).astype(np.float32),
              "q_bias": rng.standard_normal(width).astype(np.float32),
              "kv_mem": rng.standard_normal((t, 2 * width)).astype(np.float32), "cu_seqlens": cu,
              "max_seqlen": np.zeros(max_seqlen, np.int32)}
    scale = float(rng.uniform(0.1, 0.5))
    (got,) = run_plugin("PadfreeDecoderCrossAttention", inputs,
                        {"num_beams": beams, "num_heads": heads, "head_dim": head_dim, "softmax_scale": scale})
    q = (torch.as_tensor(inputs["q"], dtype=torch.float64) + torch.as_tensor(inputs["q_bias"], dtype=torch.float64))
    kv = torch.as_tensor(inputs["kv_mem"], dtype=torch.float64).view(t, 2, heads, head_dim)
    want = []
    for r in range(rows):
        s = r // beams
        n = min(int(lengths[s]), max_seqlen)
        k, v = kv[cu[s]:cu[s] + n].unbind(1)  # [n, H, D]
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[r].view(heads, head_dim), k) * scale, -1)
        want.append(torch.einsum("hn,nhd->hd", p, v).reshape(width))
    close(got, torch.stack(want).numpy())


def _topk64(s: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest per row, descending, ties to the smaller id (a stable sort of -s)."""
    order = torch.sort(-s, dim=-1, stable=True).indices[:, :k]
    return s.gather(1, order).numpy(), order.numpy().astype(np.int32)


@pytest.mark.parametrize("normalize", [1, 0])
@pytest.mark.parametrize("optional", ["all", "none", "bias_and_forced"])
def test_logits_topk(seed, normalize, optional):
    rng = np.random.default_rng(seed)
    rows, vocab, k = 6, 50, 5
    present = {"has_bias": optional != "none", "has_beam_scores": optional == "all", "has_banned": optional == "all",
               "has_penalty": optional == "all", "has_forced": optional != "none"}
    logits = (2 * rng.standard_normal((rows, vocab))).astype(np.float32)
    inputs = {"logits": logits}
    if present["has_bias"]:
        inputs["bias"] = rng.standard_normal(vocab).astype(np.float32)
    if present["has_beam_scores"]:
        inputs["beam_scores"] = rng.uniform(-8, 0, rows).astype(np.float32)
    if present["has_banned"]:  # -1 and ids past the vocabulary are unused; a repeated id is banned once
        inputs["banned_ids"] = np.array([[-1, 3, 3], [vocab, 0, -1]] + [list(rng.integers(-1, vocab, 3))] * 4, np.int32)
    if present["has_penalty"]:
        inputs["penalty_ids"] = rng.integers(-1, vocab + 2, (rows, 4)).astype(np.int32)
    if present["has_forced"]:
        inputs["forced_ids"] = np.array([-1, 7, -1, vocab, 0, -1], np.int32)
    fields = {"k": k, "normalize": normalize, "repetition_penalty": 1.3, **{f: int(v) for f, v in present.items()}}
    scores, ids = run_plugin("PadfreeLogitsTopK", inputs, fields, n_out=2)
    assert scores.dtype == np.float32 and ids.dtype == np.int32 and scores.shape == ids.shape == (rows, k)
    s = torch.as_tensor(logits, dtype=torch.float64)
    if present["has_bias"]:
        s = s + torch.as_tensor(inputs["bias"], dtype=torch.float64)
    if normalize:
        s = torch.log_softmax(s, -1)
    for r in range(rows):
        if present["has_penalty"]:
            for v in {int(v) for v in inputs["penalty_ids"][r] if 0 <= v < vocab}:
                s[r, v] = s[r, v] * 1.3 if s[r, v] < 0 else s[r, v] / 1.3
        if present["has_banned"]:
            for v in inputs["banned_ids"][r]:
                if 0 <= v < vocab:
                    s[r, v] = -np.inf
        if present["has_forced"] and 0 <= inputs["forced_ids"][r] < vocab:
            forced = int(inputs["forced_ids"][r])
            s[r] = -np.inf
            s[r, forced] = 0.0
    if present["has_beam_scores"]:
        s = s + torch.as_tensor(inputs["beam_scores"], dtype=torch.float64)[:, None]
    want_scores, want_ids = _topk64(s, k)
    finite = np.isfinite(want_scores)
    np.testing.assert_array_equal(np.isfinite(scores), finite)
    close(scores[finite], want_scores[finite])
    np.testing.assert_array_equal(ids[finite], want_ids[finite])  # -inf ties: any order among them


@pytest.mark.parametrize("cap,step", [(8, 0), (8, 5), (7, 6)])
def test_beam_reorder(seed, cap, step):
    rng = np.random.default_rng(seed)
    rows = 6
    indir = rng.integers(0, rows, (rows, cap)).astype(np.int32)
    parents = rng.integers(0, rows, rows).astype(np.int32)
    (got,) = run_plugin("PadfreeBeamReorder", {"cache_indir": indir, "parents": parents,
                                               "step": np.array([step], np.int32)}, {})
    assert got.dtype == np.int32 and got.shape == (rows, cap)
    for r in range(rows):  # positions past step are unspecified (the plugin does not write them)
        np.testing.assert_array_equal(got[r, :step], indir[parents[r], :step])
        assert got[r, step] == parents[r]


def test_every_plugin_has_a_reference():
    assert set(reference.EXPANSIONS) == set(SPEC.plugins)


def test_spec_fields_are_checked():
    with pytest.raises(ValueError, match="missing"):
        SPEC.node_attributes("PadfreeAttention", {"num_heads": 2})
    with pytest.raises(ValueError, match="unknown"):
        SPEC.node_attributes("PadfreeBiasGelu", {"approximate": 0, "bias_first": 1})
    attrs = SPEC.node_attributes("PadfreeBiasGelu", {"approximate": np.int64(1)})
    assert attrs == {"plugin_version": "1", "plugin_namespace": "padfree", "approximate": 1}


def test_a_field_with_a_default_may_be_left_out():
    """has_layernorm came after the first exports: a node without it is the LayerNorm-ending node it was
    (gamma, beta among its ports), one with 0 has neither."""
    emb = SPEC["PadfreeEmbLayerNorm"]
    assert emb.defaults == {"has_layernorm": 1}
    old = {"epsilon": 1e-12, "position_offset": 0, "has_token_type": 0}
    assert emb.check_fields(old)["has_layernorm"] == 1
    assert emb.input_names(old)[-2:] == ["gamma", "beta"]
    assert emb.input_names(old | {"has_layernorm": 0}) == ["input_ids", "cu_seqlens", "word_embeddings",
                                                           "position_embeddings"]
    with pytest.raises(ValueError, match="missing"):  # fields without a default are still required
        emb.check_fields({"epsilon": 1e-12, "has_token_type": 0})
