/* padfree: the plain C ABI over the padding-free kernels.
 *
 * Every tensor is a raw device pointer on packed tokens: rows of all sequences laid end to end,
 * [total_tokens, ...], with the prefix sum of sequence lengths in cu_seqlens (int32, [batch + 1],
 * cu_seqlens[0] == 0, cu_seqlens[batch] <= total_tokens: rows past it are CUDA-graph bucket
 * padding, rows of no sequence, and a sequence of length 0 is no work). Calls that locate packed
 * rows through cu_seqlens also take total_tokens, the packed tensor's row count, and clamp each
 * sequence's rows [cu_seqlens[b], cu_seqlens[b + 1]) to [0, total_tokens]: whatever cu_seqlens
 * holds, no row outside the tensors is read or written (values for an inconsistent cu_seqlens
 * are unspecified). All work is enqueued on `stream`; no call but padfree_stream_synchronize
 * blocks the host. Every call returns a status; on failure padfree_last_error() says why
 * (thread-local). Float tensors of one call share one dtype; statistics and accumulation are fp32.
 *
 * Callers: the Python bindings (ctypes), the TensorRT plugins (plugins/trt), and C/C++ users.
 * No C++ types cross this boundary; the stream is a cudaStream_t passed as void*.
 */
#ifndef PADFREE_H
#define PADFREE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PADFREE_API __declspec(dllexport)
#else
#define PADFREE_API __attribute__((visibility("default")))
#endif

/* Bumped on any incompatible change of a signature below; the bindings refuse a mismatch.
 * 2: remove_padding, rebuild_padding and attention_varlen take total_tokens. 4: guarded graphs.
 * 5: input plans. 6: programmatic edges into other libraries' kernels. 7: their probe.
 * 8: removal of memsets made redundant. 9: L2 prefetch ranges for the LayerNorms before a GEMM.
 * 11: sentence pooling (padfree_sequence_pool). 12: beam_search_step's and greedy_step's flag_bytes
 * (int32 flags for TensorRT's PadfreeBeamSearchStep and PadfreeGreedyStep). 14: logits_topk's step tables
 * (step, num_steps). 15: decoder_self_attention's state_ready.
 * (New functions, such as the decoder's, add to a version without bumping it.) */
#define PADFREE_ABI_VERSION 15

typedef enum padfree_status {
    PADFREE_OK = 0,
    PADFREE_ERROR_INVALID_ARGUMENT = 1, /* a shape, pointer or parameter the kernel cannot take */
    PADFREE_ERROR_UNSUPPORTED = 2,      /* valid, but not built (head_dim, dtype, flag) */
    PADFREE_ERROR_CUDA = 3              /* a CUDA launch or API call failed */
} padfree_status;

typedef enum padfree_dtype {
    PADFREE_FLOAT32 = 0,
    PADFREE_FLOAT16 = 1,
    PADFREE_BFLOAT16 = 2
} padfree_dtype;

typedef void* padfree_stream; /* cudaStream_t; NULL is the legacy default stream */

PADFREE_API int padfree_abi_version(void);
PADFREE_API const char* padfree_version(void);
PADFREE_API const char* padfree_last_error(void);
PADFREE_API const char* padfree_status_string(padfree_status status);

/* Waits until `stream` has run everything enqueued on it (cudaStreamSynchronize): the one call that
 * blocks the host, for callers that read host_stats (below) and have no CUDA runtime of their own
 * at hand; through ctypes it is one foreign call instead of a framework's stream object. */
PADFREE_API padfree_status padfree_stream_synchronize(padfree_stream stream);

/* ---- padding: prefix-sum packing (ByteTransformer's remove/rebuild padding) ------------------ */

/* seqlens: [batch] int32 -> cu_seqlens: [batch + 1] int32 (exclusive prefix sum, one block). */
PADFREE_API padfree_status padfree_cu_seqlens_from_seqlens(const int32_t* seqlens, int32_t batch,
                                                           int32_t* cu_seqlens, padfree_stream stream);

/* mask: [batch, padded_seqlen] int32, 1 = token, 0 = padding, each row left-aligned (ones, then
 * zeros) -> cu_seqlens: [batch + 1]. invalid_rows (device int32 scalar, may be NULL) is set to the
 * number of rows that are not left-aligned or hold values other than 0/1; it is not cleared first. */
PADFREE_API padfree_status padfree_cu_seqlens_from_mask(const int32_t* mask, int32_t batch,
                                                        int32_t padded_seqlen, int32_t* cu_seqlens,
                                                        int32_t* invalid_rows, padfree_stream stream);

/* padded: [batch, padded_seqlen, row_bytes] -> packed: [total_tokens, row_bytes]. Any element type:
 * rows are moved as bytes (16-byte vectors where row_bytes and pointers allow). total_tokens >= 0:
 * packed rows past it are never written (a sequence reaching past it is cut there). */
PADFREE_API padfree_status padfree_remove_padding(const void* padded, const int32_t* cu_seqlens,
                                                  int32_t batch, int64_t total_tokens,
                                                  int32_t padded_seqlen, int64_t row_bytes,
                                                  void* packed, padfree_stream stream);

