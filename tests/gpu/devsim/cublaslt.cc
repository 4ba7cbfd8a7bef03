/*
 * The device simulator's stand-in for cuBLASLt (devsim.h): the toolkit's own cublasLt.h, implemented on
 * the CPU for the simulated devices. libmoe's CUDA host code (src/backend/cuda/gemm_lt.c, gemm_q.c,
 * cuda_backend.c), the gpu tests and bench/gpu_util.c call it unchanged.
 *
 * What it models:
 *  - the objects: handle (bound to the device current at cublasLtCreate), matmul descriptor, matrix layouts,
 *    preference, with the attribute sizes of cublasLt.h (a wrong size or an unknown attribute is
 *    CUBLAS_STATUS_INVALID_VALUE);
 *  - the heuristic: one algorithm when this "library" has a kernel for the problem on the handle's device
 *    (compute capability from MOE_DEVSIM_CC), none (and CUBLAS_STATUS_NOT_SUPPORTED) otherwise. The algorithm
 *    records what it assumed (operand types, scale modes, compute capability, the preference's pointer
 *    alignments and the workspace it needs) in cublasLtMatmulAlgo_t's opaque data; cublasLtMatmul holds the
 *    call to those assumptions;
 *  - cublasLtMatmul: validated synchronously (status codes of cublasLt.h / the cuBLAS documentation), every
 *    device pointer checked over the full extent the matmul touches, then queued on the stream as a kernel
 *    (devsim::enqueue, ENQ_KERNEL). The queued work captures everything by value (a CUDA Graph replays it);
 *    device alpha / beta and scale factors are read when it runs, on the stream's worker. The algorithm's
 *    workspace is really used (results are staged through it), so two matmuls sharing one workspace
 *    concurrently corrupt each other, as on a GPU.
 *  - numerics: column-major D = alpha op(A) op(B) + beta C per strided batch, accumulated in fp32 in k order
 *    (COMPUTE_32F: true fp32, no TF32; FAST_TF32 / FAST_16BF round the inputs first); bf16 widened exactly;
 *    FP8 / FP4 codes decoded with backend/quant_math.h (the same bits the CPU backend and the kernel
 *    simulator use), block scales read in the layouts moe_q_lt_index documents (as
 *    tests/gpu/sim/sim_lt_matmul.c reads them), every element dequantised (code x block scale) before the
 *    product; per-tensor FP8: D = (alpha scaleA scaleB) sum + beta C.
 * Status errors of cuBLASLt are not CUDA runtime errors: a refused call leaves cudaGetLastError() as it
 * was, but its reason is readable with moe_devsim_last_message().
 *
 * Citations: "cublasLt.h" is the toolkit header's own comment at the named declaration; "cuBLAS docs" is
 * the cuBLAS library documentation (docs.nvidia.com/cuda/cublas), section named.
 */
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <unordered_set>
#include <vector>

#include "devsim.h"
#include "devsim_control.h"
#include "backend/quant_math.h"

/* The handle's object (cublasLt.h declares only the tag). */
struct cublasLtContext {
    uint64_t magic;
    int device; /* the device current at cublasLtCreate */
};

namespace {

constexpr uint64_t HANDLE_MAGIC = 0x646576736c74480aull;
constexpr uint64_t ALGO_MAGIC = 0x646576736c74416cull;

/* ---------------------------------------------------------------- messages */
/* Records why a call was refused (moe_devsim_last_message) without changing the CUDA runtime's last
 * error: cuBLASLt reports through its status, not through cudaGetLastError. */
void note_msg(const char *msg)
{
    const cudaError_t prev = cudaPeekAtLastError();
    if (prev == cudaSuccess) {
        devsim::fail(cudaErrorInvalidValue, "%s", msg);
        (void)cudaGetLastError();
    } else {
        devsim::fail(prev, "%s", msg);
    }
}

cublasStatus_t refuse(cublasStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cublasStatus_t refuse(cublasStatus_t s, const char *fmt, ...)
{
    char buf[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    note_msg(buf);
    return s;
}

/* devsim::check_device without leaving a CUDA runtime error behind (its message stays). */
bool device_ok(const void *p, size_t bytes, const char *what)
{
    const cudaError_t prev = cudaPeekAtLastError();
    if (devsim::check_device(p, bytes, what) == cudaSuccess) return true;
    if (prev == cudaSuccess) (void)cudaGetLastError();
    else {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", moe_devsim_last_message());
        devsim::fail(prev, "%s", msg);
    }
    return false;
}

/* ---------------------------------------------------------------- live objects */
std::mutex reg_mu;
std::unordered_set<const void *> &registry()
{
    static std::unordered_set<const void *> live;
    return live;
}
void reg_add(const void *p)
{
    std::lock_guard<std::mutex> g(reg_mu);
    registry().insert(p);
}
bool reg_has(const void *p)
{
    std::lock_guard<std::mutex> g(reg_mu);
    return p && registry().count(p) != 0;
}
bool reg_remove(const void *p)
{
    std::lock_guard<std::mutex> g(reg_mu);
    return registry().erase(p) != 0;
}

/* ---------------------------------------------------------------- descriptors */
/* Every attribute has the type cublasLt.h gives it; the table below maps attribute -> member. */
struct MatmulDesc {
    uint64_t magic;
    int32_t compute;          /* COMPUTE_TYPE, int32_t */
    int32_t scale_type;       /* SCALE_TYPE, int32_t */
    int32_t pointer_mode;     /* POINTER_MODE, int32_t */
    int32_t transa, transb;   /* TRANSA, TRANSB, int32_t */
    int32_t transc;           /* TRANSC, int32_t */
    int32_t fill_mode;        /* FILL_MODE, int32_t */
    uint32_t epilogue;        /* EPILOGUE, uint32_t */
    const void *bias;         /* BIAS_POINTER */
    int64_t bias_batch_stride;
    void *aux;                /* EPILOGUE_AUX_POINTER */
    int64_t aux_ld, aux_batch_stride, alpha_vec_batch_stride;
    int32_t sm_count_target;
    const void *a_scale, *b_scale, *c_scale, *d_scale;
    void *amax_d;
    int32_t aux_data_type;
    void *aux_scale, *aux_amax;
    int8_t fast_accum;        /* FAST_ACCUM, int8_t */
    int32_t bias_data_type;
    int32_t a_scale_mode, b_scale_mode, c_scale_mode, d_scale_mode, aux_scale_mode;
    void *d_out_scale;
    int32_t d_out_scale_mode;
    void *emulation;          /* EMULATION_DESCRIPTOR, cublasLtEmulationDesc_t */
};
constexpr uint64_t DESC_MAGIC = 0x646576736c74446dull;

struct Slot {
    int id;
    size_t size, off;
};
#define DS_SLOT(id, field) {(int)(id), sizeof(MatmulDesc::field), offsetof(MatmulDesc, field)}
const Slot desc_slots[] = {
    DS_SLOT(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute),
    DS_SLOT(CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale_type),
    DS_SLOT(CUBLASLT_MATMUL_DESC_POINTER_MODE, pointer_mode),
    DS_SLOT(CUBLASLT_MATMUL_DESC_TRANSA, transa),
    DS_SLOT(CUBLASLT_MATMUL_DESC_TRANSB, transb),
    DS_SLOT(CUBLASLT_MATMUL_DESC_TRANSC, transc),
    DS_SLOT(CUBLASLT_MATMUL_DESC_FILL_MODE, fill_mode),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue),
    DS_SLOT(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias),
    DS_SLOT(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_batch_stride),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_batch_stride),
    DS_SLOT(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, alpha_vec_batch_stride),
    DS_SLOT(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, sm_count_target),
    DS_SLOT(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale),
    DS_SLOT(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale),
    DS_SLOT(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, c_scale),
    DS_SLOT(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale),
    DS_SLOT(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax_d),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_data_type),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, aux_scale),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, aux_amax),
    DS_SLOT(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum),
    DS_SLOT(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_data_type),
    DS_SLOT(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_scale_mode),
    DS_SLOT(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_scale_mode),
    DS_SLOT(CUBLASLT_MATMUL_DESC_C_SCALE_MODE, c_scale_mode),
    DS_SLOT(CUBLASLT_MATMUL_DESC_D_SCALE_MODE, d_scale_mode),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, aux_scale_mode),
    DS_SLOT(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, d_out_scale),
    DS_SLOT(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, d_out_scale_mode),
    DS_SLOT(CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, emulation),
};
#undef DS_SLOT

