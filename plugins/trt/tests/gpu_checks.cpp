// On a GPU: each plugin's enqueue against the kernel library's own C ABI call on the same random
// data (the same kernels, so results must match bit for bit: this checks the plugin's plumbing of
// pointers, shapes and dtypes), and the padding plugins against a host reference. Outputs are
// poisoned (0xFF bytes: NaN for floats) before every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>

#include "harness.h"
#include "padfree.h"

using namespace nvinfer1;

namespace padfree {
namespace harness {

std::string gpu_skip_reason() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) return str("no CUDA device (", cudaGetErrorString(err), ")");
    if (count == 0) return "no CUDA device";
    return "";
}

namespace {

#define CUDA_OK(call)                                                                     \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        EXPECT(e_ == cudaSuccess, #call, ": ", cudaGetErrorString(e_));                   \
    } while (0)

int64_t bytes_of(DataType type) {
    switch (type) {
        case DataType::kHALF: case DataType::kBF16: return 2;
        case DataType::kINT64: return 8;
        case DataType::kUINT8: case DataType::kINT8: case DataType::kBOOL: return 1;
        default: return 4;
    }
}

struct Tensor {
    std::vector<int64_t> dims;
    DataType type;
    void* ptr = nullptr;
    Tensor(std::vector<int64_t> d, DataType t) : dims(std::move(d)), type(t) {
        CUDA_OK(cudaMalloc(&ptr, std::max<int64_t>(bytes(), 1)));
        poison();
    }
    ~Tensor() { cudaFree(ptr); }
    Tensor(const Tensor&) = delete;
    int64_t count() const {
        int64_t n = 1;
        for (int64_t d : dims) n *= d;
        return n;
    }
    int64_t bytes() const { return count() * bytes_of(type); }
    void poison() { CUDA_OK(cudaMemset(ptr, 0xFF, std::max<int64_t>(bytes(), 1))); }
    void upload(const std::vector<uint8_t>& host) {
        EXPECT(static_cast<int64_t>(host.size()) == bytes(), "upload size");
        CUDA_OK(cudaMemcpy(ptr, host.data(), host.size(), cudaMemcpyHostToDevice));
    }
    std::vector<uint8_t> download() const {
        std::vector<uint8_t> host(bytes());
        CUDA_OK(cudaMemcpy(host.data(), ptr, host.size(), cudaMemcpyDeviceToHost));
        return host;
    }
    PluginTensorDesc desc() const {
        PluginTensorDesc d{};
        d.dims.nbDims = static_cast<int32_t>(dims.size());
        for (size_t k = 0; k < dims.size(); ++k) d.dims.d[k] = dims[k];
        d.type = type;
        d.format = TensorFormat::kLINEAR;
        d.scale = -1.0f;
        return d;
    }
};

std::mt19937& rng() {
    static std::mt19937 gen([] {
        const char* env = std::getenv("PADFREE_SEED");
        const unsigned seed = env ? static_cast<unsigned>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
        std::cout << "PADFREE_SEED=" << seed << std::endl;
        return seed;
    }());
    return gen;
}

std::vector<uint8_t> random_floats(int64_t n, DataType type, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<uint8_t> out(n * bytes_of(type));
    for (int64_t k = 0; k < n; ++k) {
        const float v = dist(rng());
        if (type == DataType::kHALF) {
            const __half h = __float2half(v);
            std::memcpy(&out[k * 2], &h, 2);
        } else if (type == DataType::kBF16) {
            const __nv_bfloat16 b = __float2bfloat16(v);
            std::memcpy(&out[k * 2], &b, 2);
        } else {
            std::memcpy(&out[k * 4], &v, 4);
        }
    }
    return out;
}

std::vector<uint8_t> int_bytes(const std::vector<int32_t>& values) {
    std::vector<uint8_t> out(values.size() * 4);
    std::memcpy(out.data(), values.data(), out.size());
    return out;
}

std::vector<uint8_t> random_ints(int64_t n, int32_t hi) {
    std::uniform_int_distribution<int32_t> dist(0, hi - 1);
    std::vector<int32_t> values(n);
    for (auto& v : values) v = dist(rng());
    return int_bytes(values);
}

// Sequence lengths with both edge lengths (1 and S) present.
struct Batch {
    int32_t batch = 3, padded = 20;
    std::vector<int32_t> lengths, cu;
    int32_t total = 0;
    Batch() {
        std::uniform_int_distribution<int32_t> dist(1, padded);
        lengths = {1, padded, dist(rng())};
        cu = {0};
        for (int32_t n : lengths) cu.push_back(cu.back() + n);
        total = cu.back();
    }
};

void enqueue(IPluginV3* plugin, const std::vector<const Tensor*>& ins, const std::vector<const Tensor*>& outs,
             void* workspace = nullptr) {
    std::unique_ptr<IPluginV3> attached(
        static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME))
            ->attachToContext(nullptr));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(attached->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::vector<PluginTensorDesc> in_desc, out_desc;
    std::vector<const void*> in_ptr;
    std::vector<void*> out_ptr;
    for (const Tensor* t : ins) in_desc.push_back(t->desc()), in_ptr.push_back(t->ptr);
    for (const Tensor* t : outs) out_desc.push_back(t->desc()), out_ptr.push_back(t->ptr);
    EXPECT(runtime->onShapeChange(in_desc.data(), static_cast<int32_t>(ins.size()), out_desc.data(),
                                  static_cast<int32_t>(outs.size())) == 0, padfree_trt_last_error());
    EXPECT(runtime->enqueue(in_desc.data(), out_desc.data(), in_ptr.data(), out_ptr.data(), workspace, nullptr) == 0,
           "enqueue: ", padfree_trt_last_error());
    CUDA_OK(cudaDeviceSynchronize());
}

void expect_abi(padfree_status status) {
    EXPECT(status == PADFREE_OK, "C ABI: ", padfree_last_error());
    CUDA_OK(cudaDeviceSynchronize());
}

std::unique_ptr<IPluginV3> make(const std::string& label, std::vector<FieldValue> fields = {}) {
    const Case& c = case_named(label);
    std::unique_ptr<IPluginV3> p(create(c, fields.empty() ? c.fields : fields));
    EXPECT(p, padfree_trt_last_error());
    return p;
}