/* packed: [total_tokens, row_bytes] -> padded: [batch, padded_seqlen, row_bytes], zero bytes in
 * every row at or past its sequence's length; a sequence longer than padded_seqlen keeps its first
 * padded_seqlen rows (padded_seqlen 1: each sequence's first token). total_tokens >= 0: packed
 * rows past it are never read; the padded rows of a sequence reaching past it that are not copied
 * hold zeros. */
PADFREE_API padfree_status padfree_rebuild_padding(const void* packed, const int32_t* cu_seqlens,
                                                   int32_t batch, int64_t total_tokens,
                                                   int32_t padded_seqlen, int64_t row_bytes,
                                                   void* padded, padfree_stream stream);

/* ---- model inputs of a right-padded batch, on the GPU ----------------------------------------
 * A tokenizer's padded input_ids / attention_mask / token_type_ids already on the device become
 * packed int32 inputs in two calls around one read-back of three ints (the host needs the token
 * count to choose shapes): padfree_padded_input_stats measures and checks, padfree_pack_padded_inputs
 * packs. Element sizes: mask_bytes 1 (bool, uint8), 4 (int32) or 8 (int64); id_bytes 4 or 8, for
 * ids and types alike. batch >= 1, padded_seqlen >= 1, batch * padded_seqlen <= INT32_MAX.
 * forbidden_id: an id no valid position may hold (PADFREE_INPUT_FORBIDDEN_ID), or -1 for none. */

enum {
    PADFREE_INPUT_MASK_VALUE = 1, /* a mask value other than 0 and 1 */
    PADFREE_INPUT_MASK_ALIGN = 2, /* a mask row that is not ones then zeros (right padding) */
    PADFREE_INPUT_EMPTY_ROW = 4,  /* a mask row of zeros */
    PADFREE_INPUT_ID_RANGE = 8,   /* a token id outside [0, vocab_size) at a valid position */
    PADFREE_INPUT_TYPE_RANGE = 16, /* a token type id outside [0, type_vocab_size) at a valid position */
    PADFREE_INPUT_FORBIDDEN_ID = 32 /* forbidden_id at a valid position (a RoBERTa-style model's padding id,
                                       around which it numbers positions) */
};

/* attention_mask [batch, padded_seqlen] (NULL: every position is a token), input_ids and
 * token_type_ids (may be NULL) [batch, padded_seqlen] -> seqlens [batch] int32 (ones per mask row)
 * and stats [3] int32: the OR of PADFREE_INPUT_* flags over all rows, the total and the longest of
 * seqlens. Padding positions may hold any id. host_stats: NULL, or host memory [3] (pinned, for the
 * copy to be asynchronous) that receives a stream-ordered copy of stats: read it after synchronizing
 * the stream (one call instead of a launch and a copy: the caller's host time is the latency here). */
PADFREE_API padfree_status padfree_padded_input_stats(const void* attention_mask, int32_t mask_bytes,
                                                      const void* input_ids, const void* token_type_ids,
                                                      int32_t id_bytes, int32_t batch,
                                                      int32_t padded_seqlen, int64_t vocab_size,
                                                      int64_t type_vocab_size, int64_t forbidden_id,
                                                      int32_t* seqlens, int32_t* stats, int32_t* host_stats,
                                                      padfree_stream stream);

/* seqlens from padfree_padded_input_stats -> cu_seqlens [cu_capacity + 1] (entries past batch repeat
 * the total: sequences of length 0, as CUDA-graph buckets want), packed_ids [total] int32 and, where
 * token_type_ids is given, packed_token_type_ids [total]. cu_capacity >= batch; packed_capacity is
 * the packed buffers' length: positions at or past it are never written (size them by stats' total). */
PADFREE_API padfree_status padfree_pack_padded_inputs(const void* input_ids, const void* token_type_ids,
                                                      int32_t id_bytes, const int32_t* seqlens,
                                                      int32_t batch, int32_t padded_seqlen,
                                                      int32_t cu_capacity, int32_t packed_capacity,
                                                      int32_t* packed_ids, int32_t* packed_token_type_ids,
                                                      int32_t* cu_seqlens, padfree_stream stream);

/* padfree_padded_input_stats and padfree_pack_padded_inputs in one call, with their arguments and
 * results (host_stats filled once the stream gets there), for callers whose packed buffers do not
 * depend on the total: up to 32K positions (2048 rows) in one GPU operation instead of five (a host write
 * through host_stats' mapped address instead of a copy), the latency in front of an HF-style call's
 * CUDA graph. When the total exceeds packed_capacity the buffers hold a cut batch: pack again. */
PADFREE_API padfree_status padfree_prepare_padded_inputs(const void* attention_mask, int32_t mask_bytes,
                                                         const void* input_ids, const void* token_type_ids,
                                                         int32_t id_bytes, int32_t batch, int32_t padded_seqlen,
                                                         int64_t vocab_size, int64_t type_vocab_size,
                                                         int64_t forbidden_id, int32_t* seqlens, int32_t* stats,
                                                         int32_t* host_stats,
                                                         int32_t cu_capacity, int32_t packed_capacity,
                                                         int32_t* packed_ids, int32_t* packed_token_type_ids,
                                                         int32_t* cu_seqlens, padfree_stream stream);