struct Layout {
    uint64_t magic;
    uint32_t type;       /* TYPE, uint32_t */
    int32_t order;       /* ORDER, int32_t */
    uint64_t rows, cols; /* ROWS, COLS, uint64_t */
    int64_t ld;          /* LD, int64_t */
    int32_t batch;       /* BATCH_COUNT, int32_t */
    int64_t stride;      /* STRIDED_BATCH_OFFSET, int64_t */
    int64_t plane_offset;/* PLANE_OFFSET, int64_t */
    uint32_t batch_mode; /* BATCH_MODE, uint32_t */
};
constexpr uint64_t LAYOUT_MAGIC = 0x646576736c744c79ull;
#define LY_SLOT(id, field) {(int)(id), sizeof(Layout::field), offsetof(Layout, field)}
const Slot layout_slots[] = {
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_TYPE, type),
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_ORDER, order),
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_ROWS, rows),
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_COLS, cols),
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_LD, ld),
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch),
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride),
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, plane_offset),
    LY_SLOT(CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, batch_mode),
};
#undef LY_SLOT

struct Pref {
    uint64_t magic;
    uint32_t search_mode;       /* SEARCH_MODE, uint32_t */
    uint64_t max_workspace;     /* MAX_WORKSPACE_BYTES, uint64_t, default 0 */
    uint32_t reduction_mask;    /* REDUCTION_SCHEME_MASK, uint32_t */
    uint32_t align_a, align_b, align_c, align_d; /* MIN_ALIGNMENT_*_BYTES, uint32_t, default 256 */
    float max_waves;            /* MAX_WAVES_COUNT, float */
    uint64_t impl_mask;         /* IMPL_MASK, uint64_t, default all */
};
constexpr uint64_t PREF_MAGIC = 0x646576736c745066ull;
#define PF_SLOT(id, field) {(int)(id), sizeof(Pref::field), offsetof(Pref, field)}
const Slot pref_slots[] = {
    PF_SLOT(CUBLASLT_MATMUL_PREF_SEARCH_MODE, search_mode),
    PF_SLOT(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace),
    PF_SLOT(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_mask),
    PF_SLOT(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a),
    PF_SLOT(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b),
    PF_SLOT(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c),
    PF_SLOT(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d),
    PF_SLOT(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, max_waves),
    PF_SLOT(CUBLASLT_MATMUL_PREF_IMPL_MASK, impl_mask),
};
#undef PF_SLOT

const Slot *find_slot(const Slot *table, size_t n, int id)
{
    for (size_t i = 0; i < n; i++)
        if (table[i].id == id) return &table[i];
    return nullptr;
}

/* cublasLt.h, every *SetAttribute: CUBLAS_STATUS_INVALID_VALUE "if buf is NULL or sizeInBytes doesn't match
 * size of internal storage for selected attribute" (an attribute this version lacks has no storage). */
cublasStatus_t set_attr(void *obj, const Slot *table, size_t n, int attr, const void *buf, size_t size,
                        const char *fn)
{
    const Slot *s = find_slot(table, n, attr);
    if (!s) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: unknown attribute %d", fn, attr);
    if (!buf || size != s->size)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: attribute %d takes %zu bytes, got %zu (buf %p)", fn, attr,
                      s->size, size, buf);
    memcpy((char *)obj + s->off, buf, s->size);
    return CUBLAS_STATUS_SUCCESS;
}

/* cublasLt.h, every *GetAttribute: INVALID_VALUE "if sizeInBytes is 0 and sizeWritten is NULL, or if
 * sizeInBytes is non-zero and buf is NULL or sizeInBytes doesn't match size of internal storage";
 * sizeInBytes 0 asks for the size. */
cublasStatus_t get_attr(const void *obj, const Slot *table, size_t n, int attr, void *buf, size_t size,
                        size_t *written, const char *fn)
{
    const Slot *s = find_slot(table, n, attr);
    if (!s) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: unknown attribute %d", fn, attr);
    if (size == 0) {
        if (!written) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: sizeInBytes 0 and sizeWritten NULL", fn);
        *written = s->size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != s->size)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: attribute %d has %zu bytes, asked for %zu (buf %p)", fn,
                      attr, s->size, size, buf);
    memcpy(buf, (const char *)obj + s->off, s->size);
    if (written) *written = s->size;
    return CUBLAS_STATUS_SUCCESS;
}

MatmulDesc *desc_of(cublasLtMatmulDesc_t d)
{
    MatmulDesc *p = reinterpret_cast<MatmulDesc *>(d);
    return reg_has(p) && p->magic == DESC_MAGIC ? p : nullptr;
}
Layout *layout_of(cublasLtMatrixLayout_t l)
{
    Layout *p = reinterpret_cast<Layout *>(l);
    return reg_has(p) && p->magic == LAYOUT_MAGIC ? p : nullptr;
}
Pref *pref_of(cublasLtMatmulPreference_t l)
{
    Pref *p = reinterpret_cast<Pref *>(l);
    return reg_has(p) && p->magic == PREF_MAGIC ? p : nullptr;
}
cublasLtContext *handle_of(cublasLtHandle_t h) { return reg_has(h) && h->magic == HANDLE_MAGIC ? h : nullptr; }

/* ---------------------------------------------------------------- the problem */
enum Kind { K_F32 = 1, K_BF16 = 2, K_FP8 = 3, K_FP4 = 4 };

bool is_fp8(uint32_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
/* bits per element of a supported type (0: not one of this stand-in's types) */
int type_bits(uint32_t t)
{
    switch (t) {
    case CUDA_R_32F: return 32;
    case CUDA_R_16BF: return 16;
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 8;
    case CUDA_R_4F_E2M1: return 4;
    default: return 0;
    }
}
/* bytes of `elems` elements of `bits` (sub-byte types packed) */
uint64_t bytes_of(uint64_t elems, int bits) { return (elems * (uint64_t)bits + 7) / 8; }

int32_t moe_scaling_of(int32_t mode)
{
    switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return MOE_QSCALE_BLOCK_1X128;
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return MOE_QSCALE_BLOCK_128X128;
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return MOE_QSCALE_MX32;
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return MOE_QSCALE_NV16;
    default: return MOE_QSCALE_TENSOR;
    }
}
const char *mode_name(int32_t mode)
{
    switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return "VEC16_UE4M3";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return "VEC32_UE8M0";
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return "OUTER_VEC_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "VEC128_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "BLK128x128_32F";
    default: return "unknown";
    }
}