void same_bytes(const Tensor& a, const Tensor& b, const std::string& what) {
    EXPECT(a.download() == b.download(), what, ": plugin and C ABI outputs differ");
}

padfree_dtype abi_dtype(DataType t) {
    return t == DataType::kHALF ? PADFREE_FLOAT16 : t == DataType::kBF16 ? PADFREE_BFLOAT16 : PADFREE_FLOAT32;
}

const DataType kTypes[] = {DataType::kFLOAT, DataType::kHALF, DataType::kBF16};

void require_gpu() {
    const std::string reason = gpu_skip_reason();
    if (!reason.empty()) throw Failure("SKIP:" + reason);
}

Register layernorm_gpu("gpu_layernorm_family_vs_c_abi", [] {
    require_gpu();
    const int64_t T = 37, H = 768;
    for (DataType t : kTypes) {
        const padfree_dtype dt = abi_dtype(t);
        Tensor x({T, H}, t), res({T, H}, t), bias({H}, t), gamma({H}, t), beta({H}, t);
        for (Tensor* p : {&x, &res, &bias, &gamma, &beta}) p->upload(random_floats(p->count(), t));
        Tensor out({T, H}, t), ref({T, H}, t);
        enqueue(make("layernorm", {float_field("epsilon", 1e-5f)}).get(), {&x, &gamma, &beta}, {&out});
        expect_abi(padfree_layernorm(x.ptr, gamma.ptr, beta.ptr, T, H, 1e-5f, dt, ref.ptr, nullptr));
        same_bytes(out, ref, "PadfreeLayerNorm");
        out.poison(), ref.poison();
        enqueue(make("skip_layernorm").get(), {&x, &res, &bias, &gamma, &beta}, {&out});
        expect_abi(padfree_skip_layernorm(x.ptr, res.ptr, bias.ptr, gamma.ptr, beta.ptr, T, H, 1e-12f, nullptr, 0, dt, ref.ptr, nullptr));
        same_bytes(out, ref, "PadfreeSkipLayerNorm");
        Tensor up({T, 4 * H}, t), up_bias({4 * H}, t), gelu({T, 4 * H}, t), gelu_ref({T, 4 * H}, t);
        up.upload(random_floats(up.count(), t, -3.0f, 3.0f));
        up_bias.upload(random_floats(up_bias.count(), t));
        for (int32_t approximate : {0, 1}) {
            gelu.poison(), gelu_ref.poison();
            enqueue(make("bias_gelu", {int_field("approximate", approximate)}).get(), {&up, &up_bias}, {&gelu});
            expect_abi(padfree_bias_gelu(up.ptr, up_bias.ptr, T, 4 * H, approximate, dt, gelu_ref.ptr, nullptr));
            same_bytes(gelu, gelu_ref, str("PadfreeBiasGelu approximate=", approximate));
        }
    }
});

Register attention_gpu("gpu_attention_vs_c_abi", [] {
    require_gpu();
    for (int32_t head_dim : {32, 64, 128}) {
        for (DataType t : {DataType::kHALF, DataType::kBF16, DataType::kFLOAT}) {
            const padfree_dtype dt = abi_dtype(t);
            Batch b;
            const int32_t heads = 4, width = heads * head_dim;
            const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
            Tensor qkv({b.total, 3 * width}, t), bias({3 * width}, t), cu({b.batch + 1}, DataType::kINT32);
            Tensor max_seqlen({b.padded}, DataType::kINT32);  // a shape input: only its length is read
            qkv.upload(random_floats(qkv.count(), t));
            bias.upload(random_floats(bias.count(), t));
            cu.upload(int_bytes(b.cu));
            Tensor out({b.total, width}, t), ref({b.total, width}, t);
            auto plugin = make("attention", {int_field("num_heads", heads), int_field("head_dim", head_dim),
                                             float_field("softmax_scale", scale)});
            enqueue(plugin.get(), {&qkv, &bias, &cu, &max_seqlen}, {&out});
            expect_abi(padfree_attention_varlen(qkv.ptr, bias.ptr, static_cast<const int32_t*>(cu.ptr), b.batch,
                                                b.total, b.padded, heads, head_dim, scale, 0, dt, ref.ptr, nullptr));
            same_bytes(out, ref, str("PadfreeAttention head_dim=", head_dim, " dtype ", static_cast<int>(t)));
        }
    }
});