/* ---- guarded CUDA graphs --------------------------------------------------------------------- */

/* A graph that runs `body` (a cudaGraph_t, cloned: the caller keeps it) only where the device int32
 * stats [3] (flags, total, longest, as padfree_prepare_padded_inputs writes them) show flags == 0,
 * min_total <= total <= max_total and min_longest <= longest <= max_longest when the stream reaches
 * it; otherwise one one-thread kernel runs and the body is skipped. A caller that captured a forward for a bucket of
 * sizes can so launch it right behind the prepare call, before the totals reach the host, and check
 * them afterwards (the same predicate) instead of synchronizing in between. The body may hold
 * kernel, memset, memcpy, empty and child-graph nodes (CUDA's rule for conditional bodies);
 * create fails with PADFREE_ERROR_CUDA otherwise, or where the driver has no conditional nodes. */
typedef struct padfree_guarded_graph padfree_guarded_graph;
PADFREE_API padfree_status padfree_guarded_graph_create(void* body, const int32_t* stats, int32_t min_total,
                                                        int32_t max_total, int32_t min_longest, int32_t max_longest,
                                                        padfree_guarded_graph** out);
PADFREE_API padfree_status padfree_guarded_graph_launch(padfree_guarded_graph* graph, padfree_stream stream);
PADFREE_API padfree_status padfree_guarded_graph_destroy(padfree_guarded_graph* graph);

/* ---- programmatic edges into other libraries' kernels ---------------------------------------- */

/* In a captured graph (a cudaGraph_t), a padfree kernel's consumer from another library (a torch or
 * cuBLASLt kernel, launched without PDL) hangs on a full edge: it launches only once the padfree
 * kernel has completed. Such an edge may be programmatic (the consumer launches while its producer
 * drains) only where the consumer's kernel waits on its producer (griddepcontrol.wait) before it
 * touches memory, which no API reports: callers decide per consumer function, e.g. with a probe (a
 * graph of probe_delayed_copy and the consumer, relaxed) and by comparing a relaxed copy's outputs
 * with the captured graph's (padfree_graph_exec_create).
 * consumers: the distinct functions of kernel nodes fed by a padfree kernel node through a full edge
 * (up to capacity written; count: how many there are). probe_delayed_copy: copies `bytes` (a
 * positive multiple of 16, 16-byte aligned addresses) from src to dst, but lets the kernels that
 * depend on it launch at once and spins for *spin_ns (device memory) before it copies.
 * relax_edges: makes each such edge into a kernel running one of `functions` programmatic, in place
 * (relaxed: how many). exec_create: an executable copy of `graph` with those edges relaxed (the
 * graph itself is unchanged). */
PADFREE_API padfree_status padfree_graph_consumers(void* graph, const void** functions, int32_t capacity,
                                                   int32_t* count);
PADFREE_API padfree_status padfree_probe_delayed_copy(const void* src, void* dst, int64_t bytes,
                                                     const int64_t* spin_ns, padfree_stream stream);
PADFREE_API padfree_status padfree_graph_relax_edges(void* graph, const void* const* functions, int32_t count,
                                                     int32_t* relaxed);
/* Removes from a captured graph each memset node that writes zeros inside one slot of [base, base +
 * bytes) (slots of slot_bytes from base), joining its dependencies to its dependents (removed: how
 * many): for a caller that zeroes the slots once before those memsets would have run, e.g. cuBLASLt's
 * per-GEMM workspace counters, each GEMM given a slot of its own. Memsets over more than one slot
 * stay. */
PADFREE_API padfree_status padfree_graph_remove_zeroing_memsets(void* graph, const void* base, int64_t bytes,
                                                                int64_t slot_bytes, int32_t* removed);
typedef struct padfree_graph_exec padfree_graph_exec;
PADFREE_API padfree_status padfree_graph_exec_create(void* graph, const void* const* functions, int32_t count,
                                                     int32_t* relaxed, padfree_graph_exec** out);
PADFREE_API padfree_status padfree_graph_exec_launch(padfree_graph_exec* exec, padfree_stream stream);
PADFREE_API padfree_status padfree_graph_exec_destroy(padfree_graph_exec* exec);

/* ---- input plans: a prepare call's fixed arguments, for one foreign call per batch ------------ */

/* padfree_prepare_padded_inputs' arguments but the inputs' addresses, checked once (mask_bytes 0:
 * no attention_mask; with_token_types: token_type_ids are given and packed), with host_stats' mapped
 * address looked up once: the buffers must outlive the plan. */
