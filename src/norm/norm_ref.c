/* The numerical oracle of the fused norm: plain loops, double accumulation,
 * one thread, host memory. Obviously right rather than fast. The only
 * rounding before the final store is the one the op defines: the sum
 * s = x + residual is rounded to the tensor dtype. */
#include <stdlib.h>

#include "norm/norm_internal.h"

static double ld(const void *base, int dt, int64_t r, int64_t stride, int64_t j) {
    return (double)fp_load_f32(base, dt, r * stride + j);
}

static double act_d(int act, double y) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF: return 0.5 * y * (1.0 + erf(y / sqrt(2.0)));
    case FP_NORM_ACT_GELU_TANH:
        return 0.5 * y * (1.0 + tanh(FP_NORM_GELU_K * (y + FP_NORM_GELU_C * y * y * y)));
    case FP_NORM_ACT_RELU: return y > 0.0 ? y : 0.0;
    case FP_NORM_ACT_SILU: return y / (1.0 + exp(-y));
    default: return y;
    }
}

static double dact_d(int act, double y) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF:
        return 0.5 * (1.0 + erf(y / sqrt(2.0))) + y * exp(-0.5 * y * y) / sqrt(2.0 * M_PI);
    case FP_NORM_ACT_GELU_TANH: {
        double t = tanh(FP_NORM_GELU_K * (y + FP_NORM_GELU_C * y * y * y));
        return 0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * FP_NORM_GELU_K * (1.0 + 3.0 * FP_NORM_GELU_C * y * y);
    }
    case FP_NORM_ACT_RELU: return y > 0.0 ? 1.0 : 0.0;
    case FP_NORM_ACT_SILU: {
        double sg = 1.0 / (1.0 + exp(-y));
        return sg * (1.0 + y * (1.0 - sg));
    }
    default: return 1.0;
    }
}

fp_status fp_norm_ref_forward(const fp_norm_fwd_desc *d) {
    const int64_t n = d->cols;
    const int dt = d->dtype;
    double *s = malloc((size_t)n * sizeof(double));
    if (!s) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "reference: %lld doubles", (long long)n);
    for (int64_t r = 0; r < d->rows; ++r) {
        for (int64_t j = 0; j < n; ++j) {
            double v = ld(d->x, dt, r, d->x_stride, j);
            if (d->res) v = (double)fp_round_to(dt, (float)(v + ld(d->res, dt, r, d->res_stride, j)));
            s[j] = v;
            if (d->res_out) fp_store_f32(d->res_out, dt, r * d->res_out_stride + j, (float)v);
        }
        double mean = 0.0;
        if (d->kind == FP_NORM_LAYERNORM) {
            for (int64_t j = 0; j < n; ++j) mean += s[j];
            mean /= (double)n;
        }
        double var = 0.0;
        for (int64_t j = 0; j < n; ++j) var += (s[j] - mean) * (s[j] - mean);
        var /= (double)n;
        double rstd = 1.0 / sqrt(var + (double)d->eps);
        if (d->mean) d->mean[r] = (float)mean;
        if (d->rstd) d->rstd[r] = (float)rstd;
        for (int64_t j = 0; j < n; ++j) {
            double y = (s[j] - mean) * rstd;
            if (d->gamma) y *= ld(d->gamma, dt, 0, 0, j);
            if (d->beta) y += ld(d->beta, dt, 0, 0, j);
            if (d->bias) y += ld(d->bias, dt, 0, 0, j);
            fp_store_f32(d->out, dt, r * d->out_stride + j, (float)act_d(d->act, y));
        }
    }
    free(s);
    return FP_OK;
}

fp_status fp_norm_ref_backward(const fp_norm_bwd_desc *d) {
    const int64_t n = d->cols;
    const int dt = d->dtype;
    double *buf = calloc((size_t)n * 4, sizeof(double));
    if (!buf) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "reference: %lld doubles", (long long)n * 4);
    double *xn = buf, *dn = buf + n, *dg = buf + 2 * n, *db = buf + 3 * n;
    for (int64_t r = 0; r < d->rows; ++r) {
        double mean = d->mean ? (double)d->mean[r] : 0.0, rstd = (double)d->rstd[r];
        double sum_dn = 0.0, sum_dnn = 0.0;
        for (int64_t j = 0; j < n; ++j) {
            double v = (ld(d->x, dt, r, d->x_stride, j) - mean) * rstd;
            double gam = d->gamma ? ld(d->gamma, dt, 0, 0, j) : 1.0;
            double y = v * gam + (d->beta ? ld(d->beta, dt, 0, 0, j) : 0.0) +
                       (d->bias ? ld(d->bias, dt, 0, 0, j) : 0.0);
            double g = ld(d->dout, dt, r, d->dout_stride, j) * dact_d(d->act, y);
            dg[j] += g * v;
            db[j] += g;
            xn[j] = v;
            dn[j] = g * gam;
            sum_dn += dn[j];
            sum_dnn += dn[j] * v;
        }
        double a = d->kind == FP_NORM_LAYERNORM ? sum_dn / (double)n : 0.0, b = sum_dnn / (double)n;
        for (int64_t j = 0; j < n; ++j) {
            double v = rstd * (dn[j] - a - xn[j] * b);
            if (d->dres) v += ld(d->dres, dt, r, d->dres_stride, j);
            fp_store_f32(d->dx, dt, r * d->dx_stride + j, (float)v);
        }
    }
    for (int64_t j = 0; j < n; ++j) {
        if (d->dgamma) fp_store_f32(d->dgamma, dt, j, (float)dg[j]);
        if (d->dbeta) fp_store_f32(d->dbeta, dt, j, (float)db[j]);
        if (d->dbias) fp_store_f32(d->dbias, dt, j, (float)db[j]);
    }
    free(buf);
    return FP_OK;
}
