/* Every library op on a CUDA context is capturable into a CUDA graph and
 * cheap to call (issue 15), checked on the emulated runtime (tests/emu),
 * which counts its calls (emu_runtime_counts.h):
 *   1. calls: after one warm-up call, a second call of the same op and shape
 *      makes no allocation, no synchronization, no device / function
 *      attribute query and no cudaSetDevice (cudaGetDevice, a host-only
 *      read of thread state, is printed but allowed); split-KV decode
 *      launches one kernel (the combine fused), two with the separate
 *      combine asked for;
 *   2. capture: the op captured on the context's stream
 *      (cudaStreamBeginCapture .. cudaGraphInstantiate), its graph replayed
 *      twice with new data written into the same input buffers in between,
 *      each replay's outputs bit-equal to an eager call's on the same data
 *      (same kernels, same order).
 * Ops: norm forward v0..v3 and backward v0..v3 (incl. the v3 shapes above
 * 48 KiB of shared memory), attention prefill v1..v5, split-KV decode with
 * forced splits (v1, v3, v5), paged decode (automatic and forced splits),
 * paged prefill (v1 by default, v8 preferred), fp8 prefill (v5 and its V^T pass),
 * an fp8 KV cache (paged decode on v1 and v6, automatic and forced splits;
 * paged prefill preferring v8: widened into the aux scratch first),
 * varlen (v3 on the emulated Hopper; given total_k v8, the TMA kernel, its
 * tensor maps cached), and the materialized baseline (dense, paged); and the refusals: an
 * op whose workspace would have to grow inside a capture, the baseline with
 * ragged lengths (it reads them back) during a capture.
 * Run: ctest -R test_op_runtime_calls_emu (label emu). */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <string.h>

#include "attention/attention_internal.h"
#include "emu_runtime_counts.h"
#include "fp_test.h"
#include "half.h" /* fp_f2e4m3: fp8 inputs */
#include "norm/norm_launch.h"

static fp_context *g_ctx;
/* argument "pdl": the context launches with programmatic dependent launch
 * (FP_CTX_LAUNCH_PDL 1): every launch of norm forward and of flash
 * attention (and its split-KV combine) must then carry the attribute, none
 * of the ops outside that set (norm backward, the materialized baseline),
 * with the counts above unchanged and replays still equal to eager calls
 * (the emulation also fails any such launch whose thread touches memory
 * before fp_pdl::enter: kernels/common/pdl.cuh) */
static int g_pdl;

/* A device buffer an op reads (refilled between replays unless fixed) or
 * writes (compared). */
typedef struct buf {
    void *d;
    size_t bytes;
    fp_dtype dtype; /* fill as values of this dtype; FP_F32 for f32 stats */
    int fixed;      /* int32 tables / offsets: never refilled */
} buf;

#define MAX_BUFS 12
typedef struct op {
    char name[96];
    fp_status (*run)(struct op *o, fp_stream s);
    buf in[MAX_BUFS], out[MAX_BUFS];
    int nin, nout;
    /* what run() needs */
    fp_norm_params nf;
    fp_norm_backward_params nb;
    fp_attention_params ap;
    int version, splits, attn_kernel;
    int launches; /* kernel launches one call must make (0: not checked) */
} op;

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    if (fp_mem_alloc(g_ctx, bytes, &p) != FP_OK) {
        fprintf(stderr, "fp_mem_alloc(%zu): %s\n", bytes, fp_last_error());
        exit(1);
    }
    return p;
}

static void *add_in(op *o, size_t n, fp_dtype dt) {
    buf *b = &o->in[o->nin++];
    b->bytes = n * fp_dtype_size(dt);
    b->dtype = dt;
    b->d = dev_alloc(b->bytes);
    return b->d;
}
static void *add_out(op *o, size_t n, fp_dtype dt) {
    buf *b = &o->out[o->nout++];
    b->bytes = n * fp_dtype_size(dt);
    b->dtype = dt;
    b->d = dev_alloc(b->bytes);
    return b->d;
}
static int32_t *add_table(op *o, const int32_t *h, size_t n) {
    buf *b = &o->in[o->nin++];
    b->bytes = n * sizeof(int32_t);
    b->fixed = 1;
    b->d = dev_alloc(b->bytes);
    CHECK_OK(fp_mem_upload(g_ctx, b->d, h, b->bytes, NULL));
    return b->d;
}

/* Values in [lo, hi) as dtype dt (16-bit: f32 rounded by truncation; the
 * test needs varied, finite data, not exact values). */