typedef struct padfree_input_plan padfree_input_plan;
PADFREE_API padfree_status padfree_input_plan_create(int32_t mask_bytes, int32_t id_bytes, int32_t with_token_types,
                                                     int32_t batch, int32_t padded_seqlen, int64_t vocab_size,
                                                     int64_t type_vocab_size, int64_t forbidden_id,
                                                     int32_t* seqlens, int32_t* stats, int32_t* host_stats,
                                                     int32_t cu_capacity,
                                                     int32_t packed_capacity, int32_t* packed_ids,
                                                     int32_t* packed_token_type_ids, int32_t* cu_seqlens,
                                                     padfree_input_plan** out);
/* padfree_prepare_padded_inputs on inputs laid out as the plan says ([batch, padded_seqlen],
 * contiguous), then, where `then` is not NULL, padfree_guarded_graph_launch(then): the HF-style
 * call's whole host work in front of a speculative forward, in one call. Where the prepare step is
 * one kernel of one CTA (up to 32 rows and 32K positions), both go in one graph launch: `then`'s
 * graph behind that kernel, instantiated on the first such call. */
PADFREE_API padfree_status padfree_input_plan_launch(const padfree_input_plan* plan, const void* attention_mask,
                                                     const void* input_ids, const void* token_type_ids,
                                                     padfree_guarded_graph* then, padfree_stream stream);
PADFREE_API padfree_status padfree_input_plan_destroy(padfree_input_plan* plan);

/* ---- fused multi-head attention over variable-length sequences ------------------------------ */

enum { PADFREE_ATTENTION_CAUSAL = 1 }; /* flags: reserved for the decoder half */

/* qkv:      [total_tokens, 3, num_heads, head_dim]  (the QKV projection output: Q | K | V blocks)
 * qkv_bias: [3, num_heads, head_dim] or NULL, added as Q, K and V are loaded
 * out:      [total_tokens, num_heads, head_dim]
 * total_tokens >= 0 is the row count of qkv and out: a sequence reaching past it is cut there (its
 * rows past total_tokens are neither read nor written).
 * Every sequence must have 0 <= length <= max_seqlen (0: no work); rows past cu_seqlens[batch] are
 * not written. batch 0 is no work (pointers unused). softmax_scale is usually 1/sqrt(head_dim).
 * head_dim 32, 64 and 128 are built (others: PADFREE_ERROR_UNSUPPORTED). */
PADFREE_API padfree_status padfree_attention_varlen(const void* qkv, const void* qkv_bias,
                                                    const int32_t* cu_seqlens, int32_t batch,
                                                    int64_t total_tokens, int32_t max_seqlen,
                                                    int32_t num_heads, int32_t head_dim,
                                                    float softmax_scale, uint32_t flags,
                                                    padfree_dtype dtype, void* out, padfree_stream stream);

/* ---- LayerNorm family ------------------------------------------------------------------------ */

/* x, out: [rows, hidden]; gamma, beta: [hidden]. out = LayerNorm(x) * gamma + beta. out may alias x. */
PADFREE_API padfree_status padfree_layernorm(const void* x, const void* gamma, const void* beta,
                                             int64_t rows, int32_t hidden, float eps,
                                             padfree_dtype dtype, void* out, padfree_stream stream);

/* Skip LayerNorm: out = LayerNorm(x + bias + residual) * gamma + beta.
 * x, residual, out: [rows, hidden]; bias, gamma, beta: [hidden]. bias and residual may be NULL
 * (no such term: a caller whose GEMM already added the residual). out may alias x or residual.
 * l2_prefetch, l2_prefetch_bytes: device memory the kernel starts moving into L2 before it waits on
 * the previous kernel (programmatic dependent launch), e.g. the next GEMMs' weights, which a
 * small-batch forward otherwise reads from DRAM on its critical path; a hint that changes no result.
 * NULL and 0: none. */
PADFREE_API padfree_status padfree_skip_layernorm(const void* x, const void* residual,
                                                  const void* bias, const void* gamma,
                                                  const void* beta, int64_t rows, int32_t hidden,
                                                  float eps, const void* l2_prefetch,
                                                  int64_t l2_prefetch_bytes, padfree_dtype dtype,
                                                  void* out, padfree_stream stream);

/* ---- embeddings ------------------------------------------------------------------------------ */

/* out[t] = LayerNorm(word_emb[input_ids[t]] + position_emb[position_offset + t - cu_seqlens[b]]
 *                    + type_emb[token_type_ids[t]]) * gamma + beta,   b = the sequence of token t.
 * input_ids, token_type_ids: [total_tokens] int32 (token_type_ids may be NULL: type 0, and
 * type_emb may be NULL: no type term). word_emb: [vocab_size, hidden], position_emb:
 * [max_positions, hidden], type_emb: [type_vocab_size, hidden], gamma, beta: [hidden].
 * gamma and beta both NULL: no LayerNorm, out[t] = the sum (in fp32, rounded once to the dtype), as
 * Marian's and M2M100's encoders embed; eps is unused then (still checked). One of them NULL is refused.
 * Ids out of range are clamped so memory stays safe; callers validate ids and report them.
 * l2_prefetch, l2_prefetch_bytes: as for padfree_skip_layernorm (NULL and 0: none). */