struct Mat { /* one operand as the matmul reads it */
    uint32_t type;
    int bits;
    uint64_t rows, cols;
    int64_t ld, stride;
};

struct Problem {
    int cc;
    int kind;
    int32_t compute, pointer_mode;
    int ta, tb; /* 1: transposed (CUBLAS_OP_T, or OP_C on real data) */
    int64_t m, n, k;
    int32_t batch;
    Mat a, b, c, d;
    int32_t mode_a, mode_b; /* scale modes (FP8 / FP4) */
    uint32_t need_align;    /* pointer alignment every kernel of this kind needs (bytes) */
    uint64_t impl_flags;    /* cublasLtNumericalImplFlags_t of the algorithm */
    uint64_t fingerprint;   /* what an algorithm is tied to */
};

int op_of(int32_t t) { return t == CUBLAS_OP_N ? 0 : 1; }

/* Checks a layout on its own: cublasLt.h, cublasLtMatrixLayoutAttribute_t. */
cublasStatus_t check_layout(const Layout &l, const char *name)
{
    /* ORDER: only CUBLASLT_ORDER_COL is simulated (the other orders are IMMA tile layouts) */
    if (l.order != CUBLASLT_ORDER_COL)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: memory order %d (only CUBLASLT_ORDER_COL is simulated)", name,
                      l.order);
    /* BATCH_MODE: 0 is strided batching; pointer arrays are not simulated; PLANE_OFFSET: planar complex only */
    if (l.batch_mode != 0 || l.plane_offset != 0)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: batch mode %u / plane offset %lld not simulated", name,
                      l.batch_mode, (long long)l.plane_offset);
    /* ROWS / COLS: "Usually only values that can be expressed as int32_t are supported" */
    if (l.rows > (uint64_t)INT32_MAX || l.cols > (uint64_t)INT32_MAX)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: %llu x %llu exceeds int32", name, (unsigned long long)l.rows,
                      (unsigned long long)l.cols);
    /* LD: "Currently only non-negative values are supported, must be large enough so that matrix memory
     * locations are not overlapping (e.g. greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS in case of
     * CUBLASLT_ORDER_COL)" */
    if (l.ld < 0 || (uint64_t)l.ld < (l.rows ? l.rows : 1))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: leading dimension %lld < rows %llu (column-major)", name,
                      (long long)l.ld, (unsigned long long)l.rows);
    /* BATCH_COUNT: int32_t, default 1 (a count below 1 is no batch); STRIDED_BATCH_OFFSET: the stride to the
     * next matrix (negative strides are not simulated) */
    if (l.batch < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: batch count %d < 1", name, l.batch);
    if (l.stride < 0)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: negative batch stride %lld", name, (long long)l.stride);
    return CUBLAS_STATUS_SUCCESS;
}

Mat mat_of(const Layout &l) { return Mat{l.type, type_bits(l.type), l.rows, l.cols, l.ld, l.stride}; }

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull; }

/* Everything the heuristic and the matmul decide from the descriptors alone. SUCCESS: *p is the problem this
 * stand-in has a kernel for on a device of compute capability cc. */