static void fill_bytes(void *h, size_t bytes, fp_dtype dt, uint64_t seed, float lo, float hi) {
    const size_t n = bytes / fp_dtype_size(dt);
    float *f = malloc(n * sizeof(float));
    fp_test_fill(f, n, seed, lo, hi);
    if (dt == FP_F32) {
        memcpy(h, f, bytes);
    } else if (dt == FP_FP8_E4M3) {
        uint8_t *u = h;
        for (size_t i = 0; i < n; ++i) u[i] = fp_f2e4m3(f[i]);
    } else {
        uint16_t *u = h;
        for (size_t i = 0; i < n; ++i) {
            if (dt == FP_BF16) {
                uint32_t w;
                memcpy(&w, &f[i], 4);
                u[i] = (uint16_t)(w >> 16);
            } else { /* f16: |x| < 2, no denormals needed: build from the f32 fields */
                uint32_t w;
                memcpy(&w, &f[i], 4);
                const uint32_t sign = (w >> 16) & 0x8000u;
                const int e = (int)((w >> 23) & 0xff) - 127 + 15;
                u[i] = (uint16_t)(e <= 0 ? sign : sign | (uint32_t)e << 10 | ((w >> 13) & 0x3ffu));
            }
        }
    }
    free(f);
}

static void refill_inputs(op *o, uint64_t seed) {
    for (int i = 0; i < o->nin; ++i) {
        buf *b = &o->in[i];
        if (b->fixed) continue;
        void *h = malloc(b->bytes);
        /* rstd must stay positive and moderate: f32 inputs of the norm
         * backward are mean / rstd, [0.5, 1.5) fits both */
        const int stats = b->dtype == FP_F32 && o->run != NULL && o->nb.rows > 0;
        fill_bytes(h, b->bytes, b->dtype, seed * 131 + (uint64_t)i, stats ? 0.5f : -1.0f, stats ? 1.5f : 1.0f);
        CHECK_OK(fp_mem_upload(g_ctx, b->d, h, b->bytes, NULL));
        free(h);
    }
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
}

static void poison_outputs(op *o) {
    for (int i = 0; i < o->nout; ++i) CHECK_OK(fp_mem_fill(g_ctx, o->out[i].d, 0x7f, o->out[i].bytes, NULL));
}

/* Host copies of the outputs (one allocation, freed by the caller). */
static unsigned char *download_outputs(op *o) {
    size_t total = 0;
    for (int i = 0; i < o->nout; ++i) total += o->out[i].bytes;
    unsigned char *h = malloc(total);
    size_t off = 0;
    for (int i = 0; i < o->nout; ++i) {
        CHECK_OK(fp_mem_download(g_ctx, h + off, o->out[i].d, o->out[i].bytes, NULL));
        off += o->out[i].bytes;
    }
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    return h;
}

/* ---- the ops ---- */

static fp_status run_norm_fwd(op *o, fp_stream s) { return fp_norm_forward_version(g_ctx, s, &o->nf, o->version); }
static fp_status run_norm_bwd(op *o, fp_stream s) { return fp_norm_backward_version(g_ctx, s, &o->nb, o->version); }
static fp_status run_attn(op *o, fp_stream s) {
    FP_TRY(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, o->attn_kernel));
    return fp_attention_forward(g_ctx, s, &o->ap);
}
static fp_status run_attn_baseline(op *o, fp_stream s) { return fp_attention_forward_baseline(g_ctx, s, &o->ap); }
/* A flash version with a forced split count (the internal entry tests use). */
static fp_status run_attn_splits(op *o, fp_stream s) {
    fp_attn_args a;
    FP_TRY(fp_attn_check(&o->ap, 1, &a));
    a.ctx = g_ctx;
    return fp_attn_cuda_flash_version(&a, o->version, o->splits,
                                      s ? (cudaStream_t)s : (cudaStream_t)fp_context_stream(g_ctx));
}