Register embedding_gpu("gpu_emb_layernorm_vs_c_abi", [] {
    require_gpu();
    for (DataType t : kTypes) {
        const padfree_dtype dt = abi_dtype(t);
        Batch b;
        const int32_t H = 256, vocab = 1000, positions = 64, types = 2;
        Tensor ids({b.total}, DataType::kINT32), type_ids({b.total}, DataType::kINT32), cu({b.batch + 1}, DataType::kINT32);
        Tensor word({vocab, H}, t), pos({positions, H}, t), type_emb({types, H}, t), gamma({H}, t), beta({H}, t);
        ids.upload(random_ints(b.total, vocab));
        type_ids.upload(random_ints(b.total, types));
        cu.upload(int_bytes(b.cu));
        for (Tensor* p : {&word, &pos, &type_emb, &gamma, &beta}) p->upload(random_floats(p->count(), t));
        Tensor out({b.total, H}, t), ref({b.total, H}, t);
        enqueue(make("emb_layernorm_with_type").get(), {&ids, &type_ids, &cu, &word, &pos, &type_emb, &gamma, &beta}, {&out});
        expect_abi(padfree_embedding_layernorm(static_cast<const int32_t*>(ids.ptr), static_cast<const int32_t*>(type_ids.ptr),
                                               static_cast<const int32_t*>(cu.ptr), b.batch, b.total, word.ptr, vocab,
                                               pos.ptr, positions, 0, type_emb.ptr, types, gamma.ptr, beta.ptr, H,
                                               1e-12f, nullptr, 0, dt, ref.ptr, nullptr));
        same_bytes(out, ref, "PadfreeEmbLayerNorm with token types");
        out.poison(), ref.poison();
        // RoBERTa-style: no token types, positions offset by padding_idx + 1.
        enqueue(make("emb_layernorm_without_type").get(), {&ids, &cu, &word, &pos, &gamma, &beta}, {&out});
        expect_abi(padfree_embedding_layernorm(static_cast<const int32_t*>(ids.ptr), nullptr,
                                               static_cast<const int32_t*>(cu.ptr), b.batch, b.total, word.ptr, vocab,
                                               pos.ptr, positions, 2, nullptr, 0, gamma.ptr, beta.ptr, H, 1e-5f,
                                               nullptr, 0, dt, ref.ptr, nullptr));
        same_bytes(out, ref, "PadfreeEmbLayerNorm without token types");
        // Marian / M2M100: has_layernorm 0, no gamma and beta (NULL and NULL in the C ABI).
        out.poison(), ref.poison();
        enqueue(make("emb_without_layernorm").get(), {&ids, &cu, &word, &pos}, {&out});
        expect_abi(padfree_embedding_layernorm(static_cast<const int32_t*>(ids.ptr), nullptr,
                                               static_cast<const int32_t*>(cu.ptr), b.batch, b.total, word.ptr, vocab,
                                               pos.ptr, positions, 2, nullptr, 0, nullptr, nullptr, H, 1e-5f,
                                               nullptr, 0, dt, ref.ptr, nullptr));
        same_bytes(out, ref, "PadfreeEmbLayerNorm without a LayerNorm");
        out.poison(), ref.poison();
        enqueue(make("emb_with_type_without_layernorm").get(), {&ids, &type_ids, &cu, &word, &pos, &type_emb}, {&out});
        expect_abi(padfree_embedding_layernorm(static_cast<const int32_t*>(ids.ptr), static_cast<const int32_t*>(type_ids.ptr),
                                               static_cast<const int32_t*>(cu.ptr), b.batch, b.total, word.ptr, vocab,
                                               pos.ptr, positions, 0, type_emb.ptr, types, nullptr, nullptr, H, 1e-12f,
                                               nullptr, 0, dt, ref.ptr, nullptr));
        same_bytes(out, ref, "PadfreeEmbLayerNorm with token types, without a LayerNorm");
    }
});

// Host reference: packed row t of sequence b is padded row (b, t - cu[b]).
Register padding_gpu("gpu_remove_and_rebuild_padding_vs_host", [] {
    require_gpu();
    for (DataType t : {DataType::kHALF, DataType::kFLOAT, DataType::kINT32}) {
        Batch b;
        const int64_t H = t == DataType::kINT32 ? 1 : 96;  // ids ([B, S] -> [T]) and hidden rows
        const int64_t row = H * bytes_of(t);
        std::vector<int64_t> padded_dims = {b.batch, b.padded};
        std::vector<int64_t> packed_dims = {b.total};
        if (t != DataType::kINT32) padded_dims.push_back(H), packed_dims.push_back(H);
        Tensor padded(padded_dims, t), mask({b.batch, b.padded}, DataType::kINT32);
        const std::vector<uint8_t> padded_host = random_floats(padded.count(), DataType::kFLOAT);  // any bytes
        std::vector<uint8_t> padded_bytes(padded_host.begin(), padded_host.begin() + padded.bytes());
        padded.upload(padded_bytes);
        std::vector<int32_t> mask_host(b.batch * b.padded, 0);
        for (int32_t s = 0; s < b.batch; ++s)
            for (int32_t k = 0; k < b.lengths[s]; ++k) mask_host[s * b.padded + k] = 1;
        mask.upload(int_bytes(mask_host));

        // Remove: the packed output is as large as TensorRT allocates for the size tensor's upper bound.
        std::vector<int64_t> upper_dims = packed_dims;
        upper_dims[0] = int64_t{b.batch} * b.padded;
        Tensor packed(upper_dims, t), cu({b.batch + 1}, DataType::kINT32), total({}, DataType::kINT32);
        enqueue(make("remove_padding_rows").get(), {&padded, &mask}, {&packed, &cu, &total});
        EXPECT(cu.download() == int_bytes(b.cu), "cu_seqlens from the mask");
        EXPECT(total.download() == int_bytes({b.total}), "total_tokens size tensor");
        const std::vector<uint8_t> packed_host = packed.download();
        for (int32_t s = 0; s < b.batch; ++s)
            for (int32_t k = 0; k < b.lengths[s]; ++k)
                EXPECT(std::memcmp(&packed_host[(b.cu[s] + k) * row], &padded_bytes[(int64_t{s} * b.padded + k) * row],
                                   row) == 0, "packed row of sequence ", s, " token ", k);
        for (int64_t r = b.total * row; r < packed.bytes(); ++r)
            EXPECT(packed_host[r] == 0xFF, "rows past total_tokens untouched");

        // Rebuild from an exactly-sized packed tensor: zeros in padding.
        Tensor exact(packed_dims, t);
        exact.upload(std::vector<uint8_t>(packed_host.begin(), packed_host.begin() + exact.bytes()));
        Tensor rebuilt(padded_dims, t);
        enqueue(make("rebuild_padding").get(), {&exact, &cu, &mask}, {&rebuilt});
        const std::vector<uint8_t> rebuilt_host = rebuilt.download();
        for (int32_t s = 0; s < b.batch; ++s)
            for (int32_t k = 0; k < b.padded; ++k) {
                const uint8_t* got = &rebuilt_host[(int64_t{s} * b.padded + k) * row];
                if (k < b.lengths[s]) {
                    EXPECT(std::memcmp(got, &padded_bytes[(int64_t{s} * b.padded + k) * row], row) == 0,
                           "rebuilt row ", s, ",", k);
                } else {
                    for (int64_t j = 0; j < row; ++j) EXPECT(got[j] == 0, "zero padding at ", s, ",", k);
                }
            }
    }
});