cublasStatus_t analyze(int cc, const MatmulDesc &md, const Layout &A, const Layout &B, const Layout &C,
                       const Layout &D, Problem *p)
{
    cublasStatus_t s;
    if ((s = check_layout(A, "A")) || (s = check_layout(B, "B")) || (s = check_layout(C, "C")) ||
        (s = check_layout(D, "D")))
        return s;
    /* cublasLt.h TRANSA / TRANSB: cublasOperation_t (OP_C on real data is OP_T); TRANSC: "Currently only
     * CUBLAS_OP_N is supported"; FILL_MODE: only the full matrix is a GEMM */
    for (int32_t t : {md.transa, md.transb})
        if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "matmul descriptor: transpose %d is no cublasOperation_t", t);
    if (md.transc != CUBLAS_OP_N)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "TRANSC %d: only CUBLAS_OP_N is supported (cublasLt.h)", md.transc);
    if (md.fill_mode != CUBLAS_FILL_MODE_FULL)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FILL_MODE %d: only CUBLAS_FILL_MODE_FULL is simulated", md.fill_mode);
    /* EPILOGUE: only CUBLASLT_EPILOGUE_DEFAULT is simulated (bias / activation epilogues are not) */
    if (md.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue %u: only CUBLASLT_EPILOGUE_DEFAULT is simulated",
                      md.epilogue);
    /* POINTER_MODE: host or device scalars (the vector modes are not simulated) */
    if (md.pointer_mode != CUBLASLT_POINTER_MODE_HOST && md.pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "pointer mode %d: host or device scalars only", md.pointer_mode);
    if (md.emulation) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "emulation descriptors are not simulated");

    Problem q{};
    q.cc = cc;
    q.compute = md.compute;
    q.pointer_mode = md.pointer_mode;
    q.ta = op_of(md.transa), q.tb = op_of(md.transb);
    q.a = mat_of(A), q.b = mat_of(B), q.c = mat_of(C), q.d = mat_of(D);
    /* cuBLAS docs, cublasLtMatmul(): D = alpha op(A) op(B) + beta C with op(A) m x k, op(B) k x n, C and D
     * m x n: layouts that disagree are "parameters in conflict" (cublasLt.h, cublasLtMatmul: INVALID_VALUE) */
    q.m = (int64_t)(q.ta ? A.cols : A.rows);
    q.k = (int64_t)(q.ta ? A.rows : A.cols);
    const int64_t kb = (int64_t)(q.tb ? B.cols : B.rows);
    q.n = (int64_t)(q.tb ? B.rows : B.cols);
    if (kb != q.k || (int64_t)C.rows != q.m || (int64_t)C.cols != q.n || (int64_t)D.rows != q.m ||
        (int64_t)D.cols != q.n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "shapes: op(A) %lld x %lld, op(B) %lld x %lld, C %llu x %llu, D %llu x %llu do not multiply",
                      (long long)q.m, (long long)q.k, (long long)kb, (long long)q.n, (unsigned long long)C.rows,
                      (unsigned long long)C.cols, (unsigned long long)D.rows, (unsigned long long)D.cols);
    /* strided batches: every matrix carries the same BATCH_COUNT */
    if (A.batch != D.batch || B.batch != D.batch || C.batch != D.batch)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "batch counts A %d, B %d, C %d, D %d differ", A.batch, B.batch,
                      C.batch, D.batch);
    q.batch = D.batch;
    /* cuBLAS docs, cublasLtMatmul(): C and D have the same type (out-of-place: "the same data type, number of
     * rows, number of columns, batch size, and memory order"; only the leading dimension may differ) */
    if (C.type != D.type)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C type %u differs from D type %u", C.type, D.type);
    /* cublasLtMatmulDescCreate(computeType, scaleType): every combination simulated scales in fp32 */
    if (md.scale_type != CUDA_R_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "scale type %d: only CUDA_R_32F is simulated", md.scale_type);
    const bool d_ok = D.type == CUDA_R_32F || D.type == CUDA_R_16BF;
    const int32_t ma = md.a_scale_mode, mb = md.b_scale_mode;
    q.mode_a = ma, q.mode_b = mb;
    q.need_align = 1;

    if (A.type == CUDA_R_32F && B.type == CUDA_R_32F) {
        /* cuBLAS docs, cublasLtMatmul() data types: A/B/C/D CUDA_R_32F with CUBLAS_COMPUTE_32F(_PEDANTIC),
         * _FAST_TF32, _FAST_16BF (_FAST_16F is not simulated) */
        if (D.type != CUDA_R_32F)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "fp32 A/B with C/D type %u: only CUDA_R_32F", D.type);
        if (md.compute != CUBLAS_COMPUTE_32F && md.compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
            md.compute != CUBLAS_COMPUTE_32F_FAST_TF32 && md.compute != CUBLAS_COMPUTE_32F_FAST_16BF)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "fp32 A/B with compute type %d", md.compute);
        q.kind = K_F32;
        q.need_align = 4;
        q.impl_flags = md.compute == CUBLAS_COMPUTE_32F_FAST_TF32
                           ? CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32
                       : md.compute == CUBLAS_COMPUTE_32F_FAST_16BF
                           ? CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF
                           : CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F;
    } else if (A.type == CUDA_R_16BF && B.type == CUDA_R_16BF) {
        /* cuBLAS docs, cublasLtMatmul() data types: A/B CUDA_R_16BF, C/D CUDA_R_16BF or CUDA_R_32F,
         * CUBLAS_COMPUTE_32F(_PEDANTIC), scale CUDA_R_32F */
        if (!d_ok) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "bf16 A/B with C/D type %u", D.type);
        if (md.compute != CUBLAS_COMPUTE_32F && md.compute != CUBLAS_COMPUTE_32F_PEDANTIC)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "bf16 A/B with compute type %d", md.compute);
        q.kind = K_BF16;
        q.need_align = 2;
        q.impl_flags = CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF;
    } else if (is_fp8(A.type) && is_fp8(B.type)) {
        /* cuBLAS docs, cublasLtMatmul() "FP8" data types: A/B E4M3 or E5M2 but not both E5M2 */
        if (A.type == CUDA_R_8F_E5M2 && B.type == CUDA_R_8F_E5M2)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8: E5M2 x E5M2 has no kernel (cuBLAS docs, cublasLtMatmul)");
        /* FP8 tensor cores exist from compute capability 8.9 (Ada, Hopper) */
        if (cc < 89) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8 matmul on compute capability %d < 8.9", cc);
        q.kind = K_FP8;
        q.impl_flags = CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA |
                       (A.type == CUDA_R_8F_E4M3 || B.type == CUDA_R_8F_E4M3 ? CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E4M3
                                                                            : 0) |
                       (A.type == CUDA_R_8F_E5M2 || B.type == CUDA_R_8F_E5M2 ? CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E5M2
                                                                            : 0);
    } else if (A.type == CUDA_R_4F_E2M1 && B.type == CUDA_R_4F_E2M1) {
        /* FP4 (NVFP4) block-scaled tensor cores: compute capability 10.0+ (cuBLAS docs, cublasLtMatmul(),
         * block-scaled FP4 data types) */
        if (cc < 100) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP4 matmul on compute capability %d < 10.0", cc);
        q.kind = K_FP4;
        q.impl_flags = CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA;
    } else {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "operand types A %u, B %u have no simulated kernel", A.type, B.type);
    }

    if (q.kind == K_F32 || q.kind == K_BF16) {
        /* cublasLt.h, A/B/C/D_SCALE_POINTER and AMAX_D_POINTER: "If set for an unsupported matrix data, scale,
         * and compute type combination, calling cublasLtMatmul() will return CUBLAS_INVALID_VALUE" */
        if (md.a_scale || md.b_scale || md.c_scale || md.d_scale || md.amax_d || md.d_out_scale)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "scale / amax pointers set for a %s matmul (cublasLt.h: "
                          "INVALID_VALUE for an unsupported type combination)", q.kind == K_F32 ? "fp32" : "bf16");
        if (ma || mb || md.c_scale_mode || md.d_scale_mode)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "scale modes %d/%d on non-narrow operands", ma, mb);
    } else {
        /* cuBLAS docs, cublasLtMatmul(), FP8 requirements: compute type CUBLAS_COMPUTE_32F, scale type
         * CUDA_R_32F (checked above); C/D: CUDA_R_32F or CUDA_R_16BF here (FP8 outputs are not simulated) */
        if (md.compute != CUBLAS_COMPUTE_32F)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8/FP4 matmul with compute type %d: needs CUBLAS_COMPUTE_32F",
                          md.compute);
        if (!d_ok) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8/FP4 matmul with D type %u (fp32 / bf16 only)", D.type);
        /* C/D scales and amax only apply to FP8 outputs: cublasLt.h, C/D_SCALE_POINTER, AMAX_D_POINTER
         * "If set for an unsupported ... combination, cublasLtMatmul() will return CUBLAS_INVALID_VALUE" */
        if (md.c_scale || md.d_scale || md.amax_d || md.d_out_scale)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "C/D scale or amax pointer with a %s output",
                          D.type == CUDA_R_32F ? "fp32" : "bf16");
        /* cuBLAS docs, cublasLtMatmul(), FP8: "A must be transposed and B non-transposed (The "TN" format)" on
         * compute capability below 10.0 (Ada, Hopper); Blackwell takes every layout for FP8. FP4 codes are
         * packed along k, so FP4 is TN on every device. */
        if ((q.kind == K_FP4 || cc < 100) && !(q.ta == 1 && q.tb == 0))
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s matmul with transa %d, transb %d: only the \"TN\" layout "
                          "(A transposed, B not) on compute capability %d (cuBLAS docs, cublasLtMatmul)",
                          q.kind == K_FP4 ? "FP4" : "FP8", md.transa, md.transb, cc);
        /* cublasLtMatmulMatrixScale_t and cuBLAS docs, cublasLtMatmul() "scaling modes": the supported pairs */
        const bool blk_a = ma == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || ma == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        const bool blk_b = mb == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || mb == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        if (q.kind == K_FP4) {
            /* NVFP4: VEC16_UE4M3 on both operands */
            if (ma != CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 || mb != CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3)
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP4 with scale modes %s x %s: needs VEC16_UE4M3 on both",
                              mode_name(ma), mode_name(mb));
        } else if (ma == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && mb == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
            /* tensor-wide scaling: everywhere FP8 exists (cc >= 8.9, checked above) */
        } else if (blk_a && blk_b) {
            /* blockwise 1x128 / 128x128 (cuBLAS 12.9+): Hopper (compute capability 9.x) only, pairs 1D x 2D,
             * 2D x 1D and 1D x 1D; 2D x 2D has no kernel */
            if (cc < 90 || cc >= 100)
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8 block scaling %s x %s only on compute capability 9.x "
                              "(this device: %d)", mode_name(ma), mode_name(mb), cc);
            if (ma == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && mb == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8 block scaling BLK128x128 x BLK128x128 has no kernel");
        } else if (ma == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 && mb == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0) {
            /* MXFP8: Blackwell (compute capability 10.0+) */
            if (cc < 100)
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "MXFP8 (VEC32_UE8M0) on compute capability %d < 10.0", cc);
        } else {
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8 scale modes %s x %s are not a supported pair",
                          mode_name(ma), mode_name(mb));
        }
        if (ma != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && q.batch > 1)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "batched block-scaled matmuls are not simulated");
        /* cuBLAS docs, cublasLtMatmul(), FP8: "All matrix dimensions must meet the optimal requirements listed in
         * Tensor Core Usage (i.e. pointers and matrix dimension must support 16-byte alignment)": leading
         * dimensions and batch strides in bytes multiples of 16 (pointers: checked in cublasLtMatmul) */
        const Mat *ms[4] = {&q.a, &q.b, &q.c, &q.d};
        const char *names = "ABCD";
        for (int i = 0; i < 4; i++) {
            const Mat &x = *ms[i];
            if ((x.ld * x.bits) % 128 != 0 || (q.batch > 1 && (x.stride * x.bits) % 128 != 0))
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "FP8/FP4 matmul: %c's leading dimension %lld or batch stride "
                              "%lld is not a multiple of 16 bytes (cuBLAS docs, cublasLtMatmul: 16-byte alignment)",
                              names[i], (long long)x.ld, (long long)x.stride);
        }
        q.need_align = 16;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t v : {(uint64_t)q.kind, (uint64_t)A.type, (uint64_t)B.type, (uint64_t)D.type, (uint64_t)md.compute,
                       (uint64_t)(uint32_t)ma, (uint64_t)(uint32_t)mb, (uint64_t)cc})
        h = mix(h, v);
    q.fingerprint = h;
    *p = q;
    return CUBLAS_STATUS_SUCCESS;
}