static void norm_fwd_op(op *o, int version, fp_norm_kind kind, fp_dtype dt, int64_t rows, int64_t cols) {
    snprintf(o->name, sizeof o->name, "norm fwd v%d %s %s %lldx%lld", version, kind == FP_NORM_LAYERNORM ? "ln" : "rms",
             fp_dtype_name(dt), (long long)rows, (long long)cols);
    o->run = run_norm_fwd;
    o->version = version;
    fp_norm_params_default(&o->nf);
    fp_norm_params *p = &o->nf;
    p->kind = kind;
    p->rows = rows;
    p->cols = cols;
    p->x_dtype = p->residual_dtype = p->out_dtype = p->param_dtype = dt;
    const size_t n = (size_t)(rows * cols);
    p->x = add_in(o, n, dt);
    p->residual = add_in(o, n, dt);
    p->gamma = add_in(o, (size_t)cols, dt);
    p->beta = kind == FP_NORM_LAYERNORM ? add_in(o, (size_t)cols, dt) : NULL;
    p->out = add_out(o, n, dt);
    p->residual_out = add_out(o, n, dt);
    p->rstd = add_out(o, (size_t)rows, FP_F32);
    if (kind == FP_NORM_LAYERNORM) p->mean = add_out(o, (size_t)rows, FP_F32);
}

static void norm_bwd_op(op *o, int version, fp_dtype dt, int64_t rows, int64_t cols) {
    snprintf(o->name, sizeof o->name, "norm bwd v%d%s ln %s %lldx%lld", version & FP_NORM_VERSION_MASK,
             version & FP_NORM_VOPT_FUSED_REDUCE ? " fused reduce" : "", fp_dtype_name(dt), (long long)rows,
             (long long)cols);
    o->run = run_norm_bwd;
    o->version = version;
    fp_norm_backward_params_default(&o->nb);
    fp_norm_backward_params *p = &o->nb;
    p->kind = FP_NORM_LAYERNORM;
    p->rows = rows;
    p->cols = cols;
    p->dtype = p->param_dtype = dt;
    const size_t n = (size_t)(rows * cols);
    p->dout = add_in(o, n, dt);
    p->x = add_in(o, n, dt);
    p->gamma = add_in(o, (size_t)cols, dt);
    p->mean = add_in(o, (size_t)rows, FP_F32);
    p->rstd = add_in(o, (size_t)rows, FP_F32);
    p->dx = add_out(o, n, dt);
    p->dgamma = add_out(o, (size_t)cols, dt);
    p->dbeta = add_out(o, (size_t)cols, dt);
}

/* bf16, head_dim 64, packed Q/K/V/O. */
static void attn_op(op *o, const char *what, int batch, int sq, int sk, int hq, int hkv, int causal) {
    snprintf(o->name, sizeof o->name, "%s b%d sq%d sk%d h%d/%d", what, batch, sq, sk, hq, hkv);
    fp_attention_params_default(&o->ap);
    fp_attention_params *p = &o->ap;
    p->batch = batch;
    p->seqlen_q = sq;
    p->seqlen_k = sk;
    p->heads_q = hq;
    p->heads_kv = hkv;
    p->head_dim = 64;
    p->dtype = FP_BF16;
    p->causal = causal;
    p->q = add_in(o, (size_t)batch * sq * hq * 64, FP_BF16);
    p->k = add_in(o, (size_t)batch * sk * hkv * 64, FP_BF16);
    p->v = add_in(o, (size_t)batch * sk * hkv * 64, FP_BF16);
    p->o = add_out(o, (size_t)batch * sq * hq * 64, FP_BF16);
    p->lse = add_out(o, (size_t)batch * hq * sq, FP_F32);
}

/* K / V as a paged cache: 2 sequences of up to sk keys in pages of 64,
 * their pages in reverse order; K / V in kv (bf16, or e4m3: an fp8 cache). */
static void make_paged_kv(op *o, int sk, fp_dtype kv) {
    fp_attention_params *p = &o->ap;
    const int per = (sk + 63) / 64, pages = 2 * per;
    int32_t table[64];
    for (int i = 0; i < pages; ++i) table[i] = pages - 1 - i;
    p->block_table = add_table(o, table, (size_t)pages);
    p->block_table_stride = per;
    p->page_size = 64;
    p->num_pages = pages;
    p->k = add_in(o, (size_t)pages * 64 * p->heads_kv * 64, kv);
    p->v = add_in(o, (size_t)pages * 64 * p->heads_kv * 64, kv);
    o->in[1].fixed = o->in[2].fixed = 1; /* the dense K / V attn_op made: unused */
}
static void make_paged(op *o, int sk) { make_paged_kv(o, sk, FP_BF16); }

static void with_seqlens(op *o, int32_t l0, int32_t l1) {
    const int32_t lens[2] = {l0, l1};
    o->ap.seqlens_k = add_table(o, lens, 2);
}

/* ---- the checks ---- */

