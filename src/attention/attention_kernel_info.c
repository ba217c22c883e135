/* fp_attention_last_kernel: which attention kernel the calling thread's last
 * call launched, recorded by the launchers (kernels/attention) on success. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h"

/* The fused split combine's staged merge: -1 until set (the environment
 * decides), else 0 / 1. */
static atomic_int g_merge_stage = -1;

void fp_attn_merge_stage_set(int on) { atomic_store(&g_merge_stage, on < 0 ? -1 : on != 0); }

int fp_attn_merge_stage(void) {
    const int v = atomic_load(&g_merge_stage);
    if (v >= 0) return v;
    static atomic_int env = -1; /* read once (two first callers read the same value) */
    int e = atomic_load(&env);
    if (e < 0) {
        const char *s = getenv("FP_ATTN_MERGE_STAGE");
        e = s && strcmp(s, "1") == 0;
        atomic_store(&env, e);
    }
    return e;
}

static _Thread_local fp_attention_kernel_info tl_info = {"none", 0, 0, 0, 0, ""};

void fp_attn_note_begin(int preferred) {
    tl_info.kernel = "none";
    tl_info.version = 0;
    tl_info.num_splits = 0;
    tl_info.paged = 0;
    tl_info.preferred = preferred;
    tl_info.fallback[0] = '\0';
}

void fp_attn_note_kernel(const fp_attn_args *a, int version, int num_splits) {
    static const char *const names[] = {"rowwise", "flash_v1", "flash_v2", "flash_v3", "flash_v4", "flash_v5", "flash_v6",
                                         "flash_v7", "flash_v8", "flash_v9", "flash_v10"};
    tl_info.kernel = version < 0 ? "cpu" : version <= 10 ? names[version] : "none";
    tl_info.version = version > 0 && version <= 10 ? version : 0;
    tl_info.num_splits = num_splits;
    tl_info.paged = a && a->block_table != NULL;
}

void fp_attn_note_fallback(const char *why) {
    snprintf(tl_info.fallback, sizeof tl_info.fallback, "%s", why ? why : "");
}

fp_status fp_attention_last_kernel(fp_attention_kernel_info *info) {
    if (!info) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fp_attention_last_kernel: info is NULL");
    *info = tl_info;
    return FP_OK;
}