/* The workspace the simulated algorithm uses: results are staged through it (as split-k kernels do), up to
 * 1 MiB, never more than the preference allows (cublasLt.h, MAX_WORKSPACE_BYTES: "default: 0 - no workspace
 * allowed"). */
uint64_t workspace_need(uint64_t max_ws)
{
    const uint64_t cap = (uint64_t)1 << 20, w = max_ws & ~(uint64_t)255;
    return w < cap ? w : cap;
}

/* largest power of two <= v, in [1, 256] */
uint32_t pow2_align(uint32_t v)
{
    uint32_t a = 1;
    while (a * 2 <= v && a < 256) a *= 2;
    return a;
}

/* The opaque algorithm (cublasLtMatmulAlgo_t::data, 8 x uint64_t). */
struct AlgoData {
    uint64_t magic;
    uint64_t fingerprint;
    uint64_t workspace;
    uint32_t align[4]; /* A, B, C, D: alignments the algorithm assumes */
    uint64_t reserved[3];
};
static_assert(sizeof(AlgoData) <= sizeof(cublasLtMatmulAlgo_t), "algo data fits the opaque struct");

/* ---------------------------------------------------------------- numerics */
float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* fp32 -> TF32 (10 mantissa bits, round to nearest, ties away: the tensor cores' cvt.rna.tf32.f32) */
float to_tf32(float x)
{
    uint32_t u = f_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return x;
    u = (u + 0x1000u) & 0xFFFFE000u;
    return bits_f(u);
}
/* fp32 -> bf16 bits, round to nearest even (NaN stays NaN) */
uint16_t to_bf16_bits(float x)
{
    uint32_t u = f_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float bf16_f(uint16_t h) { return bits_f((uint32_t)h << 16); }

int32_t qfmt_of(uint32_t t) { return t == CUDA_R_8F_E5M2 ? MOE_QFMT_E5M2 : t == CUDA_R_4F_E2M1 ? MOE_QFMT_E2M1 : MOE_QFMT_E4M3; }

/* Element `off` (in elements) of a matrix of type t at base. */
float load(const void *base, uint32_t t, int64_t off, int32_t compute)
{
    switch (t) {
    case CUDA_R_32F: {
        const float x = ((const float *)base)[off];
        if (compute == CUBLAS_COMPUTE_32F_FAST_TF32) return to_tf32(x);
        if (compute == CUBLAS_COMPUTE_32F_FAST_16BF) return bf16_f(to_bf16_bits(x));
        return x;
    }
    case CUDA_R_16BF: return bf16_f(((const uint16_t *)base)[off]);
    case CUDA_R_4F_E2M1: {
        const uint8_t byte = ((const uint8_t *)base)[off >> 1];
        return moe_q_decode((byte >> (4 * (off & 1))) & 0xFu, MOE_QFMT_E2M1);
    }
    default: return moe_q_decode(((const uint8_t *)base)[off], qfmt_of(t));
    }
}

/* The decode scale of element (outer, p) of an operand with `outer_n` rows of k (block modes). */
float block_scale(const void *scales, int32_t mode, int64_t outer_n, int64_t k, int64_t outer, int64_t p)
{
    const int32_t sc = moe_scaling_of(mode);
    const int64_t bc = moe_q_block_cols(sc);
    const int64_t i = sc == MOE_QSCALE_BLOCK_128X128 ? outer / 128 : outer, j = p / bc;
    const int64_t o = moe_q_lt_index(sc, outer_n, k, i, j);
    if (sc == MOE_QSCALE_MX32) return moe_q_e8m0(((const uint8_t *)scales)[o]);
    if (sc == MOE_QSCALE_NV16) return moe_q_decode(((const uint8_t *)scales)[o], MOE_QFMT_E4M3);
    return ((const float *)scales)[o];
}

/* Bytes of an operand's block scales in cuBLASLt's layout (moe_q_lt_count; 4 for a scalar). */
uint64_t scale_bytes(int32_t mode, int64_t outer_n, int64_t k)
{
    if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) return 4;
    const int32_t sc = moe_scaling_of(mode);
    const uint64_t n = (uint64_t)moe_q_lt_count(sc, outer_n, k);
    return sc == MOE_QSCALE_MX32 || sc == MOE_QSCALE_NV16 ? n : 4 * n;
}

/* Bytes spanned by `batch` matrices of x (from the base pointer). */
uint64_t extent_bytes(const Mat &x, int32_t batch)
{
    if (x.rows == 0 || x.cols == 0) return 0;
    const uint64_t one = (x.cols - 1) * (uint64_t)x.ld + x.rows;
    return bytes_of((uint64_t)(batch - 1) * (uint64_t)x.stride + one, x.bits);
}

/* The work one cublasLtMatmul queues: all by value. */
struct Work {
    Problem p;
    const void *a, *b, *c;
    void *d;
    const void *alpha_p, *beta_p; /* device scalars (POINTER_MODE_DEVICE) */
    float alpha, beta;            /* host scalars, read at the call */
    const void *a_scale, *b_scale;
    void *workspace;
    uint64_t ws_bytes; /* what the algorithm stages through (0: none) */
    bool read_c;
};

bool still_device(const void *p, uint64_t bytes)
{
    if (!p || bytes == 0) return true;
    return devsim::device_at_run(p, (size_t)bytes); /* a free queued after this work has not run yet */
}

/* Decodes op(X) of one batch into rows of k floats: out[outer * k + p]. A: outer = i (m), B: outer = j (n). */
void decode(const Work &w, bool is_a, int32_t bi, std::vector<float> &out)
{
    const Problem &p = w.p;
    const Mat &x = is_a ? p.a : p.b;
    const int t = is_a ? p.ta : p.tb;
    const int64_t outer_n = is_a ? p.m : p.n, k = p.k;
    const void *base = is_a ? w.a : w.b;
    const int32_t mode = is_a ? p.mode_a : p.mode_b;
    const void *scales = is_a ? w.a_scale : w.b_scale;
    const bool blocked = (p.kind == K_FP8 || p.kind == K_FP4) && mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    /* A stored rows x cols column-major: op(A)(i, p) = N ? A(i, p) : A(p, i); op(B)(p, j) = N ? B(p, j) : B(j, p) */
    int64_t s_outer, s_k;
    if (is_a) s_outer = t ? x.ld : 1, s_k = t ? 1 : x.ld;
    else s_outer = t ? 1 : x.ld, s_k = t ? x.ld : 1;
    const int64_t off0 = (int64_t)bi * x.stride;
    out.resize((size_t)(outer_n * k));
    for (int64_t o = 0; o < outer_n; o++)
        for (int64_t q = 0; q < k; q++) {
            float v = load(base, x.type, off0 + o * s_outer + q * s_k, p.compute);
            if (blocked) v = v * block_scale(scales, mode, outer_n, k, o, q);
            out[(size_t)(o * k + q)] = v;
        }
}

cudaError_t run(const Work &w)
{
    const Problem &p = w.p;
    /* the memory must still be the device's when the kernel runs (freed in stream order before it: a fault) */
    const Mat *ms[3] = {&p.a, &p.b, &p.d};
    const void *ps[3] = {w.a, w.b, w.d};
    for (int i = 0; i < 3; i++)
        if (!still_device(ps[i], extent_bytes(*ms[i], p.batch))) return cudaErrorIllegalAddress;
    if (w.read_c && !still_device(w.c, extent_bytes(p.c, p.batch))) return cudaErrorIllegalAddress;
    if (!still_device(w.workspace, w.ws_bytes)) return cudaErrorIllegalAddress;
    float alpha = w.alpha, beta = w.beta;
    if (p.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE) { /* read when the work runs */
        if (!still_device(w.alpha_p, 4) || !still_device(w.beta_p, 4)) return cudaErrorIllegalAddress;
        alpha = *(const float *)w.alpha_p;
        beta = *(const float *)w.beta_p;
    }
    float scale = alpha;
    if (p.kind == K_FP8 && p.mode_a == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
        /* cublasLt.h, A/B_SCALE_POINTER: "If not specified, or set to NULL, the scaling factor is assumed to be 1" */
        const float sa = w.a_scale ? *(const float *)w.a_scale : 1.0f;
        const float sb = w.b_scale ? *(const float *)w.b_scale : 1.0f;
        scale = alpha * sa * sb;
    }
    const int64_t m = p.m, n = p.n, k = p.k;
    if (m == 0 || n == 0) return cudaSuccess;
    std::vector<float> fa, fb, local;
    /* results go through the workspace when it holds at least one column */
    const int64_t ws_cols = w.workspace ? (int64_t)(w.ws_bytes / (4 * (uint64_t)m)) : 0;
    const int64_t chunk = ws_cols > 0 ? (ws_cols < n ? ws_cols : n) : n;
    float *stage = nullptr;
    if (ws_cols > 0) stage = (float *)w.workspace;
    else {
        local.resize((size_t)(m * n));
        stage = local.data();
    }
    for (int32_t bi = 0; bi < p.batch; bi++) {
        decode(w, true, bi, fa);
        decode(w, false, bi, fb);
        const int64_t c0 = (int64_t)bi * p.c.stride, d0 = (int64_t)bi * p.d.stride;
        for (int64_t j0 = 0; j0 < n; j0 += chunk) {
            const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
            for (int64_t j = j0; j < j1; j++) {
                const float *bj = fb.data() + j * k;
                for (int64_t i = 0; i < m; i++) {
                    const float *ai = fa.data() + i * k;
                    float acc = 0.0f;
                    for (int64_t q = 0; q < k; q++) {
                        const float prod = ai[q] * bj[q];
                        acc += prod;
                    }
                    float v = scale * acc;
                    if (w.read_c) {
                        const int64_t co = c0 + j * p.c.ld + i;
                        const float cv = p.c.type == CUDA_R_32F ? ((const float *)w.c)[co]
                                                                : bf16_f(((const uint16_t *)w.c)[co]);
                        const float bc = beta * cv;
                        v = v + bc;
                    }
                    stage[(j - j0) * m + i] = v;
                }
            }
            for (int64_t j = j0; j < j1; j++)
                for (int64_t i = 0; i < m; i++) {
                    const float v = stage[(j - j0) * m + i];
                    const int64_t od = d0 + j * p.d.ld + i;
                    if (p.d.type == CUDA_R_32F) ((float *)w.d)[od] = v;
                    else ((uint16_t *)w.d)[od] = to_bf16_bits(v);
                }
        }
    }
    return cudaSuccess;
}

bool aligned(const void *p, uint32_t a) { return ((uintptr_t)p % a) == 0; }

} // namespace