// ---- the decoder plugins: a decoding step of R = 3 sources x 2 beams --------------------------------
// The workspace getWorkspaceSize asks for with the sample shapes as the profile's bounds (0: none).
struct Workspace {
    size_t bytes = 0;
    void* ptr = nullptr;
    Workspace(IPluginV3* plugin, const std::vector<const Tensor*>& io, int32_t nb_inputs) {
        std::vector<DynamicPluginTensorDesc> d(io.size());
        for (size_t k = 0; k < io.size(); ++k) d[k].desc = io[k]->desc(), d[k].min = d[k].opt = d[k].max = d[k].desc.dims;
        auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
        bytes = build->getWorkspaceSize(d.data(), nb_inputs, d.data() + nb_inputs, static_cast<int32_t>(io.size()) - nb_inputs);
        if (bytes > 0) CUDA_OK(cudaMalloc(&ptr, bytes));
    }
    ~Workspace() { cudaFree(ptr); }
    Workspace(const Workspace&) = delete;
};

std::vector<int32_t> random_int_values(int64_t n, int32_t lo, int32_t hi) {
    std::uniform_int_distribution<int32_t> dist(lo, hi);
    std::vector<int32_t> values(n);
    for (auto& v : values) v = dist(rng());
    return values;
}

Register decoder_self_attention_gpu("gpu_decoder_self_attention_vs_c_abi", [] {
    // Aliased caches (one buffer in and out, as TensorRT binds them with aliasing on) and distinct ones
    // (the plugin copies the input cache first), each with and without the workspace, against the C ABI
    // on a copy of the same caches: context and both caches bit for bit.
    require_gpu();
    const int32_t rows = 6, heads = 2, L = 16, step = 5;
    for (int32_t head_dim : {64, 128}) {
        for (DataType t : kTypes) {
            const padfree_dtype dt = abi_dtype(t);
            const int32_t width = heads * head_dim;
            const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
            auto plugin = make("decoder_self_attention", {int_field("num_heads", heads), int_field("head_dim", head_dim),
                                                          float_field("softmax_scale", scale)});
            Tensor qkv({rows, 3 * width}, t), bias({3 * width}, t), indir({rows, L}, DataType::kINT32),
                step_t({1}, DataType::kINT32);
            Tensor k_init({rows, heads, L, head_dim}, t), v_init({rows, heads, L, head_dim}, t);
            qkv.upload(random_floats(qkv.count(), t));
            bias.upload(random_floats(bias.count(), t));
            const std::vector<uint8_t> k_host = random_floats(k_init.count(), t), v_host = random_floats(v_init.count(), t);
            indir.upload(int_bytes(random_int_values(int64_t{rows} * L, 0, rows - 1)));
            step_t.upload(int_bytes({step}));
            for (bool aliased : {true, false}) {
                for (bool with_workspace : {true, false}) {
                    Tensor k({rows, heads, L, head_dim}, t), v({rows, heads, L, head_dim}, t);
                    Tensor k_out({rows, heads, L, head_dim}, t), v_out({rows, heads, L, head_dim}, t);
                    Tensor k_ref({rows, heads, L, head_dim}, t), v_ref({rows, heads, L, head_dim}, t);
                    for (Tensor* c : {&k, &k_ref}) c->upload(k_host);
                    for (Tensor* c : {&v, &v_ref}) c->upload(v_host);
                    Tensor out({rows, width}, t), ref({rows, width}, t);
                    const Tensor* ko = aliased ? &k : &k_out;
                    const Tensor* vo = aliased ? &v : &v_out;
                    Workspace ws(plugin.get(), {&qkv, &bias, &k, &v, &indir, &step_t, &out, ko, vo}, 6);
                    enqueue(plugin.get(), {&qkv, &bias, &k, &v, &indir, &step_t}, {&out, ko, vo},
                            with_workspace ? ws.ptr : nullptr);
                    int64_t bytes = 0;
                    expect_abi(padfree_decoder_self_attention_workspace_size(rows, heads, head_dim, L, &bytes));
                    EXPECT(static_cast<size_t>(bytes) == ws.bytes, "workspace ", ws.bytes, " vs ", bytes);
                    expect_abi(padfree_decoder_self_attention(
                        qkv.ptr, bias.ptr, k_ref.ptr, v_ref.ptr, static_cast<const int32_t*>(indir.ptr),
                        static_cast<const int32_t*>(step_t.ptr), 0, rows, heads, head_dim, L, scale,
                        with_workspace ? ws.ptr : nullptr, with_workspace ? bytes : 0, dt, ref.ptr, nullptr));
                    const std::string what = str("PadfreeDecoderSelfAttention head_dim=", head_dim, " dtype ",
                                                 static_cast<int>(t), aliased ? " aliased" : " copied",
                                                 with_workspace ? " with workspace" : "");
                    same_bytes(out, ref, what + " context");
                    same_bytes(*ko, k_ref, what + " k_cache");
                    same_bytes(*vo, v_ref, what + " v_cache");
                    if (!aliased) {  // the inputs are left as they were
                        EXPECT(k.download() == k_host && v.download() == v_host, what, ": input caches written");
                    }
                }
            }
        }
    }
});

Register decoder_cross_attention_gpu("gpu_decoder_cross_attention_vs_c_abi", [] {
    require_gpu();
    const int32_t beams = 2, heads = 2;
    for (int32_t head_dim : {64, 128}) {
        for (DataType t : kTypes) {
            const padfree_dtype dt = abi_dtype(t);
            Batch b;
            const int32_t rows = b.batch * beams, width = heads * head_dim;
            const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
            auto plugin = make("decoder_cross_attention", {int_field("num_beams", beams), int_field("num_heads", heads),
                                                           int_field("head_dim", head_dim), float_field("softmax_scale", scale)});
            Tensor q({rows, width}, t), bias({width}, t), kv({b.total, 2 * width}, t), cu({b.batch + 1}, DataType::kINT32);
            Tensor max_seqlen({b.padded}, DataType::kINT32);  // a shape input: only its length is read
            for (Tensor* p : {&q, &bias, &kv}) p->upload(random_floats(p->count(), t));
            cu.upload(int_bytes(b.cu));
            Tensor out({rows, width}, t), ref({rows, width}, t);
            Workspace ws(plugin.get(), {&q, &bias, &kv, &cu, &max_seqlen, &out}, 5);
            enqueue(plugin.get(), {&q, &bias, &kv, &cu, &max_seqlen}, {&out}, ws.ptr);
            int64_t bytes = 0;
            expect_abi(padfree_decoder_cross_attention_workspace_size(rows, heads, head_dim, b.padded, &bytes));
            EXPECT(static_cast<size_t>(bytes) == ws.bytes, "workspace ", ws.bytes, " vs ", bytes);
            expect_abi(padfree_decoder_cross_attention(q.ptr, bias.ptr, kv.ptr, static_cast<const int32_t*>(cu.ptr),
                                                       b.batch, beams, b.total, b.padded, heads, head_dim, scale,
                                                       ws.ptr, bytes, dt, ref.ptr, nullptr));
            same_bytes(out, ref, str("PadfreeDecoderCrossAttention head_dim=", head_dim, " dtype ", static_cast<int>(t)));
        }
    }
});

