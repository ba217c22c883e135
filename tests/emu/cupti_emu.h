/* Test controls of the emulated CUPTI (cupti_emu.cpp). */
#ifndef FP_CUPTI_EMU_H
#define FP_CUPTI_EMU_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp_emu_cupti_count {
    long long device_records;    /* kernel, memcpy and memset records written */
    long long api_records;       /* API records written */
    long long external_records;  /* external-correlation records written */
    long long buffers_delivered; /* buffers handed to the client's callback */
    int runtime_apis, driver_apis; /* APIs recorded: their kind on, not switched off per API */
} fp_emu_cupti_count;

/* busy != 0: cuptiActivityEnable fails with
 * CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (another tool owns CUPTI). */
void fp_emu_cupti_set_busy(int busy);
void fp_emu_cupti_counts(fp_emu_cupti_count *out);

#ifdef __cplusplus
}
#endif

#endif /* FP_CUPTI_EMU_H */