/* ================================================================ the API (cublasLt.h) */
extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: lightHandle is NULL");
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtCreate: no CUDA device");
    cublasLtContext *h = new (std::nothrow) cublasLtContext;
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    /* cuBLAS docs, 2.1.2 "cuBLAS Context": a handle belongs to the device current when it is created */
    h->magic = HANDLE_MAGIC;
    h->device = devsim::current_device();
    reg_add(h);
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    /* cuBLAS docs, cublasLtDestroy(): CUBLAS_STATUS_NOT_INITIALIZED "if the cuBLASLt handle has not been
     * initialized" */
    if (!handle_of(lightHandle) || !reg_remove(lightHandle))
        return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: %p is not a live cuBLASLt handle",
                      (void *)lightHandle);
    lightHandle->magic = 0;
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "unknown cuBLAS status";
}

size_t CUBLASWINAPI cublasLtGetVersion(void) { return (size_t)CUBLAS_VERSION; }
size_t CUBLASWINAPI cublasLtGetCudartVersion(void) { return (size_t)CUDART_VERSION; }

cublasStatus_t CUBLASWINAPI cublasLtGetProperty(libraryPropertyType type, int *value)
{
    if (!value) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtGetProperty: value is NULL");
    switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; break;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; break;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; break;
    default: return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtGetProperty: property %d", (int)type);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- matmul descriptor */
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType)
{
    if (!matmulDesc) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: matmulDesc is NULL");
    MatmulDesc *d = new (std::nothrow) MatmulDesc();
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    /* defaults: cublasLt.h, cublasLtMatmulDescAttributes_t */
    d->magic = DESC_MAGIC;
    d->compute = (int32_t)computeType;
    d->scale_type = (int32_t)scaleType;
    d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = d->transc = CUBLAS_OP_N;
    d->fill_mode = CUBLAS_FILL_MODE_FULL;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->aux_data_type = -1;
    d->bias_data_type = -1;
    reg_add(d);
    *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    if (!matmulDesc) return CUBLAS_STATUS_SUCCESS;
    MatmulDesc *d = desc_of(matmulDesc);
    if (!d || !reg_remove(d))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy: %p is not a live descriptor",
                      (void *)matmulDesc);
    d->magic = 0;
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                           size_t sizeInBytes)
{
    MatmulDesc *d = desc_of(matmulDesc);
    if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: not a live descriptor");
    return set_attr(d, desc_slots, sizeof desc_slots / sizeof desc_slots[0], (int)attr, buf, sizeInBytes,
                    "cublasLtMatmulDescSetAttribute");
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, void *buf,
                                                           size_t sizeInBytes, size_t *sizeWritten)
{
    MatmulDesc *d = desc_of(matmulDesc);
    if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescGetAttribute: not a live descriptor");
    return get_attr(d, desc_slots, sizeof desc_slots / sizeof desc_slots[0], (int)attr, buf, sizeInBytes,
                    sizeWritten, "cublasLtMatmulDescGetAttribute");
}