Register own_workspace_gpu("gpu_decoder_own_workspace_vs_c_abi", [] {
    // own_workspace 1 (plugins inside a loop): no workspace from TensorRT, the plugin's own scratch, sized
    // at onShapeChange; the result bit for bit the C ABI's with a workspace of the queried size. A cache
    // of 256 positions makes the self-attention split (its workspace is then > 0); top-k always has one.
    require_gpu();
    const DataType t = DataType::kHALF;
    const padfree_dtype dt = abi_dtype(t);
    {
        const int32_t rows = 6, heads = 2, head_dim = 64, L = 256, step = 200, width = heads * head_dim;
        auto plugin = make("decoder_self_attention", {int_field("num_heads", heads), int_field("head_dim", head_dim),
                                                      float_field("softmax_scale", 0.125f), int_field("own_workspace", 1)});
        Tensor qkv({rows, 3 * width}, t), bias({3 * width}, t), indir({rows, L}, DataType::kINT32), step_t({1}, DataType::kINT32);
        Tensor k({rows, heads, L, head_dim}, t), v({rows, heads, L, head_dim}, t);
        Tensor k_ref({rows, heads, L, head_dim}, t), v_ref({rows, heads, L, head_dim}, t);
        qkv.upload(random_floats(qkv.count(), t));
        bias.upload(random_floats(bias.count(), t));
        const std::vector<uint8_t> k_host = random_floats(k.count(), t), v_host = random_floats(v.count(), t);
        for (Tensor* c : {&k, &k_ref}) c->upload(k_host);
        for (Tensor* c : {&v, &v_ref}) c->upload(v_host);
        indir.upload(int_bytes(random_int_values(int64_t{rows} * L, 0, rows - 1)));
        step_t.upload(int_bytes({step}));
        Tensor out({rows, width}, t), ref({rows, width}, t);
        Workspace none(plugin.get(), {&qkv, &bias, &k, &v, &indir, &step_t, &out, &k, &v}, 6);
        EXPECT(none.bytes == 0, "own_workspace asked TensorRT for ", none.bytes, " bytes");
        enqueue(plugin.get(), {&qkv, &bias, &k, &v, &indir, &step_t}, {&out, &k, &v});
        int64_t bytes = 0;
        expect_abi(padfree_decoder_self_attention_workspace_size(rows, heads, head_dim, L, &bytes));
        EXPECT(bytes > 0, "no split at L = ", L);
        void* ws = nullptr;
        CUDA_OK(cudaMalloc(&ws, static_cast<size_t>(bytes)));
        expect_abi(padfree_decoder_self_attention(qkv.ptr, bias.ptr, k_ref.ptr, v_ref.ptr,
                                                  static_cast<const int32_t*>(indir.ptr),
                                                  static_cast<const int32_t*>(step_t.ptr), 0, rows, heads, head_dim, L,
                                                  0.125f, ws, bytes, dt, ref.ptr, nullptr));
        cudaFree(ws);
        same_bytes(out, ref, "PadfreeDecoderSelfAttention own_workspace context");
        same_bytes(k, k_ref, "PadfreeDecoderSelfAttention own_workspace k_cache");
    }
    {
        const int32_t rows = 6, vocab = 1000;
        auto plugin = make("logits_topk_greedy",
                           {int_field("k", 1), int_field("normalize", 0), float_field("repetition_penalty", 1.0f),
                            int_field("has_bias", 0), int_field("has_beam_scores", 0), int_field("has_banned", 0),
                            int_field("has_penalty", 0), int_field("has_forced", 0), int_field("own_workspace", 1)});
        Tensor logits({rows, vocab}, t), scores({rows, 1}, DataType::kFLOAT), ids({rows, 1}, DataType::kINT32);
        Tensor scores_ref({rows, 1}, DataType::kFLOAT), ids_ref({rows, 1}, DataType::kINT32);
        logits.upload(random_floats(logits.count(), t, -4.0f, 4.0f));
        enqueue(plugin.get(), {&logits}, {&scores, &ids});
        int64_t bytes = 0;
        expect_abi(padfree_logits_topk_workspace_size(rows, vocab, 1, &bytes));
        void* ws = nullptr;
        CUDA_OK(cudaMalloc(&ws, static_cast<size_t>(bytes)));
        expect_abi(padfree_logits_topk(logits.ptr, nullptr, nullptr, nullptr, 0, 1.0f, nullptr, 0, nullptr, nullptr, 0,
                                       rows, vocab, 1, 0, ws, bytes, dt, static_cast<float*>(scores_ref.ptr),
                                       static_cast<int32_t*>(ids_ref.ptr), nullptr));
        cudaFree(ws);
        same_bytes(scores, scores_ref, "PadfreeLogitsTopK own_workspace scores");
        same_bytes(ids, ids_ref, "PadfreeLogitsTopK own_workspace ids");
    }
});