PADFREE_API padfree_status padfree_embedding_layernorm(
    const int32_t* input_ids, const int32_t* token_type_ids, const int32_t* cu_seqlens,
    int32_t batch, int64_t total_tokens, const void* word_emb, int32_t vocab_size,
    const void* position_emb, int32_t max_positions, int32_t position_offset, const void* type_emb,
    int32_t type_vocab_size, const void* gamma, const void* beta, int32_t hidden, float eps,
    const void* l2_prefetch, int64_t l2_prefetch_bytes, padfree_dtype dtype, void* out,
    padfree_stream stream);

/* ---- activations ----------------------------------------------------------------------------- */

enum { PADFREE_GELU_ERF = 0, PADFREE_GELU_TANH = 1 };

/* out = gelu(x + bias). x, out: [rows, cols]; bias: [cols] or NULL. out may alias x. */
PADFREE_API padfree_status padfree_bias_gelu(const void* x, const void* bias, int64_t rows,
                                             int32_t cols, int32_t approximate,
                                             padfree_dtype dtype, void* out,
                                             padfree_stream stream);

/* ---- sentence pooling ------------------------------------------------------------------------ */

enum { PADFREE_POOL_CLS = 0, PADFREE_POOL_MEAN = 1, PADFREE_POOL_MAX = 2 };

/* One vector per sequence, as sentence-transformers' Pooling (+ Normalize) computes it:
 * out[b] = first row (CLS), mean or elementwise max of x's rows [cu_seqlens[b], cu_seqlens[b + 1]),
 * then, where normalize != 0, out[b] / max(||out[b]||_2, 1e-12). x: [total_tokens, hidden],
 * out: [batch, hidden]; hidden a multiple of 8 up to 8192, x and out 16-byte aligned. A sequence
 * with no rows (bucket padding's empty sequences) gives zeros. Sums, maxima and the norm in fp32. */
PADFREE_API padfree_status padfree_sequence_pool(const void* x, const int32_t* cu_seqlens, int32_t batch,
                                                 int64_t total_tokens, int32_t hidden, int32_t mode,
                                                 int32_t normalize, padfree_dtype dtype, void* out,
                                                 padfree_stream stream);

/* ---- decoder: one decoding step's attention (kernels/decoder/) --------------------------------
 * rows = batch * num_beams hypotheses, one query row each (row r belongs to source r / num_beams);
 * H = num_heads, D = head_dim (64 or 128), hidden = H * D, L = max_len (the cache's capacity).
 * A call whose grid would leave SMs idle splits the positions over CTAs (split-K flash-decoding)
 * into `workspace`, whose size the *_workspace_size call gives for the same sizes (0: none needed).
 * That size does not depend on the GPU (it holds the splits of any GPU up to 256 SMs), so a size
 * queried on one machine serves another; a smaller workspace means fewer splits, never an error.
 * Device values (step, cache_indir, cu_seqlens) are clamped into
 * range by the kernels: a bad value gives unspecified results, never an access outside a tensor. */

PADFREE_API padfree_status padfree_decoder_self_attention_workspace_size(int32_t rows, int32_t num_heads,
                                                                         int32_t head_dim, int32_t max_len,
                                                                         int64_t* bytes);

/* qkv:         [rows, 3, H, D]  this step's fused Q | K | V projection (bias not yet added)
 * qkv_bias:    [3, H, D] or NULL
 * k_cache, v_cache: [rows, H, L, D]; this step's K and V (bias added) are written to [r, :, step, :]
 * cache_indir: [rows, L] int32: for t < step, the row whose cache holds position t of row r's history
 * step:        device int32 scalar, 0 <= step < L: attends over positions 0..step (a graph replays)
 * state_ready: 0, or 1 where the caller promises that no kernel still running in the stream writes step,
 *              cache_indir or the caches' positions before step (a CUDA graph of one decode step, the
 *              previous replay having written them): the kernel then reads them before its
 *              programmatic-dependent-launch wait, overlapping their round trips with the kernel before
 *              it. A broken promise gives unspecified results (never an access outside a tensor).
 * out:         [rows, H, D]
 * softmax_scale: finite and positive (1/sqrt(D) usually; 1 where the scale is folded into Q). */
PADFREE_API padfree_status padfree_decoder_self_attention(const void* qkv, const void* qkv_bias, void* k_cache,
                                                          void* v_cache, const int32_t* cache_indir,
                                                          const int32_t* step, int32_t state_ready,
                                                          int32_t rows, int32_t num_heads,
                                                          int32_t head_dim, int32_t max_len, float softmax_scale,
                                                          void* workspace, int64_t workspace_bytes,
                                                          padfree_dtype dtype, void* out, padfree_stream stream);

PADFREE_API padfree_status padfree_decoder_cross_attention_workspace_size(int32_t rows, int32_t num_heads,
                                                                          int32_t head_dim, int32_t max_seqlen,
                                                                          int64_t* bytes);

