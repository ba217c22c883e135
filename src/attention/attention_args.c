/* Attention argument checking: every rule of the header's error list, each
 * failure naming the argument, and resolution of the defaults (packed
 * strides, scale, causal as window_right = 0). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention/attention_internal.h"

/* struct_size of the 0.1 layout, which ended at cu_seqlens_k. */
#define FP_ATTN_PARAMS_V1_SIZE (offsetof(fp_attention_params, cu_seqlens_k) + sizeof(const int32_t *))

/* 0.4's fields start where 0.3's layout ended (struct_size.c's rule: an
 * older caller's struct never covers part of a newer field). */
_Static_assert(offsetof(fp_attention_params, q_descale) ==
                   offsetof(fp_attention_params, total_k) + sizeof(int64_t),
               "fp_attention_params: the 0.4 fields must follow 0.3's last field");

/* 0.4's sizeof: its fields end at v_descale, the struct at the next size_t
 * boundary; 0.5's kv_dtype starts there (after the named pad). */
#define FP_ATTN_PARAMS_V04_SIZE                                                                          \
    ((offsetof(fp_attention_params, v_descale) + sizeof(float) + _Alignof(size_t) - 1) /                  \
     _Alignof(size_t) * _Alignof(size_t))
_Static_assert(offsetof(fp_attention_params, kv_dtype) == FP_ATTN_PARAMS_V04_SIZE,
               "fp_attention_params: the 0.5 field must start at 0.4's sizeof");

fp_status fp_attention_params_init(fp_attention_params *p, size_t struct_size) {
    FP_CHECK_NOT_NULL(p);
    FP_TRY(fp_struct_size_check(struct_size, FP_ATTN_PARAMS_V1_SIZE, sizeof *p, "fp_attention_params"));
    /* every field set below lies in the 0.1 prefix */
    memset(p, 0, struct_size);
    p->struct_size = struct_size;
    p->dtype = FP_BF16;
    p->window_left = -1;
    p->window_right = -1;
    return FP_OK;
}

/* The symbol that programs built against 0.1 call with a 0.1-sized struct
 * (the header now maps the name to fp_attention_params_init(p, sizeof *p)):
 * writing this version's size would run 24 bytes past their struct, and the
 * struct_size it set would make fp_attn_check read those bytes back. */
void(fp_attention_params_default)(fp_attention_params *p) {
    if (p) (void)fp_attention_params_init(p, FP_ATTN_PARAMS_V1_SIZE);
}

/* Largest element extent a tensor may span (bytes fit in int64 for any dtype). */
#define FP_ATTN_MAX_SPAN (INT64_MAX / 16)

/* Rows of head_dim contiguous elements at b*bs + s*ss + h*hs must not
 * overlap: sorted by stride (extent-1 dimensions ignored), every stride must
 * step over the whole span of the dimensions inside it. ns < 0: a packed
 * varlen sequence dimension whose length the host cannot read (offsets in
 * device memory): it must then be the outermost dimension, which no length
 * can make overlap. */