Register logits_topk_gpu("gpu_logits_topk_vs_c_abi", [] {
    require_gpu();
    const int32_t rows = 6, vocab = 1000, banned = 3, penalty = 5;
    for (DataType t : kTypes) {
        const padfree_dtype dt = abi_dtype(t);
        Tensor logits({rows, vocab}, t), bias({vocab}, t), beam({rows}, DataType::kFLOAT);
        Tensor banned_ids({rows, banned}, DataType::kINT32), penalty_ids({rows, penalty}, DataType::kINT32),
            forced({rows}, DataType::kINT32);
        logits.upload(random_floats(logits.count(), t, -4.0f, 4.0f));
        bias.upload(random_floats(bias.count(), t));
        beam.upload(random_floats(rows, DataType::kFLOAT, -10.0f, 0.0f));
        banned_ids.upload(int_bytes(random_int_values(int64_t{rows} * banned, -1, vocab - 1)));
        penalty_ids.upload(int_bytes(random_int_values(int64_t{rows} * penalty, -1, vocab - 1)));
        forced.upload(int_bytes({-1, 7, -1, -1, 999, -1}));
        // Every optional input, k = 4 after log_softmax.
        {
            auto plugin = make("logits_topk_all_inputs");
            Tensor scores({rows, 4}, DataType::kFLOAT), ids({rows, 4}, DataType::kINT32);
            Tensor scores_ref({rows, 4}, DataType::kFLOAT), ids_ref({rows, 4}, DataType::kINT32);
            Workspace ws(plugin.get(), {&logits, &bias, &beam, &banned_ids, &penalty_ids, &forced, &scores, &ids}, 6);
            enqueue(plugin.get(), {&logits, &bias, &beam, &banned_ids, &penalty_ids, &forced}, {&scores, &ids}, ws.ptr);
            expect_abi(padfree_logits_topk(logits.ptr, bias.ptr, static_cast<const float*>(beam.ptr),
                                           static_cast<const int32_t*>(penalty_ids.ptr), penalty, 1.2f,
                                           static_cast<const int32_t*>(banned_ids.ptr), banned,
                                           static_cast<const int32_t*>(forced.ptr), nullptr, 0, rows, vocab, 4, 1,
                                           ws.ptr, static_cast<int64_t>(ws.bytes), dt,
                                           static_cast<float*>(scores_ref.ptr),
                                           static_cast<int32_t*>(ids_ref.ptr), nullptr));
            same_bytes(scores, scores_ref, "PadfreeLogitsTopK scores");
            same_bytes(ids, ids_ref, "PadfreeLogitsTopK ids");
        }
        // Greedy: raw logits, no optional input, k = 1.
        {
            auto plugin = make("logits_topk_greedy");
            Tensor scores({rows, 1}, DataType::kFLOAT), ids({rows, 1}, DataType::kINT32);
            Tensor scores_ref({rows, 1}, DataType::kFLOAT), ids_ref({rows, 1}, DataType::kINT32);
            Workspace ws(plugin.get(), {&logits, &scores, &ids}, 1);
            enqueue(plugin.get(), {&logits}, {&scores, &ids}, ws.ptr);
            expect_abi(padfree_logits_topk(logits.ptr, nullptr, nullptr, nullptr, 0, 1.0f, nullptr, 0, nullptr, nullptr,
                                           0, rows, vocab, 1, 0, ws.ptr, static_cast<int64_t>(ws.bytes), dt,
                                           static_cast<float*>(scores_ref.ptr), static_cast<int32_t*>(ids_ref.ptr),
                                           nullptr));
            same_bytes(scores, scores_ref, "PadfreeLogitsTopK greedy scores");
            same_bytes(ids, ids_ref, "PadfreeLogitsTopK greedy ids");
        }
    }
});

Register beam_reorder_gpu("gpu_beam_reorder_vs_c_abi", [] {
    require_gpu();
    const int32_t rows = 6, step = 5;
    for (int32_t L : {16, 15}) {  // vector and scalar rows
        Tensor indir({rows, L}, DataType::kINT32), parents({rows}, DataType::kINT32), step_t({1}, DataType::kINT32);
        indir.upload(int_bytes(random_int_values(int64_t{rows} * L, 0, rows - 1)));
        parents.upload(int_bytes(random_int_values(rows, 0, rows - 1)));
        step_t.upload(int_bytes({step}));
        Tensor out({rows, L}, DataType::kINT32), ref({rows, L}, DataType::kINT32);
        enqueue(make("beam_reorder").get(), {&indir, &parents, &step_t}, {&out});
        expect_abi(padfree_beam_reorder_cache_indir(static_cast<const int32_t*>(indir.ptr),
                                                    static_cast<const int32_t*>(parents.ptr),
                                                    static_cast<const int32_t*>(step_t.ptr), rows, L,
                                                    static_cast<int32_t*>(ref.ptr), nullptr));
        same_bytes(out, ref, str("PadfreeBeamReorder L=", L));
    }
});

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& values) {
    std::vector<uint8_t> out(values.size() * sizeof(T));
    std::memcpy(out.data(), values.data(), out.size());
    return out;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
    const std::vector<uint8_t> bytes = t.download();
    std::vector<T> out(bytes.size() / sizeof(T));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
}