/* q:          [batch * num_beams, H, D] (q_bias [H, D] or NULL, added as Q is loaded)
 * kv_mem:     [total_tokens, 2, H, D]  the encoder output's K | V projections, bias added, packed
 * cu_seqlens: [batch + 1] int32; row r attends over kv_mem rows cu_seqlens[s] .. cu_seqlens[s + 1] - 1,
 *             s = r / num_beams (in place: the beams of a source share its rows)
 * out:        [batch * num_beams, H, D]
 * Source lengths are at most max_seqlen (longer ones are cut there); an empty source gives zeros.
 * kv_mem and cu_seqlens are read before the kernel waits on the kernel before it (programmatic dependent
 * launch), so that their first round trip overlaps the kernel computing q: no kernel that may still run
 * when this one starts may write them (write them before the decode steps, as the encoder's K/V are, or
 * behind a full stream dependency: an event, a copy, a graph launch). */
PADFREE_API padfree_status padfree_decoder_cross_attention(const void* q, const void* q_bias, const void* kv_mem,
                                                           const int32_t* cu_seqlens, int32_t batch,
                                                           int32_t num_beams, int64_t total_tokens,
                                                           int32_t max_seqlen, int32_t num_heads, int32_t head_dim,
                                                           float softmax_scale, void* workspace,
                                                           int64_t workspace_bytes, padfree_dtype dtype, void* out,
                                                           padfree_stream stream);

/* A decode step's linear layer for a few rows (kernels/decoder/decode_linear.cu, decode_linear_mma.cu):
 *   out = act(LN(x) W^T + bias) + residual
 * x [rows, in_features], weight [out_features, in_features] (nn.Linear's layout), 16-byte aligned,
 * in_features a multiple of 8. Up to 8 rows (every dtype; CUDA cores, 5-8 rows of float16 / bfloat16 on
 * tensor cores from compute capability 8.0): rounded up to a power of two,
 * rows x in_features elements must fit 96 KB, and with ln_gamma / ln_beta (rows + 2) x in_features
 * 192 KB. 9 to 64 rows (tensor cores, decode_linear_mma.cu): float16 or bfloat16, compute capability
 * 9.0+ (thread-block clusters), in_features a multiple of 128 up to 8192 (4096 where it is not a
 * multiple of 256), and a block's staging at 64 features within 200 KB (decode_linear.h:
 * decode_linear_mma_bytes; 64 rows of 4096 fit, of 8192 do not).
 * bias [out_features], residual [rows, out_features] (may be out itself), ln_gamma /
 * ln_beta [in_features] (LayerNorm of each x row, eps, float32 statistics, rounded to the dtype):
 * each NULL where unused. activation: 0 none, 1 relu, 2 gelu (erf), 3 gelu (tanh), 4 silu.
 * x_norm_out [rows, in_features] or NULL: the LayerNorm's output (needs ln_gamma). out and x_norm_out
 * must not overlap x or each other. */
PADFREE_API padfree_status padfree_decode_linear(const void* x, const void* weight, const void* bias,
                                                const void* residual, const void* ln_gamma, const void* ln_beta,
                                                float eps, int32_t activation, int32_t rows, int32_t in_features,
                                                int32_t out_features, padfree_dtype dtype, void* out,
                                                void* x_norm_out, padfree_stream stream);

/* *streams = 1 where padfree_decode_linear, without activation or residual, streams this projection's
 * weight through shared memory by bulk copies onto tensor cores on the current device (a vocabulary-sized
 * output: 1-16 rows, out_features at least 32768 and a multiple of 16, in_features 512, 768 or 1024, up
 * to 8 rows also 1536 or 2048; float16 / bfloat16; compute capability 9.0+;
 * kernels/decoder/decode_linear_stream.cu), else 0: where it does, decode_linear is the faster kernel for
 * such a projection at any of those row counts; where not, a GEMM is. Launches nothing. */
PADFREE_API padfree_status padfree_decode_linear_streams(int32_t rows, int32_t in_features, int32_t out_features,
                                                        padfree_dtype dtype, int32_t* streams);

/* decode_linear for 1 to 16 rows of float16 / bfloat16 on tensor cores with the weight in fragment order
 * (kernels/decoder/decode_linear_fragments.cu; compute capability 8.0+): the same operation, arguments and
 * rules as padfree_decode_linear, with weight_fragments the output of padfree_decode_linear_fragment_layout
 * for its [out_features, in_features] weight. in_features one of 512, 768, 1024, 1536, 2048, 3072, 4096
 * (else PADFREE_ERROR_INVALID_ARGUMENT: use padfree_decode_linear), out_features a multiple of 16. It
 * streams the weights with one 16-byte load per 256 of them and one mma per 8 rows (decode_linear: CUDA
 * cores at 1-4 rows). */
PADFREE_API padfree_status padfree_decode_linear_fragments(const void* x, const void* weight_fragments,
                                                          const void* bias, const void* residual,
                                                          const void* ln_gamma, const void* ln_beta, float eps,
                                                          int32_t activation, int32_t rows, int32_t in_features,
                                                          int32_t out_features, padfree_dtype dtype, void* out,
                                                          void* x_norm_out, padfree_stream stream);