/* 1: a warmed-up call makes none of the counted calls. */
static void check_calls(op *o) {
    refill_inputs(o, 1);
    fp_status st = o->run(o, NULL); /* warm-up: may size caches, workspaces */
    CHECK_MSG(st == FP_OK, "%s: warm-up: %s", o->name, fp_last_error());
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    fp_emu_runtime_counts c;
    fp_emu_runtime_counts_reset();
    st = o->run(o, NULL);
    fp_emu_runtime_counts_get(&c);
    CHECK_MSG(st == FP_OK, "%s: %s", o->name, fp_last_error());
    printf("%-44s alloc %lld  sync %lld  query %lld  set_device %lld  launches %lld (pdl %lld)  (get_device %lld)\n",
           o->name, c.n[FP_EMU_CALL_ALLOC], c.n[FP_EMU_CALL_SYNC], c.n[FP_EMU_CALL_QUERY],
           c.n[FP_EMU_CALL_SET_DEVICE], c.n[FP_EMU_CALL_LAUNCH], c.n[FP_EMU_CALL_LAUNCH_PDL],
           c.n[FP_EMU_CALL_GET_DEVICE]);
    const int pdl_op = o->run == run_norm_fwd || o->run == run_attn || o->run == run_attn_splits;
    const long long want_pdl = g_pdl && pdl_op ? c.n[FP_EMU_CALL_LAUNCH] : 0;
    CHECK_MSG(c.n[FP_EMU_CALL_LAUNCH] > 0, "%s: no kernel launched", o->name);
    CHECK_MSG(c.n[FP_EMU_CALL_LAUNCH_PDL] == want_pdl, "%s: %lld of %lld launches with programmatic dependent launch, "
              "expected %lld", o->name, c.n[FP_EMU_CALL_LAUNCH_PDL], c.n[FP_EMU_CALL_LAUNCH], want_pdl);
    /* each launch is ~3 us of host time on a GPU: split-KV decode with v1
     * combines in its split kernel (one launch, FP_CTX_ATTENTION_SPLIT_COMBINE 0) */
    if (o->launches)
        CHECK_MSG(c.n[FP_EMU_CALL_LAUNCH] == o->launches, "%s: %lld kernel launches per call, expected %d", o->name,
                  c.n[FP_EMU_CALL_LAUNCH], o->launches);
    CHECK_MSG(c.n[FP_EMU_CALL_ALLOC] == 0, "%s: %lld allocation calls per call", o->name, c.n[FP_EMU_CALL_ALLOC]);
    CHECK_MSG(c.n[FP_EMU_CALL_SYNC] == 0, "%s: %lld synchronizations per call", o->name, c.n[FP_EMU_CALL_SYNC]);
    CHECK_MSG(c.n[FP_EMU_CALL_QUERY] == 0, "%s: %lld device / attribute queries per call", o->name,
              c.n[FP_EMU_CALL_QUERY]);
    CHECK_MSG(c.n[FP_EMU_CALL_SET_DEVICE] == 0, "%s: %lld cudaSetDevice per call", o->name,
              c.n[FP_EMU_CALL_SET_DEVICE]);
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
}