Register beam_search_step_gpu("gpu_beam_search_step_vs_c_abi", [] {
    // A whole search (every step to max_length) through the plugin, int32 flags, its state aliased (one
    // buffer in and out) or copied, its own workspace or TensorRT's, against the C ABI with uint8 flags
    // (torch.bool's) on its own copy of the state: every state output, next tokens and parents bit for
    // bit, the flags as values. Candidate ids in [0, 10) with eos ids 5 and 7, so hypotheses finish.
    require_gpu();
    const int32_t batch = 3, beams = 2, keep = 4, L = 8, rows = batch * beams;
    const Case& c = case_named("beam_search_step");
    for (int32_t early : {0, 1, 2}) {
        for (bool aliased : {true, false}) {
            for (int32_t own : {0, 1}) {
                const float lp = early == 2 ? 0.5f : 1.0f;
                auto plugin = make("beam_search_step", with_fields(c, {int_field("early_stopping", early),
                                                                       int_field("own_workspace", own),
                                                                       float_field("length_penalty", lp)}));
                std::vector<int64_t> seq(int64_t{batch} * beams * L, 1);  // fill 1, the start token 0
                for (int32_t r = 0; r < rows; ++r) seq[int64_t{r} * L] = 0;
                std::vector<float> running_scores(rows, -1e9f), empty_scores(rows, -1e9f);
                for (int32_t b = 0; b < batch; ++b) running_scores[b * beams] = 0.0f;
                Tensor running({batch, beams, L}, DataType::kINT64), pool({batch, beams, L}, DataType::kINT64);
                Tensor rs({batch, beams}, DataType::kFLOAT), ps({batch, beams}, DataType::kFLOAT);
                Tensor pl({batch, beams}, DataType::kINT64), pf({batch, beams}, DataType::kINT32),
                    imp({batch}, DataType::kINT32);
                Tensor running_ref({batch, beams, L}, DataType::kINT64), pool_ref({batch, beams, L}, DataType::kINT64);
                Tensor rs_ref({batch, beams}, DataType::kFLOAT), ps_ref({batch, beams}, DataType::kFLOAT);
                Tensor pl_ref({batch, beams}, DataType::kINT64), pf_ref({batch, beams}, DataType::kUINT8),
                    imp_ref({batch}, DataType::kUINT8), done_ref({1}, DataType::kUINT8);
                for (Tensor* t : {&running, &pool, &running_ref, &pool_ref}) t->upload(as_bytes(seq));
                rs.upload(as_bytes(running_scores)), rs_ref.upload(as_bytes(running_scores));
                ps.upload(as_bytes(empty_scores)), ps_ref.upload(as_bytes(empty_scores));
                pl.upload(as_bytes(std::vector<int64_t>(rows, 0))), pl_ref.upload(as_bytes(std::vector<int64_t>(rows, 0)));
                pf.upload(int_bytes(std::vector<int32_t>(rows, 0))), pf_ref.upload(std::vector<uint8_t>(rows, 0));
                imp.upload(int_bytes(std::vector<int32_t>(batch, 1))), imp_ref.upload(std::vector<uint8_t>(batch, 1));
                done_ref.upload({0});
                Tensor eos({2}, DataType::kINT32), step_t({1}, DataType::kINT32);
                eos.upload(int_bytes({5, 7}));
                Tensor running_o({batch, beams, L}, DataType::kINT64), pool_o({batch, beams, L}, DataType::kINT64);
                Tensor rs_o({batch, beams}, DataType::kFLOAT), ps_o({batch, beams}, DataType::kFLOAT);
                Tensor pl_o({batch, beams}, DataType::kINT64), pf_o({batch, beams}, DataType::kINT32),
                    imp_o({batch}, DataType::kINT32);
                Tensor next({rows}, DataType::kINT64), parents({rows}, DataType::kINT32);
                Tensor next_ref({rows}, DataType::kINT64), parents_ref({rows}, DataType::kINT32);
                int64_t ws_bytes = 0, counters = 0;
                expect_abi(padfree_beam_search_workspace_size(batch, beams, L, 0, &ws_bytes, &counters));
                void* ws_ref = nullptr;
                CUDA_OK(cudaMalloc(&ws_ref, static_cast<size_t>(ws_bytes)));
                CUDA_OK(cudaMemset(ws_ref, 0, static_cast<size_t>(ws_bytes)));
                const std::vector<Tensor*> state{&running, &rs, &pool, &ps, &pl, &pf, &imp};
                const std::vector<Tensor*> state_out{&running_o, &rs_o, &pool_o, &ps_o, &pl_o, &pf_o, &imp_o};
                for (int32_t step = 0; step <= L - 2; ++step) {
                    std::vector<float> scores(int64_t{rows} * keep);
                    std::uniform_real_distribution<float> dist(-10.0f, 0.0f);
                    for (int32_t r = 0; r < rows; ++r) {
                        for (int32_t j = 0; j < keep; ++j) scores[r * keep + j] = dist(rng());
                        std::sort(scores.begin() + r * keep, scores.begin() + (r + 1) * keep, std::greater<float>());
                    }
                    Tensor cand({rows, keep}, DataType::kFLOAT), ids({rows, keep}, DataType::kINT32);
                    cand.upload(as_bytes(scores));
                    ids.upload(int_bytes(random_int_values(int64_t{rows} * keep, 0, 9)));
                    step_t.upload(int_bytes({step}));
                    for (Tensor* t : {&next, &parents}) t->poison();
                    std::vector<const Tensor*> outs;
                    for (size_t k = 0; k < state.size(); ++k) {
                        if (!aliased) state_out[k]->poison();
                        outs.push_back(aliased ? state[k] : state_out[k]);
                    }
                    outs.push_back(&next), outs.push_back(&parents);
                    std::vector<const Tensor*> ins{&cand, &ids, &step_t};
                    ins.insert(ins.end(), state.begin(), state.end());
                    ins.push_back(&eos);
                    std::vector<const Tensor*> io = ins;
                    io.insert(io.end(), outs.begin(), outs.end());
                    Workspace ws(plugin.get(), io, static_cast<int32_t>(ins.size()));
                    EXPECT(own == 0 ? ws.bytes > 0 : ws.bytes == 0, "workspace ", ws.bytes, " with own_workspace ", own);
                    if (ws.ptr != nullptr) CUDA_OK(cudaMemset(ws.ptr, 0xFF, ws.bytes));  // a shared, dirty workspace
                    enqueue(plugin.get(), ins, outs, ws.ptr);
                    expect_abi(padfree_beam_search_step(
                        static_cast<const float*>(cand.ptr), static_cast<const int32_t*>(ids.ptr), keep,
                        static_cast<const int32_t*>(eos.ptr), 2, static_cast<int64_t*>(running_ref.ptr),
                        static_cast<float*>(rs_ref.ptr), static_cast<int64_t*>(pool_ref.ptr),
                        static_cast<float*>(ps_ref.ptr), static_cast<int64_t*>(pl_ref.ptr), pf_ref.ptr, imp_ref.ptr, 1,
                        static_cast<uint8_t*>(done_ref.ptr), static_cast<int64_t*>(next_ref.ptr),
                        static_cast<int32_t*>(parents_ref.ptr), nullptr, 0, static_cast<int32_t*>(step_t.ptr), batch,
                        beams, L, lp, early, 0, ws_ref, ws_bytes, nullptr));
                    const std::string at = str(" at step ", step, ", early_stopping ", early, aliased ? ", aliased" : "",
                                               own ? ", own workspace" : "");
                    const std::vector<Tensor*> got = aliased ? state : state_out;
                    same_bytes(*got[0], running_ref, "running" + at);
                    same_bytes(*got[1], rs_ref, "running_scores" + at);
                    same_bytes(*got[2], pool_ref, "pool" + at);
                    same_bytes(*got[3], ps_ref, "pool_scores" + at);
                    same_bytes(*got[4], pl_ref, "pool_lengths" + at);
                    const std::vector<int32_t> finished = values_of<int32_t>(*got[5]), improvable = values_of<int32_t>(*got[6]);
                    const std::vector<uint8_t> finished_ref = pf_ref.download(), improvable_ref = imp_ref.download();
                    for (int32_t r = 0; r < rows; ++r)
                        EXPECT(finished[r] == finished_ref[r], "pool_finished[", r, "]", at);
                    for (int32_t b = 0; b < batch; ++b)
                        EXPECT(improvable[b] == improvable_ref[b], "improvable[", b, "]", at);
                    same_bytes(next, next_ref, "next_tokens" + at);
                    same_bytes(parents, parents_ref, "parents" + at);
                    if (!aliased)  // the next step reads this one's state
                        for (size_t k = 0; k < state.size(); ++k)
                            CUDA_OK(cudaMemcpy(state[k]->ptr, state_out[k]->ptr, state[k]->bytes(), cudaMemcpyDeviceToDevice));
                }
                // The search ran to its end: some hypotheses finished into the pool.
                const std::vector<int64_t> lengths = values_of<int64_t>(pl_ref);
                EXPECT(std::any_of(lengths.begin(), lengths.end(), [](int64_t n) { return n > 0; }), "no finished hypothesis");
                cudaFree(ws_ref);
            }
        }
    }
});