/* weight [out_features, in_features] (nn.Linear's layout, float16 / bfloat16, 16-byte aligned) -> out, the
 * same elements in mma.sync A-fragment order ([out / 16][in / 16][32 lanes][8]: lane (g, t) holds features
 * g, g + 8 at k = 2t, 2t + 1, 2t + 8, 2t + 9 of each 16 x 16 block), for padfree_decode_linear_fragments.
 * in_features a multiple of 128, out_features of 16; out must not overlap weight. Done once, at load. */
PADFREE_API padfree_status padfree_decode_linear_fragment_layout(const void* weight, int32_t out_features,
                                                                int32_t in_features, padfree_dtype dtype, void* out,
                                                                padfree_stream stream);

/* A decode step's linear layer for 1 to 256 rows on Hopper's wgmma with the LayerNorm folded into the
 * weight (kernels/decoder/decode_gemm.cu):
 *   out = act(y) + residual,  y = x W^T + bias                              (ln_colsum NULL)
 *                             y = rstd * (x W^T - mean * ln_colsum) + bias  (ln_colsum given)
 * mean and rstd: each x row's LayerNorm statistics (float32, eps). With W = W0 diag(gamma), ln_colsum =
 * W 1 and bias = b0 + W0 beta this is act(LN(x) W0^T + b0) + residual. x [rows, in_features], weight
 * [out_features, in_features], bias [out_features], residual [rows, out_features] (may be out itself),
 * out [rows, out_features]: float16 or bfloat16, 16-byte aligned; ln_colsum [out_features] float32.
 * in_features a multiple of 64 that 1, 2, 4 or 8 blocks split into slices of at most 512 (up to 4096),
 * out_features a multiple of 32; compute capability 9.0 with the library's sm_90a code (else
 * PADFREE_ERROR_UNSUPPORTED: use a GEMM). out must not overlap x. weight, bias and ln_colsum are read
 * before the kernel waits on the kernel before it (programmatic dependent launch): no kernel that may still
 * run when this one starts may write them (as for cross-attention's kv_mem). */
PADFREE_API padfree_status padfree_decode_gemm(const void* x, const void* weight, const void* bias,
                                              const void* residual, const float* ln_colsum, float eps,
                                              int32_t activation, int32_t rows, int32_t in_features,
                                              int32_t out_features, padfree_dtype dtype, void* out,
                                              padfree_stream stream);

/* A decode step's input rows (kernels/decoder/step_embedding.cu):
 *   out[r] = LN(round(round(word_emb[tokens[r]] * embed_scale) + positions[p(r)]))
 * rounded to the dtype after the multiply and the add (as HF's ops in the model dtype); the LayerNorm
 * (eps, float32 statistics) only where ln_gamma / ln_beta are given. p(r) = pad_position where
 * tokens[r] == pad_token (pad_token >= 0; -1: none), else *step + position_offset. tokens [rows] int64,
 * step a device int32; word_emb [vocab, hidden], positions [num_positions, hidden], out [rows,
 * hidden]: 16-byte aligned, hidden a multiple of 8 up to 8192. Ids and rows are clamped into their
 * tables (device values are not read here). */
PADFREE_API padfree_status padfree_decoder_step_embedding(const int64_t* tokens, const int32_t* step,
                                                         const void* word_emb, int32_t vocab, float embed_scale,
                                                         const void* positions, int32_t num_positions,
                                                         int32_t position_offset, int32_t pad_token,
                                                         int32_t pad_position, const void* ln_gamma,
                                                         const void* ln_beta, float eps, int32_t rows, int32_t hidden,
                                                         padfree_dtype dtype, void* out, padfree_stream stream);

/* ---- decoding: scores to hypotheses (kernels/decoding/) -------------------------------------- */

/* cache_indir, out: [rows, L] int32 (must not overlap); parents: [rows] int32; step: device int32.
 * out[r, t] = cache_indir[parents[r], t] for t < step, out[r, step] = parents[r]; positions past step
 * are not written. 16-byte aligned rows where L % 4 == 0 (then moved as vectors), else 4-byte. */
PADFREE_API padfree_status padfree_beam_reorder_cache_indir(const int32_t* cache_indir, const int32_t* parents,
                                                            const int32_t* step, int32_t rows, int32_t max_len,
                                                            int32_t* out, padfree_stream stream);

PADFREE_API padfree_status padfree_logits_topk_workspace_size(int32_t rows, int32_t vocab, int32_t k,
                                                              int64_t* bytes);

