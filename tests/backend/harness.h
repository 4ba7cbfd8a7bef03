/*
 * The backend-comparison harness (like ggml's test-backend-ops): every op of the op table runs on
 * backend A and backend B with the same random inputs, and every output element is compared.
 *
 * Only the moe_backend interface is used (backend/backend.h): inputs are made on the host, uploaded
 * with be->memcpy(H2D) into be->mem_alloc memory, the op is called through be->ops(dtype), and
 * results come back with be->memcpy(D2H) after be->stream_sync. So B can be any backend.
 *
 * A case is a list of buffers (slots) plus a call function that passes the slots' device pointers
 * to the op. Every buffer sits between guard bytes; outputs start poisoned (NaN / 0xA5) unless the
 * case gives an initial content ("+=" outputs, or outputs the op writes only partly), and that
 * content is identical on A and B.
 */
#ifndef MOE_TESTS_BACKEND_HARNESS_H
#define MOE_TESTS_BACKEND_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"
#include "backend/backend.h"

#define HX_MAX_BUFS 12

/* Storage types of a buffer. */
enum { HX_F32, HX_F64, HX_BF16, HX_I32, HX_I64, HX_U8, HX_BYTES };
/* What the op does with a buffer: reads it (must stay unchanged), or writes it (compared). */
enum { HX_IN, HX_OUT };
/* How an output is compared: docs/math.md §9 tolerances, or bit for bit. */
enum { HX_CMP_TOL, HX_CMP_EXACT };
/* Why a case failed (the self-test asks for a specific kind). */
enum { HX_OK = 0, HX_FAIL_SETUP, HX_FAIL_STATUS, HX_FAIL_GUARD, HX_FAIL_INPUT, HX_FAIL_VALUE };

/* splitmix64: small, fast and the same everywhere. */
typedef struct hx_rng {
    uint64_t s;
} hx_rng;

typedef struct hx_buf {
    const char *name;   /* NULL: slot unused, the op gets a NULL pointer */
    int type;           /* HX_F32 ... HX_BYTES */
    int role;           /* HX_IN or HX_OUT */
    int cmp;            /* HX_CMP_TOL (float types) or HX_CMP_EXACT */
    int prec;           /* HX_F32 / HX_F64 / HX_BF16: whose eps and norm tolerance apply */
    int nan_ok;         /* NaN on both sides passes (ops documented to propagate NaN) */
    int scratch;        /* an HX_OUT the op may use as scratch (its content is unspecified after the
                         * call): only its guards are checked, its elements are not compared */
    double atol;        /* per-element absolute tolerance as a fraction of max|A|; < 0: the norm tolerance */
    int count_slot;     /* >= 0: compare only the first A[count_slot][count_elem] (int64) elements */
    int count_elem;
    size_t n;           /* elements (bytes for HX_BYTES) */
    unsigned char *init; /* n elements: initial content on both backends */
} hx_buf;

typedef struct hx_case hx_case;
typedef struct hx_result hx_result;
/* Calls the op of `ops` with the slots' device pointers (dev[i] = NULL for an unused slot). */
typedef int32_t (*hx_call)(const hx_case *c, const moe_ops *ops, const moe_exec *ex, void *const *dev);
/* A case over more than 2^31 elements (cases_huge.c): runs the op of `ops` on B only (B's device
 * memory must be host memory: the simulator, with block sampling) and checks the result itself. */
typedef void (*hx_huge_fn)(const hx_case *c, const moe_ops *ops, const moe_exec *ex, hx_result *r);

struct hx_case {
    const char *op;     /* field name in moe_ops */
    int32_t dtype;      /* table: MOE_DTYPE_FP32 or MOE_DTYPE_FP64 */
    char shape[120];    /* printed with the result */
    hx_call call;
    void *args;         /* the op's host-side arguments (sizes, [host] arrays), owned by the case */
    int32_t expect;     /* status the op must return on both backends */
    int data_fault;     /* 1: expect is a failure found in device data (ops.h "Statuses": align_rows,
                         * ag_expert_rows). A device backend cannot see that data without a read-back,
                         * so B may return MOE_OK instead; either way it must keep every guard and
                         * input intact (never write outside the outputs). A (the reference) must
                         * still return expect. */
    int heavy;          /* 1: among the largest inputs, every shape class / edge case of which a lighter
                         * case of the op covers too; `--light` runs skip it (the simulator under
                         * sanitizers, where it costs minutes), the Release run keeps it */
    hx_huge_fn huge;    /* non-NULL: a case over more than 2^31 elements, of its own kind (no slots,
                         * call unused; main.c runs it on the simulator only) */
    hx_rng rng;         /* seeded from (op, dtype, ordinal): adding cases elsewhere changes nothing here */
    hx_buf buf[HX_MAX_BUFS];
};

typedef struct hx_suite {
    hx_case *cases;
    int n, cap;
} hx_suite;

/* ---- the op list (harness.c): one entry per moe_ops slot, checked against MOE_OPS_COUNT ---------- */
typedef struct hx_op_info {
    const char *name;
    size_t offset; /* offsetof(moe_ops, name) */
} hx_op_info;
extern const hx_op_info hx_ops[];
extern const int hx_ops_count;
/* Verifies that hx_ops names every slot exactly once; returns 0 and prints why if not. */
int hx_ops_check(void);
int hx_op_index(const char *name); /* -1 if unknown */