Register greedy_step_gpu("gpu_greedy_step_vs_c_abi", [] {
    // A whole greedy search through the plugin (int32 flags, state aliased or copied, with and without
    // eos ids) against the C ABI with uint8 flags on its own copy: sequences, generated and next tokens
    // bit for bit, the flags as values. Top-1 ids in [0, 10) with eos ids 5 and 7, so rows finish.
    require_gpu();
    const int32_t rows = 6, L = 8, pad = 1;
    for (int32_t has_eos : {1, 0}) {
        for (bool aliased : {true, false}) {
            auto plugin = make("greedy_step", with_fields(case_named("greedy_step"), {int_field("has_eos", has_eos)}));
            std::vector<int64_t> seq(int64_t{rows} * L, pad);
            for (int32_t r = 0; r < rows; ++r) seq[int64_t{r} * L] = 0;
            Tensor sequences({rows, L}, DataType::kINT64), generated({rows}, DataType::kINT64),
                unfinished({rows}, DataType::kINT32);
            Tensor sequences_ref({rows, L}, DataType::kINT64), generated_ref({rows}, DataType::kINT64),
                unfinished_ref({rows}, DataType::kUINT8), done_ref({1}, DataType::kUINT8);
            sequences.upload(as_bytes(seq)), sequences_ref.upload(as_bytes(seq));
            generated.upload(as_bytes(std::vector<int64_t>(rows, 0))), generated_ref.upload(as_bytes(std::vector<int64_t>(rows, 0)));
            unfinished.upload(int_bytes(std::vector<int32_t>(rows, 1))), unfinished_ref.upload(std::vector<uint8_t>(rows, 1));
            done_ref.upload({0});
            Tensor sequences_o({rows, L}, DataType::kINT64), generated_o({rows}, DataType::kINT64),
                unfinished_o({rows}, DataType::kINT32);
            Tensor next({rows}, DataType::kINT64), next_ref({rows}, DataType::kINT64);
            Tensor eos({2}, DataType::kINT32), step_t({1}, DataType::kINT32);
            eos.upload(int_bytes({5, 7}));
            const std::vector<Tensor*> state{&sequences, &generated, &unfinished};
            const std::vector<Tensor*> state_out{&sequences_o, &generated_o, &unfinished_o};
            for (int32_t step = 0; step <= L - 2; ++step) {
                Tensor ids({rows, 1}, DataType::kINT32);
                ids.upload(int_bytes(random_int_values(rows, 0, 9)));
                step_t.upload(int_bytes({step}));
                next.poison();
                std::vector<const Tensor*> ins{&ids, &step_t}, outs;
                ins.insert(ins.end(), state.begin(), state.end());
                if (has_eos) ins.push_back(&eos);
                for (size_t k = 0; k < state.size(); ++k) {
                    if (!aliased) state_out[k]->poison();
                    outs.push_back(aliased ? state[k] : state_out[k]);
                }
                outs.push_back(&next);
                enqueue(plugin.get(), ins, outs);
                expect_abi(padfree_greedy_step(static_cast<const int32_t*>(ids.ptr),
                                               has_eos ? static_cast<const int32_t*>(eos.ptr) : nullptr, has_eos ? 2 : 0,
                                               static_cast<int64_t*>(sequences_ref.ptr), static_cast<int64_t*>(next_ref.ptr),
                                               static_cast<int64_t*>(generated_ref.ptr), unfinished_ref.ptr, 1,
                                               static_cast<uint8_t*>(done_ref.ptr), static_cast<int32_t*>(step_t.ptr),
                                               rows, L, pad, 0, nullptr));
                const std::string at = str(" at step ", step, has_eos ? ", eos" : ", no eos", aliased ? ", aliased" : "");
                const std::vector<Tensor*> got = aliased ? state : state_out;
                same_bytes(*got[0], sequences_ref, "sequences" + at);
                same_bytes(*got[1], generated_ref, "generated" + at);
                same_bytes(next, next_ref, "next_tokens" + at);
                const std::vector<int32_t> flags = values_of<int32_t>(*got[2]);
                const std::vector<uint8_t> flags_ref = unfinished_ref.download();
                for (int32_t r = 0; r < rows; ++r) EXPECT(flags[r] == flags_ref[r], "unfinished[", r, "]", at);
                if (!aliased)
                    for (size_t k = 0; k < state.size(); ++k)
                        CUDA_OK(cudaMemcpy(state[k]->ptr, state_out[k]->ptr, state[k]->bytes(), cudaMemcpyDeviceToDevice));
            }
            if (has_eos) {
                const std::vector<int64_t> ended = values_of<int64_t>(generated_ref);
                EXPECT(std::any_of(ended.begin(), ended.end(), [](int64_t n) { return n > 0; }), "no row finished");
            }
        }
    }
});

}  // namespace
}  // namespace harness
}  // namespace padfree