/* logits:      [rows, vocab] (rows <= 65535; any alignment of a row, the tensor 16-byte aligned)
 * bias:        [vocab] or NULL (Marian's final_logits_bias)
 * beam_scores: [rows] fp32 or NULL, added last
 * penalty_ids: [rows, num_penalty] int32, banned_ids: [rows, num_banned] int32 (-1 and ids outside
 *              [0, vocab) unused; num_penalty + num_banned <= 2048); forced_ids: [rows] int32 or NULL
 * step:        NULL, or a device int32 [1]: then banned_ids and forced_ids are tables over steps,
 *              [num_steps, rows, num_banned] and [num_steps, rows], read at row *step (clamped to
 *              [0, num_steps - 1]), so a captured decode step needs no gather of its step's lists
 * out_scores:  [rows, k] fp32, out_ids: [rows, k] int32: the k largest (1 <= k <= min(64, vocab))
 *              descending, ties to the smaller id, of
 *   s = log_softmax(logits + bias) (normalize = 1; s = logits + bias with 0), then HF's processors:
 *   repetition penalty (s < 0 ? s * p : s / p) at penalty_ids, -inf at banned_ids, and where
 *   0 <= forced_ids[r] < vocab, 0 at the forced id and -inf elsewhere; then s += beam_scores[r].
 * workspace:   at least padfree_logits_topk_workspace_size bytes, 16-byte aligned. */
PADFREE_API padfree_status padfree_logits_topk(const void* logits, const void* bias, const float* beam_scores,
                                               const int32_t* penalty_ids, int32_t num_penalty,
                                               float repetition_penalty, const int32_t* banned_ids,
                                               int32_t num_banned, const int32_t* forced_ids,
                                               const int32_t* step, int32_t num_steps, int32_t rows,
                                               int32_t vocab, int32_t k, int32_t normalize, void* workspace,
                                               int64_t workspace_bytes, padfree_dtype dtype, float* out_scores,
                                               int32_t* out_ids, padfree_stream stream);

/* Beam search's bookkeeping for one step, HF's rules (transformers 5 GenerationMixin._beam_search, its
 * CUDA arithmetic): one block per source. Inputs: cand_scores / cand_ids [batch * num_beams, keep] from
 * padfree_logits_topk (keep = HF's beams_to_keep, each row descending, the running score added).
 * State (updated in place): running, pool [batch, num_beams, max_length] int64 (positions past the
 * current length hold the fill value), running_scores, pool_scores [batch, num_beams] fp32,
 * pool_lengths [batch, num_beams] int64, pool_finished [batch, num_beams] and improvable [batch] flags
 * (0/1) of flag_bytes each (1: uint8, as torch.bool; 4: int32, as a TensorRT plugin carries them),
 * done [1] byte (sticky 0/1). Outputs: next_tokens [batch * num_beams] int64 (the token each
 * hypothesis feeds the next step), parents [batch * num_beams] int32 (the row it continues);
 * cache_indir [batch * num_beams, indir_len] int32 (indir_len >= max_length - 1) reordered in place
 * as padfree_beam_reorder_cache_indir would, or NULL. step: device int32 (the tokens so far minus
 * one), advanced by 1 when advance_step = 1 (after every block has read it). early_stopping: 0
 * False, 1 True, 2 "never". workspace: padfree_beam_search_workspace_size bytes (with indir_len 0
 * where cache_indir is NULL), 16-byte aligned, its 16 bytes at counters_offset zeroed before the
 * first step (the kernel leaves them zero). num_beams <= 16, num_beams <= keep <= 64. */
PADFREE_API padfree_status padfree_beam_search_workspace_size(int32_t batch, int32_t num_beams, int32_t max_length,
                                                             int32_t indir_len, int64_t* bytes,
                                                             int64_t* counters_offset);
PADFREE_API padfree_status padfree_beam_search_step(const float* cand_scores, const int32_t* cand_ids, int32_t keep,
                                                    const int32_t* eos_ids, int32_t num_eos, int64_t* running,
                                                    float* running_scores, int64_t* pool, float* pool_scores,
                                                    int64_t* pool_lengths, void* pool_finished, void* improvable,
                                                    int32_t flag_bytes, uint8_t* done, int64_t* next_tokens,
                                                    int32_t* parents, int32_t* cache_indir, int32_t indir_len,
                                                    int32_t* step, int32_t batch, int32_t num_beams,
                                                    int32_t max_length, float length_penalty,
                                                    int32_t early_stopping, int32_t advance_step, void* workspace,
                                                    int64_t workspace_bytes, padfree_stream stream);

/* Greedy search's bookkeeping for one step (HF's _sample without sampling): token = cand_ids[r] (the
 * top-1 of padfree_logits_topk), pad_token_id for rows already finished; sequences [rows, max_length]
 * int64 get it at position step + 1, next_tokens [rows] int64 too; a row emitting one of eos_ids
 * [num_eos] finishes (unfinished[r] = 0, generated[r] = step + 1) and done = no row unfinished
 * (num_eos 0: rows never finish, done untouched; done NULL: not reported). unfinished [rows]: flags of flag_bytes each (1 uint8,
 * 4 int32, as padfree_beam_search_step's). step advanced by 1 when advance_step = 1. */
PADFREE_API padfree_status padfree_greedy_step(const int32_t* cand_ids, const int32_t* eos_ids, int32_t num_eos,
                                               int64_t* sequences, int64_t* next_tokens, int64_t* generated,
                                               void* unfinished, int32_t flag_bytes, uint8_t* done, int32_t* step,
                                               int32_t rows,
                                               int32_t max_length, int64_t pad_token_id, int32_t advance_step,
                                               padfree_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PADFREE_H */