static fp_status check_strides(const char *name, int64_t bs, int64_t ss, int64_t hs, int64_t nb,
                               int64_t ns, int64_t nh, int d) {
    if (bs < 0 || ss < 0 || hs < 0)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "%s strides (batch %lld, seq %lld, head %lld) must be >= 0", name,
                            (long long)bs, (long long)ss, (long long)hs);
    if (ns < 0) {
        if ((nh > 1 && ss < hs) || (nb > 1 && ss < bs))
            return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                                "%s strides (batch %lld, seq %lld, head %lld): with cu_seqlens on a "
                                "CUDA context the sequence stride must be the outermost (the packed "
                                "length is in device memory, so no other layout can be checked)",
                                name, (long long)bs, (long long)ss, (long long)hs);
        ns = 2; /* outermost: only its step over the inner span matters */
    }
    int64_t st[3] = {bs, ss, hs};
    int64_t ex[3] = {nb, ns, nh};
    int n = 0;
    int64_t s2[3], e2[3];
    for (int i = 0; i < 3; ++i)
        if (ex[i] > 1) { s2[n] = st[i]; e2[n] = ex[i]; ++n; }
    for (int i = 1; i < n; ++i) /* insertion sort by stride */
        for (int j = i; j > 0 && s2[j] < s2[j - 1]; --j) {
            int64_t t = s2[j]; s2[j] = s2[j - 1]; s2[j - 1] = t;
            t = e2[j]; e2[j] = e2[j - 1]; e2[j - 1] = t;
        }
    int64_t span = d; /* elements covered by the dimensions inside */
    for (int i = 0; i < n; ++i) {
        if (s2[i] < span)
            return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                                "%s strides (batch %lld, seq %lld, head %lld) make rows of "
                                "head_dim %d contiguous elements overlap",
                                name, (long long)bs, (long long)ss, (long long)hs, d);
        /* The extent in elements must stay far from int64 overflow: every
         * implementation computes b*bs + s*ss + h*hs (+ d) and then a byte
         * offset from it. */
        if (s2[i] > (FP_ATTN_MAX_SPAN - span) / (e2[i] - 1))
            return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                                "%s strides (batch %lld, seq %lld, head %lld) are too large: the "
                                "tensor's extent overflows",
                                name, (long long)bs, (long long)ss, (long long)hs);
        span = s2[i] * (e2[i] - 1) + span;
    }
    return FP_OK;
}

static fp_status check_align(const char *name, const void *ptr, int64_t bs, int64_t ss, int64_t hs,
                             size_t elt, int cuda) {
    size_t align = cuda ? 16 : elt;
    if ((uintptr_t)ptr % align)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "argument '%s' (%p) is not %zu-byte aligned%s", name, ptr, align,
                            cuda ? " (the CUDA path loads 16-byte vectors)" : "");
    if (cuda) {
        int64_t v = (int64_t)(16 / elt);
        if (bs % v || ss % v || hs % v)
            return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                                "%s strides (batch %lld, seq %lld, head %lld) must be multiples of "
                                "%lld elements (16 bytes) on the CUDA path",
                                name, (long long)bs, (long long)ss, (long long)hs, (long long)v);
    }
    return FP_OK;
}

#define RESOLVE(x, def) ((x) ? (x) : (def))

void fp_attn_params_upgrade(const fp_attention_params *user, fp_attention_params *full) {
    /* An older caller's struct is a prefix: the fields it lacks read as 0. */
    memset(full, 0, sizeof *full);
    size_t n = user->struct_size < sizeof *full ? user->struct_size : sizeof *full;
    memcpy(full, user, n);
    full->struct_size = sizeof *full;
}