/* ---- random inputs (gen.c) -------------------------------------------------------------------- */
hx_rng hx_rng_make(uint64_t seed);
uint64_t hx_next(hx_rng *r);
double hx_unif(hx_rng *r, double lo, double hi);
int64_t hx_int(hx_rng *r, int64_t lo, int64_t hi); /* uniform in [lo, hi) */
void hx_shuffle(hx_rng *r, int64_t *v, int64_t n);
/* v[0..n) = n distinct values of [0, range), random order (n <= range). */
void hx_distinct(hx_rng *r, int64_t *v, int64_t n, int64_t range);
/* Routing as route_fwd makes it: idx [T,K] = K distinct experts per token out of [0,E), never
 * `avoid` (-1: none; then K <= E - 1 is required). */
void hx_routing(hx_rng *r, int32_t E, int32_t K, int64_t T, int32_t avoid, int32_t *idx);

/* A dispatch plan made on the host from a routing (docs/math.md §4-§5; position drop policy), the valid
 * index inputs of permute / unpermute / align_rows / gather_slots. */
typedef struct hx_plan {
    int64_t R;          /* rows: kept + padding */
    int64_t *off;       /* [E+1] */
    int64_t *row_token; /* [R], -1 for padding */
    int64_t *slot_row;  /* [T*K], -1 for dropped */
} hx_plan;
void hx_plan_make(hx_plan *p, int32_t E, int32_t K, int64_t T, const int32_t *idx, int64_t cap, int pad);
void hx_plan_free(hx_plan *p);

/* ---- building cases (harness.c) --------------------------------------------------------------- */
/* A new case of `op` for the `dtype` table; fmt describes the shape. */
hx_case *hx_case_new(hx_suite *s, const char *op, int32_t dtype, hx_call call, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void *hx_case_args(hx_case *c, size_t bytes); /* zeroed, freed with the case */
/* Slot `slot` holds n elements of `type`; init (n elements) is the initial content, or NULL for an
 * output that starts poisoned. */
void hx_buf_set(hx_case *c, int slot, const char *name, int type, int role, size_t n, const void *init);
/* A buffer of the table's real type from doubles (v NULL: poisoned output; NaN in v is kept). */
void hx_real(hx_case *c, int slot, const char *name, int role, size_t n, const double *v);
/* A real input or "+=" output of uniform random values in [lo, hi). */
void hx_real_rand(hx_case *c, int slot, const char *name, int role, size_t n, double lo, double hi);
int hx_real_type(const hx_case *c); /* HX_F32 or HX_F64 */
size_t hx_type_size(int type);
/* Comparison options of a slot. */
void hx_buf_exact(hx_case *c, int slot);
void hx_buf_nan_ok(hx_case *c, int slot);
void hx_buf_scratch(hx_case *c, int slot);
void hx_buf_atol(hx_case *c, int slot, double atol_fraction);
void hx_buf_prec(hx_case *c, int slot, int prec);
void hx_buf_count_from(hx_case *c, int slot, int count_slot, int count_elem);
void hx_suite_free(hx_suite *s);

/* ---- the case families (cases_*.c): add every case of their ops for one table ----------------- */
void hx_cases_gemm(hx_suite *s, int32_t dtype);
void hx_cases_route(hx_suite *s, int32_t dtype);
void hx_cases_dispatch(hx_suite *s, int32_t dtype);
void hx_cases_rows(hx_suite *s, int32_t dtype);
void hx_cases_elementwise(hx_suite *s, int32_t dtype);
void hx_cases_qscale_lt(hx_suite *s, int32_t dtype); /* qscale_lt */
void hx_cases_quant(hx_suite *s, int32_t dtype);   /* quantize, dequantize; and gemm_q: */
void hx_cases_gemm_q(hx_suite *s, int32_t dtype);  /* cases_quant.c, called by hx_cases_quant */
void hx_cases_huge(hx_suite *s, int32_t dtype);    /* over 2^31 elements, hx_case.huge (cases_huge.c) */

/* ---- running (harness.c) ---------------------------------------------------------------------- */
typedef struct hx_side {
    const moe_backend *be;
    void *state;
    moe_exec ex;
} hx_side;
int32_t hx_side_open(hx_side *s, const moe_backend *be);
void hx_side_close(hx_side *s);

typedef struct hx_result {
    int skipped;     /* 1: an op or table the backends lack */
    int fail;        /* HX_OK or HX_FAIL_* (the first failure found) */
    double max_rel;  /* largest ||B - A|| / ||A|| over the compared float outputs */
    char msg[256];   /* why it failed or was skipped */
} hx_result;
void hx_run_case(const hx_side *a, const hx_side *b, const hx_case *c, hx_result *res);
const char *hx_fail_name(int fail);

/* ---- the deliberately broken backends of the self-test (broken_backend.c) ---------------------- */
/* A copy of the CPU backend with one op replaced by a wrong wrapper: "broken-permute",
 * "broken-unpermute", "broken-overflow", "broken-gemm"; NULL for another name. *op receives the
 * broken op's name. */
const moe_backend *hx_broken_backend(const char *variant, const char **op);

/* Exits with status 2 after printing (programming errors of a case builder). */
void hx_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif /* MOE_TESTS_BACKEND_HARNESS_H */
