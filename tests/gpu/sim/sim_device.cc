/* kernels/kdevice.h in the simulator: host loops over the (host) memory the simulated device uses.
 * Where CUB leaves memory undefined (the unused half of a sort's double buffer, the temporary
 * storage) these loops poison it, so that a launcher that relies on it fails in the harness. */
#include <algorithm>
#include <vector>

#include "kdevice.h"

namespace MOE_KNS {

/* Temporary bytes the simulated primitives ask for: enough to show a carving mistake (the slice is
 * poisoned on every call), independent of n as CUB's is not. */
static const size_t SIM_TEMP_BYTES = 512;

static void poison(void *p, size_t bytes) { std::memset(p, 0xA5, bytes); }

int32_t dev_exclusive_scan_i64(const moe_exec *ex, const int64_t *in, int64_t *out, int64_t n)
{
    (void)ex;
    int64_t s = 0;
    out[0] = 0;
    for (int64_t i = 0; i < n; i++) out[i + 1] = s += in[i];
    return MOE_OK;
}

int32_t dev_sort_pairs_u32(const moe_exec *ex, void *temp, size_t *temp_bytes, uint32_t *const keys[2],
                           int32_t *const vals[2], int64_t n, int begin_bit, int end_bit, int descending, int *sel)
{
    (void)ex;
    if (n < 0 || n > INT32_MAX || begin_bit < 0 || begin_bit >= end_bit || end_bit > 32)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "dev_sort_pairs_u32: n = %lld, bits [%d, %d)",
                          (long long)n, begin_bit, end_bit);
    if (!temp) {
        *temp_bytes = SIM_TEMP_BYTES;
        return MOE_OK;
    }
    if (*temp_bytes < SIM_TEMP_BYTES)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "dev_sort_pairs_u32: %zu bytes of temporary storage",
                          *temp_bytes);
    poison(temp, *temp_bytes);
    const uint32_t mask = end_bit - begin_bit == 32 ? 0xFFFFFFFFu : ((1u << (end_bit - begin_bit)) - 1u);
    std::vector<uint32_t> k(keys[0], keys[0] + n);
    std::vector<int32_t> v(vals[0], vals[0] + n);
    std::vector<int64_t> order((size_t)n);
    for (int64_t i = 0; i < n; i++) order[(size_t)i] = i;
    auto digit = [&](int64_t i) { return (k[(size_t)i] >> begin_bit) & mask; };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return descending ? digit(a) > digit(b) : digit(a) < digit(b);
    });
    /* like CUB: the result lands in either buffer (here: buffer 1 after an odd number of 8-bit
     * passes), and the other buffer's contents are undefined */
    const int s = ((end_bit - begin_bit + 7) / 8) & 1;
    for (int64_t i = 0; i < n; i++) {
        keys[s][i] = k[(size_t)order[(size_t)i]];
        vals[s][i] = v[(size_t)order[(size_t)i]];
    }
    poison(keys[1 - s], (size_t)n * sizeof(uint32_t));
    poison(vals[1 - s], (size_t)n * sizeof(int32_t));
    *sel = s;
    return MOE_OK;
}

int32_t dev_exclusive_scan_i32(const moe_exec *ex, void *temp, size_t *temp_bytes, const int32_t *in, int32_t *out,
                               int64_t n)
{
    (void)ex;
    if (n < 1 || n > INT32_MAX)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "dev_exclusive_scan_i32: n = %lld", (long long)n);
    if (!temp) {
        *temp_bytes = SIM_TEMP_BYTES;
        return MOE_OK;
    }
    if (*temp_bytes < SIM_TEMP_BYTES)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "dev_exclusive_scan_i32: %zu bytes of temporary storage",
                          *temp_bytes);
    poison(temp, *temp_bytes);
    int32_t s = 0;
    out[0] = 0;
    for (int64_t i = 0; i < n; i++) out[i + 1] = s += in[i];
    return MOE_OK;
}

} // namespace MOE_KNS
