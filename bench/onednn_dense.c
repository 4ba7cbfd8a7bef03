/* oneDNN pieces of bench_layer's dense ceiling (see onednn_dense.h). */
#include "onednn_dense.h"

#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

struct onednn_bf16_gemm {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3];
    uint16_t *a, *b;
    float *c;
    int threads;
};

static uint16_t *bf16_copy(const uint16_t *src, int64_t n)
{
    uint16_t *d = malloc((size_t)n * sizeof *d);
    if (d) memcpy(d, src, (size_t)n * sizeof *d);
    return d;
}

onednn_bf16_gemm *onednn_bf16_gemm_create(int64_t m, int64_t n, int64_t k, const uint16_t *a, const uint16_t *b,
                                          int threads)
{
    onednn_bf16_gemm *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->threads = threads;
    g->a = bf16_copy(a, m * k);
    g->b = bf16_copy(b, k * n);
    g->c = calloc((size_t)(m * n), sizeof *g->c);
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    const dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    int ok = g->a && g->b && g->c;
    omp_set_num_threads(threads); /* oneDNN plans its partition for the caller's thread count */
    ok = ok && dnnl_engine_create(&g->eng, dnnl_cpu, 0) == dnnl_success;
    ok = ok && dnnl_stream_create(&g->stream, g->eng, dnnl_stream_default_flags) == dnnl_success;
    ok = ok && dnnl_memory_desc_init_by_tag(&a_md, 2, ad, dnnl_bf16, dnnl_ab) == dnnl_success;
    ok = ok && dnnl_memory_desc_init_by_tag(&b_md, 2, bd, dnnl_bf16, dnnl_ab) == dnnl_success;
    ok = ok && dnnl_memory_desc_init_by_tag(&c_md, 2, cd, dnnl_f32, dnnl_ab) == dnnl_success;
    ok = ok && dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &desc, NULL, g->eng, NULL) == dnnl_success;
    ok = ok && dnnl_primitive_create(&g->prim, pd) == dnnl_success;
    ok = ok && dnnl_memory_create(&g->mem[0], &a_md, g->eng, g->a) == dnnl_success;
    ok = ok && dnnl_memory_create(&g->mem[1], &b_md, g->eng, g->b) == dnnl_success;
    ok = ok && dnnl_memory_create(&g->mem[2], &c_md, g->eng, g->c) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (!ok) {
        onednn_bf16_gemm_destroy(g);
        return NULL;
    }
    return g;
}

int onednn_bf16_gemm_run(onednn_bf16_gemm *g)
{
    omp_set_num_threads(g->threads);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, g->mem[0]}, {DNNL_ARG_WEIGHTS, g->mem[1]}, {DNNL_ARG_DST, g->mem[2]}};
    if (dnnl_primitive_execute(g->prim, g->stream, 3, args) != dnnl_success) return -1;
    return dnnl_stream_wait(g->stream) == dnnl_success ? 0 : -1;
}

void onednn_bf16_gemm_destroy(onednn_bf16_gemm *g)
{
    if (!g) return;
    for (int i = 0; i < 3; i++)
        if (g->mem[i]) dnnl_memory_destroy(g->mem[i]);
    if (g->prim) dnnl_primitive_destroy(g->prim);
    if (g->stream) dnnl_stream_destroy(g->stream);
    if (g->eng) dnnl_engine_destroy(g->eng);
    free(g->a);
    free(g->b);
    free(g->c);
    free(g);
}

const char *onednn_isa_name(void)
{
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

int onednn_bf16_native(void)
{
    const unsigned want = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return ((unsigned)dnnl_get_effective_cpu_isa() & want) == want;
}
