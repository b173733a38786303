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


def run_plugin(name: str, inputs: dict[str, np.ndarray], fields: dict, n_out: int = 1) -> list[np.ndarray]:
    """One plugin node (as the exporter emits it), expanded by reference.with_references, on ORT."""
    attrs = SPEC.node_attributes(name, fields)
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
def test_emb_layernorm(seed, has_type, offset):
    rng = np.random.default_rng(seed)
    lengths, cu = batch(rng)
    t, h, vocab, types = int(cu[-1]), 16, 30, 3
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inputs = {"input_ids": rng.integers(0, vocab, t).astype(np.int32), "cu_seqlens": cu,
              "word_embeddings": f32(vocab, h), "position_embeddings": f32(lengths.max() + offset, h),
              "gamma": f32(h), "beta": f32(h)}
    if has_type:
        inputs |= {"token_type_ids": rng.integers(0, types, t).astype(np.int32), "token_type_embeddings": f32(types, h)}
    (got,) = run_plugin("PadfreeEmbLayerNorm", inputs,
                        {"epsilon": 1e-5, "position_offset": offset, "has_token_type": has_type})
    rows = []
    for b, n in enumerate(lengths):
        ids = slice(cu[b], cu[b] + n)
        x = inputs["word_embeddings"][inputs["input_ids"][ids]].astype(np.float64)
        x = x + inputs["position_embeddings"][offset + np.arange(n)]
        if has_type:
            x = x + inputs["token_type_embeddings"][inputs["token_type_ids"][ids]]
        rows.append(x)
    close(got, ln64(np.concatenate(rows), inputs["gamma"], inputs["beta"], 1e-5))


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


def test_every_plugin_has_a_reference():
    assert set(reference.EXPANSIONS) == set(SPEC.plugins)


def test_spec_fields_are_checked():
    with pytest.raises(ValueError, match="missing"):
        SPEC.node_attributes("PadfreeAttention", {"num_heads": 2})
    with pytest.raises(ValueError, match="unknown"):
        SPEC.node_attributes("PadfreeBiasGelu", {"approximate": 0, "bias_first": 1})
    attrs = SPEC.node_attributes("PadfreeBiasGelu", {"approximate": np.int64(1)})
    assert attrs == {"plugin_version": "1", "plugin_namespace": "padfree", "approximate": 1}