fp_status fp_attn_check(const fp_attention_params *user, int cuda, fp_attn_args *a) {
    FP_CHECK_ARG(user != NULL, "argument 'params' is NULL");
    FP_TRY(fp_struct_size_check(user->struct_size, FP_ATTN_PARAMS_V1_SIZE, sizeof *user, "fp_attention_params (params)"));
    fp_attention_params full;
    fp_attn_params_upgrade(user, &full);
    const fp_attention_params *p = &full;
    FP_CHECK_ARG(p->batch > 0, "argument 'batch' must be > 0 (got %d)", p->batch);
    FP_CHECK_ARG(p->seqlen_q > 0, "argument 'seqlen_q' must be > 0 (got %d)", p->seqlen_q);
    FP_CHECK_ARG(p->seqlen_k > 0, "argument 'seqlen_k' must be > 0 (got %d)", p->seqlen_k);
    FP_CHECK_ARG(p->heads_q > 0, "argument 'heads_q' must be > 0 (got %d)", p->heads_q);
    FP_CHECK_ARG(p->heads_kv > 0, "argument 'heads_kv' must be > 0 (got %d)", p->heads_kv);
    FP_CHECK_ARG(p->heads_q % p->heads_kv == 0,
                 "argument 'heads_q' (%d) must be a multiple of 'heads_kv' (%d)", p->heads_q,
                 p->heads_kv);
    FP_CHECK_ARG(p->head_dim >= 8 && p->head_dim <= 256 && p->head_dim % 8 == 0,
                 "argument 'head_dim' (%d) is unsupported: a multiple of 8 in [8, 256] is required",
                 p->head_dim);
    FP_CHECK_ARG(p->dtype == FP_F32 || p->dtype == FP_F16 || p->dtype == FP_BF16 || p->dtype == FP_FP8_E4M3,
                 "argument 'dtype' (%s) is unsupported: f32, f16, bf16 or fp8e4m3 (FP_FP8_E4M3: Q, K, V "
                 "with descales, O bf16)", fp_dtype_name(p->dtype));
    FP_CHECK_ARG(isfinite(p->softmax_scale) && p->softmax_scale >= 0.0f,
                 "argument 'softmax_scale' (%g) must be finite and > 0 (0 = 1/sqrt(head_dim))",
                 (double)p->softmax_scale);
    const int fp8 = p->dtype == FP_FP8_E4M3;
    /* an fp8 KV cache: K / V e4m3 under a 16-bit or f32 Q */
    const int kv8 = !fp8 && p->kv_dtype == FP_FP8_E4M3;
    FP_CHECK_ARG(p->kv_dtype == FP_F32 || p->kv_dtype == p->dtype || kv8,
                 "argument 'kv_dtype' (%s) is unsupported with dtype %s: 0 or dtype (K, V in dtype), or "
                 "fp8e4m3 (an fp8 KV cache under f32 / f16 / bf16 Q)",
                 fp_dtype_name(p->kv_dtype), fp_dtype_name(p->dtype));
    const float descale[3] = {p->q_descale, p->k_descale, p->v_descale};
    static const char *const descale_name[3] = {"q_descale", "k_descale", "v_descale"};
    for (int i = 0; i < 3; ++i) {
        FP_CHECK_ARG(isfinite(descale[i]) && descale[i] >= 0.0f,
                     "argument '%s' (%g) must be finite and > 0 (0 = 1)", descale_name[i], (double)descale[i]);
        FP_CHECK_ARG(fp8 || (kv8 && i > 0) || descale[i] == 0.0f || descale[i] == 1.0f,
                     "argument '%s' (%g) is for fp8 inputs: with dtype %s%s it must be 0 or 1", descale_name[i],
                     (double)descale[i], fp_dtype_name(p->dtype), kv8 ? " (Q not fp8)" : "");
    }
    /* scores use softmax_scale x q_descale x k_descale, rounded once */
    const double base_scale = p->softmax_scale > 0.0f ? p->softmax_scale : 1.0 / sqrt((double)p->head_dim);
    const double qk_descale = (double)RESOLVE(p->q_descale, 1.0f) * (double)RESOLVE(p->k_descale, 1.0f);
    const float scale = (float)(base_scale * qk_descale);
    FP_CHECK_ARG(isfinite(scale) && scale > 0.0f,
                 "softmax_scale (%g) x q_descale (%g) x k_descale (%g) = %g is not a finite float > 0",
                 base_scale, (double)p->q_descale, (double)p->k_descale, base_scale * qk_descale);
    FP_CHECK_ARG(p->causal == 0 || p->causal == 1, "argument 'causal' must be 0 or 1 (got %d)",
                 p->causal);
    FP_CHECK_ARG(p->window_left >= -1, "argument 'window_left' must be >= -1 (got %d)",
                 p->window_left);
    FP_CHECK_ARG(p->window_right >= -1, "argument 'window_right' must be >= -1 (got %d)",
                 p->window_right);
    FP_CHECK_ARG(!p->causal || p->window_right <= 0,
                 "argument 'window_right' (%d) must be -1 or 0 with causal", p->window_right);
    FP_CHECK_ARG(p->q != NULL, "argument 'q' is NULL");
    FP_CHECK_ARG(p->k != NULL, "argument 'k' is NULL");
    FP_CHECK_ARG(p->v != NULL, "argument 'v' is NULL");
    FP_CHECK_ARG(p->o != NULL, "argument 'o' is NULL");
    /* before the host reads of seqlens_k below (paged, CPU) */
    FP_CHECK_ARG((uintptr_t)p->lse % 4 == 0, "argument 'lse' is not 4-byte aligned");
    FP_CHECK_ARG((uintptr_t)p->seqlens_k % 4 == 0, "argument 'seqlens_k' is not 4-byte aligned");
    const int varlen = p->cu_seqlens_q != NULL || p->cu_seqlens_k != NULL;
    if (varlen) {
        FP_CHECK_ARG(p->cu_seqlens_q && p->cu_seqlens_k,
                     "arguments 'cu_seqlens_q' and 'cu_seqlens_k' must be given together");
        FP_CHECK_ARG(!p->seqlens_k, "argument 'seqlens_k' cannot be combined with cu_seqlens_q / cu_seqlens_k");
        FP_CHECK_ARG(!p->q_batch_stride && !p->k_batch_stride && !p->v_batch_stride && !p->o_batch_stride,
                     "batch strides must be 0 with cu_seqlens_q / cu_seqlens_k (sequences are packed "
                     "along the sequence dimension)");
        FP_CHECK_ARG((uintptr_t)p->cu_seqlens_q % 4 == 0 && (uintptr_t)p->cu_seqlens_k % 4 == 0,
                     "arguments 'cu_seqlens_q' / 'cu_seqlens_k' are not 4-byte aligned");
        FP_CHECK_ARG(p->total_k >= 0, "argument 'total_k' must be >= 0 (got %lld; 0: not given)",
                     (long long)p->total_k);
        FP_CHECK_ARG(cuda || !p->total_k || p->total_k >= p->cu_seqlens_k[p->batch],
                     "argument 'total_k' (%lld rows of K / V) is below cu_seqlens_k[batch] (%d)",
                     (long long)p->total_k, p->cu_seqlens_k[p->batch]);
        if (!cuda) /* host memory: the offsets can be checked */
            for (int b = 0; b < p->batch; ++b) {
                int64_t nq = (int64_t)p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
                int64_t nk = (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
                FP_CHECK_ARG(p->cu_seqlens_q[0] >= 0 && nq >= 0 && nq <= p->seqlen_q,
                             "argument 'cu_seqlens_q': sequence %d has %lld queries (must be in [0, "
                             "seqlen_q = %d], offsets >= 0 and non-decreasing)",
                             b, (long long)nq, p->seqlen_q);
                FP_CHECK_ARG(p->cu_seqlens_k[0] >= 0 && nk >= 0 && nk <= p->seqlen_k,
                             "argument 'cu_seqlens_k': sequence %d has %lld keys (must be in [0, "
                             "seqlen_k = %d], offsets >= 0 and non-decreasing)",
                             b, (long long)nk, p->seqlen_k);
            }
    }
    FP_CHECK_ARG(varlen || !p->total_k, "argument 'total_k' (%lld) is for varlen calls: give it with "
                 "cu_seqlens_q / cu_seqlens_k, or 0", (long long)p->total_k);
    const int paged = p->block_table != NULL;
    if (paged) {
        FP_CHECK_ARG(!varlen, "argument 'block_table' cannot be combined with cu_seqlens_q / cu_seqlens_k");
        FP_CHECK_ARG(p->page_size >= 1, "argument 'page_size' must be >= 1 with block_table (got %d)",
                     p->page_size);
        FP_CHECK_ARG(p->num_pages >= 1, "argument 'num_pages' must be >= 1 with block_table (got %d)",
                     p->num_pages);
        FP_CHECK_ARG(p->block_table_stride >= 1 &&
                         (int64_t)p->block_table_stride * p->page_size >= p->seqlen_k,
                     "argument 'block_table_stride' (%d) x 'page_size' (%d) must cover seqlen_k (%d)",
                     p->block_table_stride, p->page_size, p->seqlen_k);
        FP_CHECK_ARG((int64_t)p->batch * p->block_table_stride <= INT32_MAX,
                     "block_table has too many entries (batch %d x block_table_stride %d)", p->batch,
                     p->block_table_stride);
        FP_CHECK_ARG((uintptr_t)p->block_table % 4 == 0, "argument 'block_table' is not 4-byte aligned");
        if (!cuda) /* host memory: every entry a sequence uses can be checked */
            for (int b = 0; b < p->batch; ++b) {
                int L = p->seqlens_k ? p->seqlens_k[b] : p->seqlen_k;
                if (L > p->seqlen_k) L = p->seqlen_k;
                /* int64: L + page_size - 1 overflows int for page sizes near INT_MAX
                 * (accepted: any page_size >= 1), and a negative count skipped the check */
                const int64_t used = L > 0 ? ((int64_t)L + p->page_size - 1) / p->page_size : 0;
                for (int64_t e = 0; e < used; ++e) {
                    const int32_t pg = p->block_table[(int64_t)b * p->block_table_stride + e];
                    FP_CHECK_ARG(pg >= 0 && pg < p->num_pages,
                                 "argument 'block_table': entry [%d][%lld] = %d is outside [0, num_pages = %d)",
                                 b, (long long)e, (int)pg, p->num_pages);
                }
            }
    }
    FP_CHECK_ARG((int64_t)p->seqlen_q * p->heads_q <= (int64_t)1 << 30,
                 "seqlen_q * heads_q (%lld) too large", (long long)p->seqlen_q * p->heads_q);

    a->batch = p->batch;
    a->seqlen_q = p->seqlen_q;
    a->seqlen_k = p->seqlen_k;
    a->heads_q = p->heads_q;
    a->heads_kv = p->heads_kv;
    a->head_dim = p->head_dim;
    a->group = p->heads_q / p->heads_kv;
    a->dtype = p->dtype;
    a->kv_dtype = kv8 ? FP_FP8_E4M3 : p->dtype;
    a->kv_fp8_cache = kv8;
    a->q = p->q;
    a->k = p->k;
    a->v = p->v;
    a->o = p->o;
    const int64_t d = p->head_dim;
    a->q_hs = RESOLVE(p->q_head_stride, d);
    a->q_ss = RESOLVE(p->q_seq_stride, d * p->heads_q);
    a->q_bs = RESOLVE(p->q_batch_stride, d * p->heads_q * p->seqlen_q);
    a->k_hs = RESOLVE(p->k_head_stride, d);
    a->k_ss = RESOLVE(p->k_seq_stride, d * p->heads_kv);
    /* paged: the "batch" dimension of K and V is the page */
    const int kv_seq = paged ? p->page_size : p->seqlen_k;
    a->k_bs = RESOLVE(p->k_batch_stride, d * p->heads_kv * kv_seq);
    a->v_hs = RESOLVE(p->v_head_stride, d);
    a->v_ss = RESOLVE(p->v_seq_stride, d * p->heads_kv);
    a->v_bs = RESOLVE(p->v_batch_stride, d * p->heads_kv * kv_seq);
    a->o_hs = RESOLVE(p->o_head_stride, d);
    a->o_ss = RESOLVE(p->o_seq_stride, d * p->heads_q);
    a->o_bs = RESOLVE(p->o_batch_stride, d * p->heads_q * p->seqlen_q);
    if (varlen) /* one packed sequence dimension; batch strides unused */
        a->q_bs = a->k_bs = a->v_bs = a->o_bs = 0;
    const int nb = varlen ? 1 : p->batch;
    /* The sequence dimension's extent: varlen packs every sequence along it,
     * so it is the packed total (host offsets), not seqlen_q / seqlen_k (the
     * per-sequence maximum); unknown (-1) for device offsets. */
    int64_t q_seq = p->seqlen_q, k_seq = kv_seq;
    if (varlen && cuda) {
        q_seq = -1;
        k_seq = p->total_k ? p->total_k : -1; /* the caller's extent where given */
    } else if (varlen) {
        q_seq = (int64_t)p->cu_seqlens_q[p->batch] - p->cu_seqlens_q[0];
        k_seq = (int64_t)p->cu_seqlens_k[p->batch] - p->cu_seqlens_k[0];
    }
    FP_TRY(check_strides("q", a->q_bs, a->q_ss, a->q_hs, nb, q_seq, p->heads_q, p->head_dim));
    const int kv_nb = paged ? p->num_pages : nb;
    FP_TRY(check_strides("k", a->k_bs, a->k_ss, a->k_hs, kv_nb, k_seq, p->heads_kv, p->head_dim));
    FP_TRY(check_strides("v", a->v_bs, a->v_ss, a->v_hs, kv_nb, k_seq, p->heads_kv, p->head_dim));
    FP_TRY(check_strides("o", a->o_bs, a->o_ss, a->o_hs, nb, q_seq, p->heads_q, p->head_dim));
    /* fp8: Q, K, V of 1 byte, O bf16 of 2 */
    const fp_dtype o_dtype = fp8 ? FP_BF16 : p->dtype;
    const size_t elt = fp_dtype_size(p->dtype), o_elt = fp_dtype_size(o_dtype);
    const size_t kv_elt = fp_dtype_size(a->kv_dtype);
    FP_TRY(check_align("q", p->q, a->q_bs, a->q_ss, a->q_hs, elt, cuda));
    FP_TRY(check_align("k", p->k, a->k_bs, a->k_ss, a->k_hs, kv_elt, cuda));
    FP_TRY(check_align("v", p->v, a->v_bs, a->v_ss, a->v_hs, kv_elt, cuda));
    FP_TRY(check_align("o", p->o, a->o_bs, a->o_ss, a->o_hs, o_elt, cuda));

    a->o_dtype = o_dtype;
    a->o_scale = fp8 || kv8 ? RESOLVE(p->v_descale, 1.0f) : 1.0f;
    a->scale = scale;
    a->window_left = p->window_left;
    a->window_right = p->causal ? 0 : p->window_right;
    a->lse = p->lse;
    a->seqlens_k = p->seqlens_k;
    a->cu_q = p->cu_seqlens_q;
    a->cu_k = p->cu_seqlens_k;
    a->total_k = varlen ? p->total_k : 0;
    a->block_table = p->block_table;
    a->bt_stride = paged ? p->block_table_stride : 0;
    a->page_size = paged ? p->page_size : 0;
    a->num_pages = paged ? p->num_pages : 0;
    a->ctx = NULL; /* set by the CUDA dispatch */
    memset(&a->stamp, 0, sizeof a->stamp); /* fp_attention_forward's span fills it */
    return FP_OK;
}

double fp_attn_bytes(const fp_attn_args *a) {
    const double elt = (double)fp_dtype_size(a->dtype), o_elt = (double)fp_dtype_size(a->o_dtype);
    const double kv_elt = (double)fp_dtype_size(a->kv_dtype);
    const double q_o = (double)a->batch * a->seqlen_q * a->heads_q * a->head_dim;
    return (elt + o_elt) * q_o + kv_elt * 2.0 * a->batch * a->seqlen_k * a->heads_kv * a->head_dim;
}

double fp_attention_flops(const fp_attention_params *p) {
    if (!p) return 0.0;
    double f = 4.0 * p->batch * p->heads_q * (double)p->seqlen_q * p->seqlen_k * p->head_dim;
    return p->causal ? f * 0.5 : f;
}