/* ---------------------------------------------------------------- matrix layouts */
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!matLayout) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: matLayout is NULL");
    Layout *l = new (std::nothrow) Layout();
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    /* defaults: cublasLt.h, cublasLtMatrixLayoutAttribute_t (ORDER_COL, BATCH_COUNT 1, stride 0); the ld rule
     * is checked where the layout is used (cublasLtMatrixLayoutCreate returns only ALLOC_FAILED / SUCCESS) */
    l->magic = LAYOUT_MAGIC;
    l->type = (uint32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->rows = rows, l->cols = cols, l->ld = ld;
    l->batch = 1;
    reg_add(l);
    *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    if (!matLayout) return CUBLAS_STATUS_SUCCESS;
    Layout *l = layout_of(matLayout);
    if (!l || !reg_remove(l))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy: %p is not a live layout",
                      (void *)matLayout);
    l->magic = 0;
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                             size_t sizeInBytes)
{
    Layout *l = layout_of(matLayout);
    if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutSetAttribute: not a live layout");
    return set_attr(l, layout_slots, sizeof layout_slots / sizeof layout_slots[0], (int)attr, buf, sizeInBytes,
                    "cublasLtMatrixLayoutSetAttribute");
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                             size_t sizeInBytes, size_t *sizeWritten)
{
    Layout *l = layout_of(matLayout);
    if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutGetAttribute: not a live layout");
    return get_attr(l, layout_slots, sizeof layout_slots / sizeof layout_slots[0], (int)attr, buf, sizeInBytes,
                    sizeWritten, "cublasLtMatrixLayoutGetAttribute");
}

/* ---------------------------------------------------------------- preferences */
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: pref is NULL");
    Pref *p = new (std::nothrow) Pref();
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    /* defaults: cublasLt.h, cublasLtMatmulPreferenceAttributes_t */
    p->magic = PREF_MAGIC;
    p->search_mode = CUBLASLT_SEARCH_BEST_FIT;
    p->max_workspace = 0;
    p->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    p->align_a = p->align_b = p->align_c = p->align_d = 256;
    p->impl_mask = ~(uint64_t)0;
    reg_add(p);
    *pref = reinterpret_cast<cublasLtMatmulPreference_t>(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    if (!pref) return CUBLAS_STATUS_SUCCESS;
    Pref *p = pref_of(pref);
    if (!p || !reg_remove(p))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy: %p is not a live preference",
                      (void *)pref);
    p->magic = 0;
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void *buf, size_t sizeInBytes)
{
    Pref *p = pref_of(pref);
    if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceSetAttribute: not a live preference");
    return set_attr(p, pref_slots, sizeof pref_slots / sizeof pref_slots[0], (int)attr, buf, sizeInBytes,
                    "cublasLtMatmulPreferenceSetAttribute");
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr, void *buf,
                                                                 size_t sizeInBytes, size_t *sizeWritten)
{
    Pref *p = pref_of(pref);
    if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceGetAttribute: not a live preference");
    return get_attr(p, pref_slots, sizeof pref_slots / sizeof pref_slots[0], (int)attr, buf, sizeInBytes,
                    sizeWritten, "cublasLtMatmulPreferenceGetAttribute");
}

