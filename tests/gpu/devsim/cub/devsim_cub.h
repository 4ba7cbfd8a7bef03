/*
 * The device simulator's stand-in for the parts of CUB (CCCL) that kernels/kdevice_cub.cu calls, so
 * that the very source of those wrappers runs in CI. Semantics from CUB's documentation
 * (cub::DeviceScan, cub::DeviceRadixSort, cub::DoubleBuffer):
 *  - a call with d_temp_storage == NULL does no work and stores the temporary bytes it needs;
 *  - the work is queued on the stream (never run on the calling thread); the temporary storage and,
 *    for a sort, the buffer that does not hold the result are left undefined: the stand-in poisons
 *    them, so a wrapper that relies on them fails;
 *  - a radix sort "updates the current indicator within the DoubleBuffer wrapper to reference which of
 *    the two buffers now contains the sorted output": here buffer 1 after an odd number of 8-bit
 *    passes, which the caller must read from `selector`, not assume;
 *  - the temporary storage needed grows with the number of items, as CUB's does.
 * Every buffer must be device memory of the simulator (an illegal address on a GPU).
 */
#ifndef MOE_DEVSIM_CUB_H
#define MOE_DEVSIM_CUB_H

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "devsim.h"

namespace cub {

template <class T> struct DoubleBuffer {
    T *d_buffers[2];
    int selector;
    DoubleBuffer() : d_buffers{nullptr, nullptr}, selector(0) {}
    DoubleBuffer(T *current, T *alternate) : d_buffers{current, alternate}, selector(0) {}
    T *Current() { return d_buffers[selector]; }
    T *Alternate() { return d_buffers[selector ^ 1]; }
};

namespace devsim_detail {
inline size_t temp_bytes(long long n) { return 1024 + 16 * (size_t)(n > 0 ? n : 0); }

inline cudaError_t need_device(const void *p, size_t bytes, const char *what)
{
    if (bytes == 0) return cudaSuccess;
    return devsim::check_device(p, bytes, what);
}
} // namespace devsim_detail

struct DeviceScan {
    template <class In, class Out, class N>
    static cudaError_t InclusiveSum(void *d_temp_storage, size_t &temp_storage_bytes, In d_in, Out d_out, N num_items,
                                    cudaStream_t stream = 0)
    {
        const long long n = (long long)num_items;
        const size_t need = devsim_detail::temp_bytes(n);
        if (!d_temp_storage) {
            temp_storage_bytes = need;
            return cudaSuccess;
        }
        if (temp_storage_bytes < need)
            return devsim::fail(cudaErrorInvalidValue, "cub::DeviceScan::InclusiveSum: %zu bytes of temporary storage, "
                                "%zu needed", temp_storage_bytes, need);
        typedef typename std::remove_cv<typename std::remove_reference<decltype(*d_in)>::type>::type T;
        cudaError_t e = devsim_detail::need_device(d_temp_storage, temp_storage_bytes, "cub::DeviceScan temp storage");
        if (!e) e = devsim_detail::need_device(&*d_in, sizeof(T) * (size_t)n, "cub::DeviceScan d_in");
        if (!e) e = devsim_detail::need_device(&*d_out, sizeof(T) * (size_t)n, "cub::DeviceScan d_out");
        if (e) return e;
        const size_t tb = temp_storage_bytes;
        return devsim::enqueue(stream, "cub::DeviceScan::InclusiveSum", [=]() {
            std::memset(d_temp_storage, 0xA5, tb);
            T s = T(0);
            for (long long i = 0; i < n; i++) d_out[i] = s = s + d_in[i];
            return cudaSuccess;
        }, devsim::ENQ_KERNEL);
    }
};

struct DeviceRadixSort {
    template <class K, class V, class N>
    static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes, DoubleBuffer<K> &keys,
                                 DoubleBuffer<V> &values, N num_items, int begin_bit = 0,
                                 int end_bit = sizeof(K) * 8, cudaStream_t stream = 0)
    {
        return sort(d_temp_storage, temp_storage_bytes, keys, values, (long long)num_items, begin_bit, end_bit, stream,
                    false);
    }
    template <class K, class V, class N>
    static cudaError_t SortPairsDescending(void *d_temp_storage, size_t &temp_storage_bytes, DoubleBuffer<K> &keys,
                                           DoubleBuffer<V> &values, N num_items, int begin_bit = 0,
                                           int end_bit = sizeof(K) * 8, cudaStream_t stream = 0)
    {
        return sort(d_temp_storage, temp_storage_bytes, keys, values, (long long)num_items, begin_bit, end_bit, stream,
                    true);
    }

private:
    template <class K, class V>
    static cudaError_t sort(void *temp, size_t &temp_bytes, DoubleBuffer<K> &keys, DoubleBuffer<V> &values,
                            long long n, int begin_bit, int end_bit, cudaStream_t stream, bool descending)
    {
        const size_t need = devsim_detail::temp_bytes(n);
        if (!temp) {
            temp_bytes = need;
            return cudaSuccess;
        }
        if (temp_bytes < need)
            return devsim::fail(cudaErrorInvalidValue, "cub::DeviceRadixSort: %zu bytes of temporary storage, %zu needed",
                                temp_bytes, need);
        if (n == 0) return cudaSuccess;
        K *kin = keys.Current(), *kalt = keys.Alternate();
        V *vin = values.Current(), *valt = values.Alternate();
        cudaError_t e = devsim_detail::need_device(temp, temp_bytes, "cub::DeviceRadixSort temp storage");
        if (!e) e = devsim_detail::need_device(kin, sizeof(K) * (size_t)n, "cub::DeviceRadixSort keys (current)");
        if (!e) e = devsim_detail::need_device(kalt, sizeof(K) * (size_t)n, "cub::DeviceRadixSort keys (alternate)");
        if (!e) e = devsim_detail::need_device(vin, sizeof(V) * (size_t)n, "cub::DeviceRadixSort values (current)");
        if (!e) e = devsim_detail::need_device(valt, sizeof(V) * (size_t)n, "cub::DeviceRadixSort values (alternate)");
        if (e) return e;
        const int passes = (end_bit - begin_bit + 7) / 8;
        const int flip = passes & 1; /* the result lands in the alternate buffer after an odd pass count */
        K *kout = flip ? kalt : kin, *kother = flip ? kin : kalt;
        V *vout = flip ? valt : vin, *vother = flip ? vin : valt;
        const size_t tb = temp_bytes;
        e = devsim::enqueue(stream, descending ? "cub::DeviceRadixSort::SortPairsDescending" : "cub::DeviceRadixSort::SortPairs",
                            [=]() {
                                std::memset(temp, 0xA5, tb);
                                const unsigned long long mask =
                                    end_bit - begin_bit >= 64 ? ~0ull : ((1ull << (end_bit - begin_bit)) - 1ull);
                                std::vector<K> k(kin, kin + n);
                                std::vector<V> v(vin, vin + n);
                                std::vector<long long> order((size_t)n);
                                for (long long i = 0; i < n; i++) order[(size_t)i] = i;
                                auto digit = [&](long long i) {
                                    return ((unsigned long long)k[(size_t)i] >> begin_bit) & mask;
                                };
                                std::stable_sort(order.begin(), order.end(), [&](long long a, long long b) {
                                    return descending ? digit(a) > digit(b) : digit(a) < digit(b);
                                });
                                for (long long i = 0; i < n; i++) {
                                    kout[i] = k[(size_t)order[(size_t)i]];
                                    vout[i] = v[(size_t)order[(size_t)i]];
                                }
                                std::memset((void *)kother, 0xA5, sizeof(K) * (size_t)n);
                                std::memset((void *)vother, 0xA5, sizeof(V) * (size_t)n);
                                return cudaSuccess;
                            },
                            devsim::ENQ_KERNEL);
        if (e) return e;
        keys.selector ^= flip;
        values.selector ^= flip;
        return cudaSuccess;
    }
};

} // namespace cub

#endif
