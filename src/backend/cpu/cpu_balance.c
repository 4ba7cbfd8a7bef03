/*
 * Load-balancing state of the CPU backend (docs/math.md §3): the aux-loss value and its gradient
 * coefficients from the aux statistics, the expert-bias token counts and the bias update. Values and
 * coefficients are computed in double whatever the table's real, as the statistics are.
 */
#include "moe.h"
#include "backend/cpu/cpu_ops.h"

/* coef [B,E] = scale * dL/ds^, loss = L_aux (see ops.h). */
int32_t MOE_R(cpu_aux_loss)(const moe_exec *ex, const moe_aux_params *ap, const int64_t *counts,
                            const double *score_sums, const int64_t *group_tokens, double *global, double *coef,
                            double *loss)
{
    if (ex == NULL || ap == NULL || ap->E < 1 || ap->K < 1 || ap->B < 1 || ap->T < 0 || counts == NULL ||
        score_sums == NULL || group_tokens == NULL || coef == NULL || loss == NULL)
        return MOE_ERR_INVALID_ARGUMENT;
    if (ap->type != MOE_AUX_SWITCH && ap->type != MOE_AUX_SEQUENCE && ap->type != MOE_AUX_GLOBAL)
        return MOE_ERR_INVALID_ARGUMENT;
    if (ap->type == MOE_AUX_GLOBAL && global == NULL) return MOE_ERR_INVALID_ARGUMENT;
    const int32_t E = ap->E;
    const double alpha = ap->alpha, dE = E, K = ap->K, T_tot = (double)group_tokens[0], scale = ap->scale;
    double l = 0;
    if (ap->type == MOE_AUX_GLOBAL) {
        /* running mean of the (group-summed) counts over this global batch's micro-batches */
        double *gc = global, *gt = global + E, *nmb = global + E + 1;
        if (ap->update_global) {
            for (int32_t i = 0; i < E; i++) gc[i] += (double)counts[i];
            *gt += T_tot;
            *nmb += 1;
        }
        const double n = *nmb > 0 ? *nmb : 1.0;
        const double tbar = *nmb > 0 ? *gt / n : T_tot;
        for (int32_t i = 0; i < E; i++) {
            double cbar = *nmb > 0 ? gc[i] / n : (double)counts[i];
            double c = tbar > 0 && T_tot > 0 ? alpha * dE * cbar / (K * tbar * T_tot) : 0.0;
            coef[i] = c * scale;
            l += c * score_sums[i];
        }
    } else if (ap->type == MOE_AUX_SWITCH) {
        for (int32_t i = 0; i < E; i++) {
            double c = T_tot > 0 ? alpha * dE * (double)counts[i] / (K * T_tot * T_tot) : 0.0;
            coef[i] = c * scale;
            l += c * score_sums[i];
        }
    } else { /* sequence: per sequence of S local tokens, averaged over the B sequences */
        /* T = 0 (the core passes B = 1): S = 0 and every count is 0; the loss is 0, not 0/0 */
        const double S = (double)ap->T / (double)ap->B;
        for (int64_t b = 0; b < ap->B; b++)
            for (int32_t i = 0; i < E; i++) {
                double c = S > 0 ? alpha * dE * (double)counts[b * E + i] / (K * S * S * (double)ap->B) : 0.0;
                coef[b * E + i] = c * scale;
                l += c * score_sums[b * E + i];
            }
    }
    *loss = l;
    return MOE_OK;
}

int32_t MOE_R(cpu_count_add)(const moe_exec *ex, int64_t n, const int64_t *src, int64_t *dst)
{
    if (ex == NULL || n < 0 || (n > 0 && (src == NULL || dst == NULL))) return MOE_ERR_INVALID_ARGUMENT;
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
    return MOE_OK;
}

/* b_i += u * sign(mean(n) - n_i), compared exactly: mean(n) - n_i has the sign of sum(n) - E*n_i. */
int32_t MOE_R(cpu_bias_update)(const moe_exec *ex, int32_t E, const int64_t *counts, double rate, void *bias)
{
    if (ex == NULL || E < 1 || counts == NULL || bias == NULL) return MOE_ERR_INVALID_ARGUMENT;
    int64_t total = 0;
    for (int32_t i = 0; i < E; i++) total += counts[i];
    real *b = (real *)bias;
    for (int32_t i = 0; i < E; i++) {
        int64_t diff = total - (int64_t)E * counts[i];
        double step = diff > 0 ? rate : diff < 0 ? -rate : 0.0;
        b[i] += (real)step;
    }
    return MOE_OK;
}