/* ---------------------------------------------------------------- heuristic */
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int *returnAlgoCount)
{
    cublasLtContext *h = handle_of(lightHandle);
    if (!h) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmulAlgoGetHeuristic: not a live handle");
    /* cublasLt.h, cublasLtMatmulAlgoGetHeuristic: INVALID_VALUE "if requestedAlgoCount is less or equal to zero" */
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: requestedAlgoCount %d, results %p, "
                      "returnAlgoCount %p", requestedAlgoCount, (void *)heuristicResultsArray, (void *)returnAlgoCount);
    *returnAlgoCount = 0;
    const MatmulDesc *md = desc_of(operationDesc);
    const Layout *A = layout_of(Adesc), *B = layout_of(Bdesc), *C = layout_of(Cdesc), *D = layout_of(Ddesc);
    const Pref *pf = pref_of(preference);
    if (!md || !A || !B || !C || !D || !pf)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoGetHeuristic: a descriptor, layout or "
                      "preference is not live");
    Problem p;
    /* cublasLt.h: NOT_SUPPORTED "if no heuristic function available for current configuration" (no algorithm) */
    cublasStatus_t s = analyze(devsim::compute_capability(h->device), *md, *A, *B, *C, *D, &p);
    if (s) return s;
    if (pf->search_mode != CUBLASLT_SEARCH_BEST_FIT)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "search mode %u: only CUBLASLT_SEARCH_BEST_FIT is simulated",
                      pf->search_mode);
    /* cublasLt.h, MIN_ALIGNMENT_*_BYTES: "Selecting a smaller value will exclude algorithms that can not work
     * with matrix A that is not as strictly aligned as they need": FP8 / FP4 kernels need 16 bytes (cuBLAS docs,
     * cublasLtMatmul(), FP8 requirements), the others their element size */
    const uint32_t al[4] = {pf->align_a, pf->align_b, pf->align_c, pf->align_d};
    const uint32_t natural[4] = {p.need_align, p.need_align, (uint32_t)(p.d.bits / 8), (uint32_t)(p.d.bits / 8)};
    AlgoData ad{};
    for (int i = 0; i < 4; i++) {
        const uint32_t need = p.kind == K_FP8 || p.kind == K_FP4 ? 16 : natural[i];
        if (al[i] < need)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm: matrix %c aligned to %u bytes, the kernels need %u",
                          "ABCD"[i], al[i], need);
        ad.align[i] = pow2_align(al[i]);
    }
    /* cublasLt.h, IMPL_MASK: "Filters heuristic result to only include algorithms that use the allowed
     * implementations" */
    if ((p.impl_flags & ~pf->impl_mask) != 0)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm within implementation mask 0x%llx (needs 0x%llx)",
                      (unsigned long long)pf->impl_mask, (unsigned long long)p.impl_flags);
    ad.magic = ALGO_MAGIC;
    ad.fingerprint = p.fingerprint;
    /* cublasLt.h, cublasLtMatmulHeuristicResult_t::workspaceSize: "Actual size of workspace memory required",
     * within MAX_WORKSPACE_BYTES */
    ad.workspace = workspace_need(pf->max_workspace);
    cublasLtMatmulHeuristicResult_t &r = heuristicResultsArray[0];
    memset(&r, 0, sizeof r);
    memcpy(&r.algo, &ad, sizeof ad);
    r.workspaceSize = (size_t)ad.workspace;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- matmul */
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                           const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                           const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                           void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    /* cublasLt.h, cublasLtMatmul: NOT_INITIALIZED "if cuBLASLt handle has not been initialized" */
    cublasLtContext *h = handle_of(lightHandle);
    if (!h) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmul: %p is not a live handle", (void *)lightHandle);
    const MatmulDesc *mdp = desc_of(computeDesc);
    const Layout *la = layout_of(Adesc), *lb = layout_of(Bdesc), *lc = layout_of(Cdesc), *ld = layout_of(Ddesc);
    if (!mdp || !la || !lb || !lc || !ld)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: a descriptor or layout is not live");
    const MatmulDesc md = *mdp; /* by value: the call's attributes */
    Problem p;
    cublasStatus_t s = analyze(devsim::compute_capability(h->device), md, *la, *lb, *lc, *ld, &p);
    if (s) return s;
    if (!alpha || !beta || !A || !B || !D)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: NULL alpha %p, beta %p, A %p, B %p or D %p", alpha,
                      beta, A, B, (void *)D);

    /* the algorithm: the heuristic's, or (NULL) "an implicit heuristics query with default search preferences"
     * (cuBLAS docs, cublasLtMatmul(), algo): no workspace, natural alignment */
    AlgoData ad{};
    if (algo) {
        memcpy(&ad, algo, sizeof ad);
        if (ad.magic != ALGO_MAGIC)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: algo was not initialized by the heuristic");
        /* an algorithm is tied to its types, scale modes and device (cublasLt.h, cublasLtMatmul: NOT_SUPPORTED "if
         * current implementation on selected device doesn't support configured operation") */
        if (ad.fingerprint != p.fingerprint)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: algo was found for another type / scale-mode / "
                          "device combination");
    } else {
        ad.workspace = 0;
        for (int i = 0; i < 4; i++) ad.align[i] = p.kind == K_FP8 || p.kind == K_FP4 ? 16 : p.need_align;
        ad.align[2] = ad.align[3] = p.kind == K_FP8 || p.kind == K_FP4 ? 16 : (uint32_t)(p.d.bits / 8);
    }
    /* pointers at least as aligned as the algorithm assumed (cublasLt.h, MIN_ALIGNMENT_*_BYTES): "parameters in
     * conflict" (cublasLtMatmul: INVALID_VALUE); FP8 / FP4: 16 bytes for every matrix of a batch (cuBLAS docs,
     * cublasLtMatmul(), FP8: "pointers ... must support 16-byte alignment") */
    const void *ptrs[4] = {A, B, C, D};
    const Mat *mats[4] = {&p.a, &p.b, &p.c, &p.d};
    const bool read_c = md.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE || *(const float *)beta != 0.0f;
    for (int i = 0; i < 4; i++) {
        if (i == 2 && !read_c && !C) continue;
        if (!aligned(ptrs[i], ad.align[i]))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: %c = %p is less aligned than the algorithm's "
                          "%u bytes", "ABCD"[i], ptrs[i], ad.align[i]);
    }
    /* in place (C == D): "C and D must have the same leading dimension" (cuBLAS docs, cublasLtMatmul(), in-place
     * matrix multiplication: ldc == ldd and the same layout) */
    if (C == D && (p.c.ld != p.d.ld || (p.batch > 1 && p.c.stride != p.d.stride)))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: C == D with ldc %lld != ldd %lld or different batch "
                      "strides", (long long)p.c.ld, (long long)p.d.ld);
    /* cuBLAS docs, cublasLtMatmul(), workspace: "Must be 256B aligned (i.e. lowest 8 bits of address must be
     * 0)"; INVALID_VALUE "when workspaceSizeInBytes is less than workspace required by configured algo"
     * (cublasLt.h) */
    if (workspace && workspaceSizeInBytes && ((uintptr_t)workspace & 255u))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: workspace %p is not 256-byte aligned", workspace);
    if (workspaceSizeInBytes < ad.workspace || (ad.workspace && !workspace))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: workspace %p of %zu bytes, the algorithm needs %llu",
                      workspace, workspaceSizeInBytes, (unsigned long long)ad.workspace);
    /* scale pointers of narrow operands */
    const bool narrow = p.kind == K_FP8 || p.kind == K_FP4;
    const bool blocked = narrow && p.mode_a != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    if (blocked && (!md.a_scale || !md.b_scale))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: block scale modes %s x %s need A and B scale "
                      "pointers", mode_name(p.mode_a), mode_name(p.mode_b));

    /* every device pointer must be the simulator's device memory over the full extent the kernel touches */
    char what[64];
    for (int i = 0; i < 4; i++) {
        if (i == 2 && !read_c) continue; /* host beta == 0: C is not read */
        snprintf(what, sizeof what, "cublasLtMatmul: %c", "ABCD"[i]);
        const uint64_t bytes = extent_bytes(*mats[i], p.batch);
        if (bytes && !device_ok(ptrs[i], bytes, what)) return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (workspaceSizeInBytes && workspace && !device_ok(workspace, workspaceSizeInBytes, "cublasLtMatmul: workspace"))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (narrow) {
        const void *sp[2] = {md.a_scale, md.b_scale};
        const int32_t modes[2] = {p.mode_a, p.mode_b};
        const int64_t outer[2] = {p.m, p.n};
        for (int i = 0; i < 2; i++) {
            if (!sp[i]) continue;
            snprintf(what, sizeof what, "cublasLtMatmul: %c scale (%s)", "AB"[i], mode_name(modes[i]));
            if (!device_ok(sp[i], scale_bytes(modes[i], outer[i], p.k), what)) return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    Work w{};
    w.p = p;
    w.a = A, w.b = B, w.c = C, w.d = D;
    w.a_scale = narrow ? md.a_scale : nullptr;
    w.b_scale = narrow ? md.b_scale : nullptr;
    w.read_c = read_c;
    w.workspace = ad.workspace ? workspace : nullptr;
    w.ws_bytes = ad.workspace;
    if (md.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE) {
        /* cublasLt.h, POINTER_MODE_DEVICE: "pointer targets a single value device memory", read by the kernel */
        if (!device_ok(alpha, 4, "cublasLtMatmul: alpha (device pointer mode)") ||
            !device_ok(beta, 4, "cublasLtMatmul: beta (device pointer mode)"))
            return CUBLAS_STATUS_INVALID_VALUE;
        w.alpha_p = alpha, w.beta_p = beta;
    } else {
        /* POINTER_MODE_HOST: "pointer targets a single value host memory", read now */
        if (devsim::lookup(alpha, 4).kind == devsim::MEM_DEVICE || devsim::lookup(beta, 4).kind == devsim::MEM_DEVICE)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: alpha / beta are device memory in host "
                          "pointer mode");
        w.alpha = *(const float *)alpha;
        w.beta = *(const float *)beta;
    }
    /* cuBLAS docs, 2.1.2 "cuBLAS Context": the handle works on the device it was created on; a launch on another
     * device fails like a kernel launch (CUBLAS_STATUS_EXECUTION_FAILED: "the GPU program failed to execute") */
    const int cur = devsim::current_device();
    if (cur != h->device)
        return refuse(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul: handle of device %d used while device %d is "
                      "current", h->device, cur);
    /* fault injection (devsim_control.h, "matmul"): fails before anything is queued */
    if (devsim::fault("matmul"))
        return refuse(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul: injected fault");
    /* queued as a kernel: the stream must belong to the current device, capture rules apply (devsim.h) */
    const cudaError_t e = devsim::enqueue(stream, "cublasLtMatmul", [w]() { return run(w); }, devsim::ENQ_KERNEL);
    if (e != cudaSuccess) {
        char msg[512];
        snprintf(msg, sizeof msg, "cublasLtMatmul: the kernel launch failed: %s (%s)", cudaGetErrorName(e),
                 moe_devsim_last_message());
        devsim::fail(e, "%s", msg); /* the launch's CUDA error stays the runtime's last error, as a real launch's */
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