/* 2: captured, replayed on new data, equal to eager. */
static void check_capture(op *o) {
    cudaStream_t s = (cudaStream_t)fp_context_stream(g_ctx);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    fp_status st = o->run(o, NULL);
    cudaError_t ce = cudaStreamEndCapture(s, &graph);
    CHECK_MSG(st == FP_OK, "%s: during capture: %s", o->name, fp_last_error());
    CHECK_MSG(ce == cudaSuccess, "%s: cudaStreamEndCapture: %d", o->name, (int)ce);
    if (st != FP_OK || ce != cudaSuccess) {
        (void)cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        return;
    }
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    for (int rep = 0; rep < 2; ++rep) {
        refill_inputs(o, 100 + (uint64_t)rep);
        poison_outputs(o);
        CHECK(cudaGraphLaunch(exec, s) == cudaSuccess);
        unsigned char *got = download_outputs(o);
        poison_outputs(o);
        CHECK_OK(o->run(o, NULL));
        unsigned char *want = download_outputs(o);
        size_t off = 0;
        for (int i = 0; i < o->nout; ++i) {
            const size_t at = off;
            off += o->out[i].bytes;
            size_t bad = 0, first = 0;
            for (size_t j = at; j < off; ++j)
                if (got[j] != want[j] && bad++ == 0) first = j - at;
            CHECK_MSG(bad == 0, "%s: replay %d, output %d: %zu bytes differ from eager (first at byte %zu)", o->name,
                      rep, i, bad, first);
        }
        free(got);
        free(want);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

/* An op whose scratch the capturing stream's workspace cannot hold (never
 * run on that stream) refuses with FP_ERR_UNSUPPORTED and a message saying
 * what to do, instead of allocating inside the capture; the same op then
 * runs eagerly on that stream, and captures there afterwards. */
static void check_capture_cold(op *o, cudaStream_t s) {
    refill_inputs(o, 7);
    cudaGraph_t graph = NULL;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    const fp_status st = o->run(o, (fp_stream)s);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    if (graph) cudaGraphDestroy(graph);
    CHECK_MSG(st == FP_ERR_UNSUPPORTED, "%s: capture on a cold stream returned '%s'", o->name, fp_status_string(st));
    CHECK_MSG(strstr(fp_last_error(), "before capturing") != NULL, "%s: message: %s", o->name, fp_last_error());
    CHECK_OK(o->run(o, (fp_stream)s));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK_OK(o->run(o, (fp_stream)s));
    graph = NULL;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    if (graph) cudaGraphDestroy(graph);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
}

/* A causal paged prefill (2 x 150 queries over 256 keys, 4 / 2 heads)
 * over an fp8 cache with descales, preferring v8 (widened first). */
static void kv8_prefill_op(op *o, const char *what) {
    memset(o, 0, sizeof *o);
    attn_op(o, what, 2, 150, 256, 4, 2, 1);
    make_paged_kv(o, 256, FP_FP8_E4M3);
    o->ap.kv_dtype = FP_FP8_E4M3;
    o->ap.k_descale = 0.5f;
    o->ap.v_descale = 2.0f;
    o->run = run_attn;
    o->attn_kernel = 8;
}

static void free_op(op *o) {
    for (int i = 0; i < o->nin; ++i) fp_mem_free(g_ctx, o->in[i].d);
    for (int i = 0; i < o->nout; ++i) fp_mem_free(g_ctx, o->out[i].d);
}

static void check_op(op *o) {
    check_calls(o);
    check_capture(o);
    free_op(o);
}

int main(int argc, char **argv) {
    g_ctx = fp_test_cuda_context_or_skip();
    g_pdl = argc > 1 && strcmp(argv[1], "pdl") == 0;
    CHECK_STATUS(fp_context_set_option(g_ctx, FP_CTX_LAUNCH_PDL, 2), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "FP_CTX_LAUNCH_PDL") != NULL);
    CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_LAUNCH_PDL, g_pdl ? 1 : -1));
    op o;

    /* norm forward: each version; v3 at 32768 bf16 cols stages 64 KiB (opt-in) */
    for (int v = 0; v <= 3; ++v) {
        memset(&o, 0, sizeof o);
        norm_fwd_op(&o, v, FP_NORM_RMSNORM, FP_BF16, 4, 1024);
        check_op(&o);
    }
    memset(&o, 0, sizeof o);
    norm_fwd_op(&o, 3, FP_NORM_LAYERNORM, FP_BF16, 2, 32768);
    check_op(&o);

    /* norm backward with dgamma / dbeta (partial sums in scratch); v3 at
     * 16384 f32 cols needs the shared-memory opt-in */
    for (int v = 0; v <= 3; ++v) {
        memset(&o, 0, sizeof o);
        norm_bwd_op(&o, v, FP_BF16, 8, 1024);
        check_op(&o);
    }
    memset(&o, 0, sizeof o);
    norm_bwd_op(&o, 3, FP_F32, 4, 16384);
    check_op(&o);
    /* v3 / v4 with the fused reduce: the stream's arrival counters, reset by
     * the kernel itself (replays included) */
    for (int v = 3; v <= 4; ++v) {
        memset(&o, 0, sizeof o);
        norm_bwd_op(&o, v | FP_NORM_VOPT_FUSED_REDUCE, FP_BF16, 300, 1024);
        check_op(&o);
    }

    /* attention prefill, each preferred version (v3..v5: >= 128 rows per KV
     * head; v6, the decode kernel, refuses 256 rows: the default runs;
     * v10 takes head_dim 64 only) */
    for (int v = 1; v <= 10; ++v) {
        memset(&o, 0, sizeof o);
        char what[32];
        snprintf(what, sizeof what, "attention v%d", v);
        attn_op(&o, what, 1, 128, 128, 2, 1, 1);
        o.run = run_attn;
        o.attn_kernel = v;
        check_op(&o);
    }
    fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0);

    /* split-KV with forced splits: v1 decode (ragged lengths), v3 / v5 prefill */
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention v1 decode 4 splits", 2, 1, 256, 4, 2, 0);
    with_seqlens(&o, 256, 100);
    o.run = run_attn_splits;
    o.version = 1;
    o.splits = 4;
    o.launches = 1; /* the combine fused into the split kernel */
    check_op(&o);
    /* the same with the separate combine kernel (FP_CTX_ATTENTION_SPLIT_COMBINE 1) */
    CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 1));
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention v1 decode 4 splits, separate combine", 2, 1, 256, 4, 2, 0);
    with_seqlens(&o, 256, 100);
    o.run = run_attn_splits;
    o.version = 1;
    o.splits = 4;
    o.launches = 2;
    check_op(&o);
    CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 0));
    CHECK_STATUS(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 2), FP_ERR_INVALID_ARGUMENT);
    static const int kSplitVersions[] = {3, 5, 8, 9};
    for (int vi = 0; vi < 4; ++vi) {
        const int v = kSplitVersions[vi];
        memset(&o, 0, sizeof o);
        char what[48];
        snprintf(what, sizeof what, "attention v%d prefill 2 splits", v);
        attn_op(&o, what, 1, 128, 128, 2, 1, 0);
        o.run = run_attn_splits;
        o.version = v;
        o.splits = 2;
        check_op(&o);
    }

    /* (both streams live to the end: a new stream may reuse a destroyed
     * one's handle, and with it that stream's workspace) */
    cudaStream_t cold[2] = {NULL, NULL};
    for (int i = 0; i < 2; ++i) CHECK(cudaStreamCreateWithFlags(&cold[i], cudaStreamNonBlocking) == cudaSuccess);
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention v1 decode 4 splits, cold stream", 2, 1, 256, 4, 2, 0);
    o.run = run_attn_splits;
    o.version = 1;
    o.splits = 4;
    check_capture_cold(&o, cold[0]);
    free_op(&o);
    memset(&o, 0, sizeof o);
    norm_bwd_op(&o, 3, FP_BF16, 8, 1024);
    check_capture_cold(&o, cold[1]);
    free_op(&o);

    /* decode: automatic splits (long keys, few rows) */
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention decode auto", 1, 1, 1024, 2, 1, 0);
    o.run = run_attn;
    o.launches = 1;
    check_op(&o);

    /* the decode kernel (FP_CTX_ATTENTION_KERNEL 6): automatic splits, the
     * combine fused; dense and paged */
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention v6 decode auto", 1, 1, 1024, 8, 2, 0);
    o.run = run_attn;
    o.attn_kernel = 6;
    o.launches = 1;
    check_op(&o);
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention v6 paged decode auto", 2, 1, 256, 4, 2, 0);
    make_paged(&o, 256);
    with_seqlens(&o, 256, 150);
    o.run = run_attn;
    o.attn_kernel = 6;
    o.launches = 1;
    check_op(&o);
    fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0);

    /* paged decode: automatic and forced splits */
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention paged decode auto", 2, 1, 256, 4, 2, 0);
    make_paged(&o, 256);
    with_seqlens(&o, 256, 150);
    o.run = run_attn;
    check_op(&o);
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention paged decode 3 splits", 2, 1, 256, 4, 2, 0);
    make_paged(&o, 256);
    with_seqlens(&o, 200, 256);
    o.run = run_attn_splits;
    o.version = 1;
    o.splits = 3;
    o.launches = 1;
    check_op(&o);

    /* paged prefill preferring v8 (the TMA kernel on the page pool: its
     * tensor maps cached, the block table read by the kernel; 12 CTAs on
     * the emulated H100's 132 SMs take 2 splits: the kernel and the
     * combine), no allocation, sync or query per call; and the default
     * (the Hopper default takes the paged call: v10 at head_dim 64) */
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention v8 paged prefill", 2, 150, 256, 4, 2, 1);
    make_paged(&o, 256);
    with_seqlens(&o, 256, 150);
    o.run = run_attn;
    o.attn_kernel = 8;
    o.launches = 2;
    check_op(&o);
    {
        fp_attention_kernel_info k;
        CHECK(fp_attention_last_kernel(&k) == FP_OK && k.version == 8 && k.paged == 1 && k.num_splits == 2 &&
              !k.fallback[0]);
    }
    fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0);
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention paged prefill default", 2, 150, 256, 4, 2, 1);
    make_paged(&o, 256);
    o.run = run_attn;
    check_op(&o);
    {
        fp_attention_kernel_info k;
        CHECK_MSG(fp_attention_last_kernel(&k) == FP_OK && k.version == 10 && k.paged == 1, "paged default ran %s",
                  k.kernel);
    }

    /* fp8 (e4m3) prefill at head_dim 128 with descales: v5 on the emulated
     * Hopper, V^T into the stream's workspace first (2 launches: the
     * transpose and the kernel), its tensor maps cached: no allocation,
     * sync or query per call */
    memset(&o, 0, sizeof o);
    {
        fp_attention_params *p = &o.ap;
        const int b = 2, sq = 150, sk = 256, hq = 4, hkv = 2, d = 128;
        snprintf(o.name, sizeof o.name, "attention fp8 prefill b%d sq%d sk%d h%d/%d", b, sq, sk, hq, hkv);
        fp_attention_params_default(p);
        p->batch = b; p->seqlen_q = sq; p->seqlen_k = sk; p->heads_q = hq; p->heads_kv = hkv; p->head_dim = d;
        p->dtype = FP_FP8_E4M3;
        p->causal = 1;
        p->q_descale = 0.5f; p->k_descale = 0.25f; p->v_descale = 2.0f;
        p->q = add_in(&o, (size_t)b * sq * hq * d, FP_FP8_E4M3);
        p->k = add_in(&o, (size_t)b * sk * hkv * d, FP_FP8_E4M3);
        p->v = add_in(&o, (size_t)b * sk * hkv * d, FP_FP8_E4M3);
        p->o = add_out(&o, (size_t)b * sq * hq * d, FP_BF16);
        p->lse = add_out(&o, (size_t)b * hq * sq, FP_F32);
    }
    o.run = run_attn;
    o.launches = 2;
    check_op(&o);
    {
        fp_attention_kernel_info k;
        CHECK(fp_attention_last_kernel(&k) == FP_OK && k.version == 5 && k.num_splits == 1 && !k.fallback[0]);
    }

    /* an fp8 KV cache (kv_dtype e4m3 under bf16 Q, descales): paged decode
     * on v1 with split-KV and the fused combine (one launch), the e4m3
     * tiles widened in shared memory: no allocation, sync or query per
     * call; and forced splits */
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention kv8 paged decode auto", 2, 1, 256, 4, 2, 0);
    make_paged_kv(&o, 256, FP_FP8_E4M3);
    with_seqlens(&o, 256, 150);
    o.ap.kv_dtype = FP_FP8_E4M3;
    o.ap.k_descale = 0.5f;
    o.ap.v_descale = 2.0f;
    o.run = run_attn;
    o.launches = 1;
    check_op(&o);
    {
        fp_attention_kernel_info k;
        CHECK(fp_attention_last_kernel(&k) == FP_OK && k.version == 1 && k.paged == 1 && k.num_splits > 1);
    }
    /* the same preferring the decode kernel v6 (each warp widening its own keys) */
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention kv8 v6 paged decode auto", 2, 1, 256, 4, 2, 0);
    make_paged_kv(&o, 256, FP_FP8_E4M3);
    with_seqlens(&o, 256, 150);
    o.ap.kv_dtype = FP_FP8_E4M3;
    o.ap.v_descale = 0.5f;
    o.run = run_attn;
    o.attn_kernel = 6;
    o.launches = 1;
    check_op(&o);
    {
        fp_attention_kernel_info k;
        CHECK(fp_attention_last_kernel(&k) == FP_OK && k.version == 6 && k.paged == 1 && !k.fallback[0]);
    }
    /* a paged prefill over an fp8 cache preferring v8: the cache widened
     * into the stream's aux scratch (attention_kv8_widen_v0), then v8 on
     * the dense copy with 2 splits (3 launches: the widening, the kernel,
     * the combine); no allocation, sync or query per call */
    kv8_prefill_op(&o, "attention kv8 v8 paged prefill");
    with_seqlens(&o, 256, 150);
    o.launches = 3;
    check_op(&o);
    {
        fp_attention_kernel_info k;
        CHECK(fp_attention_last_kernel(&k) == FP_OK && k.version == 8 && k.paged == 1 && k.num_splits == 2 &&
              !k.fallback[0]);
    }
    /* ... on a stream whose aux scratch has never held the widened copy:
     * refused during a capture (it cannot grow there), then run eagerly,
     * then captured */
    {
        cudaStream_t cold_kv8 = NULL;
        CHECK(cudaStreamCreateWithFlags(&cold_kv8, cudaStreamNonBlocking) == cudaSuccess);
        kv8_prefill_op(&o, "attention kv8 v8 paged prefill, cold stream");
        check_capture_cold(&o, cold_kv8);
        free_op(&o);
        CHECK(cudaStreamDestroy(cold_kv8) == cudaSuccess);
    }
    fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0);
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention kv8 decode 3 splits", 2, 1, 256, 4, 2, 0);
    o.in[1].fixed = o.in[2].fixed = 1; /* the bf16 K / V attn_op made: unused */
    o.ap.k = add_in(&o, (size_t)2 * 256 * 2 * 64, FP_FP8_E4M3);
    o.ap.v = add_in(&o, (size_t)2 * 256 * 2 * 64, FP_FP8_E4M3);
    o.ap.kv_dtype = FP_FP8_E4M3;
    o.run = run_attn_splits;
    o.version = 1;
    o.splits = 3;
    o.launches = 1;
    check_op(&o);

    /* varlen: two packed sequences of 40 and 60 rows */
    memset(&o, 0, sizeof o);
    attn_op(&o, "attention varlen", 1, 100, 100, 2, 1, 1);
    {
        const int32_t cu[3] = {0, 40, 100};
        o.ap.batch = 2;
        o.ap.seqlen_q = o.ap.seqlen_k = 64;
        o.ap.cu_seqlens_q = add_table(&o, cu, 3);
        o.ap.cu_seqlens_k = add_table(&o, cu, 3);
        o.ap.lse = NULL;
        o.nout = 1;
    }
    o.run = run_attn;
    check_op(&o);
    {
        fp_attention_kernel_info k;
        CHECK(fp_attention_last_kernel(&k) == FP_OK && k.version == 3); /* Hopper, no total_k: v3 */
    }
    /* the same given total_k (the packed K / V rows): Hopper's TMA kernel,
     * v10 at head_dim 64 (its tensor maps encoded once, then cached) */
    {
        const fp_attention_params prev = o.ap;
        const int32_t cu[3] = {0, 40, 100};
        memset(&o, 0, sizeof o);
        attn_op(&o, "attention varlen total_k", 1, 100, 100, 2, 1, 1);
        o.ap.batch = prev.batch;
        o.ap.seqlen_q = o.ap.seqlen_k = prev.seqlen_q;
        o.ap.cu_seqlens_q = add_table(&o, cu, 3);
        o.ap.cu_seqlens_k = add_table(&o, cu, 3);
        o.ap.lse = NULL;
        o.ap.total_k = 100;
        o.nout = 1;
    }
    o.run = run_attn;
    check_op(&o);
    {
        fp_attention_kernel_info k;
        CHECK_MSG(fp_attention_last_kernel(&k) == FP_OK && k.version == 10, "varlen given total_k ran %s", k.kernel);
    }

    /* the materialized baseline: dense, paged */
    memset(&o, 0, sizeof o);
    attn_op(&o, "baseline", 1, 64, 96, 2, 1, 1);
    o.run = run_attn_baseline;
    check_op(&o);
    memset(&o, 0, sizeof o);
    attn_op(&o, "baseline paged", 2, 4, 128, 2, 1, 0);
    make_paged(&o, 128);
    o.run = run_attn_baseline;
    check_op(&o);

    /* the one op that is not capturable: the baseline reads ragged lengths
     * back; it refuses during a capture instead of breaking it */
    memset(&o, 0, sizeof o);
    attn_op(&o, "baseline ragged", 2, 1, 128, 2, 1, 0);
    with_seqlens(&o, 128, 60);
    refill_inputs(&o, 3);
    CHECK_OK(fp_attention_forward_baseline(g_ctx, NULL, &o.ap));
    {
        cudaStream_t s = (cudaStream_t)fp_context_stream(g_ctx);
        cudaGraph_t graph = NULL;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
        CHECK_STATUS(fp_attention_forward_baseline(g_ctx, NULL, &o.ap), FP_ERR_UNSUPPORTED);
        CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
        if (graph) cudaGraphDestroy(graph);
    }
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    free_op(&o);

    fp_context_destroy(g_ctx);
    for (int i = 0; i < 2; ++i) cudaStreamDestroy(cold[i]);
    TEST_END();
}
