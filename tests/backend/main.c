/*
 * test_backend_ops: runs every case of every op on backend A and backend B and compares.
 *
 *   test_backend_ops [--backend-a NAME] [--backend-b NAME] [--op NAME[,NAME...]] [--expect-fail OP[:KIND]]
 *                    [--light]
 *
 * NAME: a backend of this build by its name ("cpu", later "cuda"); "guarded-cpu", the CPU backend
 * whose device memory faults when touched outside backend entries (tests/unit/guarded_backend.c:
 * run as B it proves the harness reaches device memory only through the backend); or one of the
 * self-test's broken copies of the CPU backend (broken-permute, broken-unpermute, broken-overflow,
 * broken-gemm).
 * One line per case (with its time), then "backend-ops: N passed, M failed, S skipped" and
 * "N passed, M failed". --op runs the cases of the named ops only.
 * --expect-fail turns the run into the harness's self-test: it passes only if some case of OP
 * failed (with KIND: guard, value, status, input, if given) and every case of every other op (of
 * --op's, when given: OP must be one of them) passed; the last line then counts the ops whose
 * outcome was as expected.
 * --light skips the cases marked heavy (hx_case.heavy: the largest inputs, whose every shape class,
 * edge case and format is also in a smaller case); the sanitizer build's simulator run uses it, the
 * Release run keeps them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "guarded_backend.h"
#ifdef MOE_HAVE_SIM
#include "sim_backend.h"
#endif
#include "harness.h"

static const char *usage =
    "usage: test_backend_ops [--backend-a NAME] [--backend-b NAME] [--op NAME[,NAME...]]\n"
    "                        [--expect-fail OP[:KIND]] [--light]\n"
    "  NAME: cpu (or another backend of this build), guarded-cpu, sim (the CUDA kernels in the\n"
    "        kernel simulator, where built), sim-planted-nosync, sim-planted-offbyone (the simulator\n"
    "        with a planted kernel bug), sim-planted-ltlayout (a block-scaled matmul that misreads\n"
    "        the scales: gemm_q's probe must keep it out), broken-permute,\n"
    "        broken-unpermute, broken-overflow, broken-gemm\n"
    "  --op: only these ops' cases; --light: skip the heavy cases (their coverage is in lighter ones)\n";

/* --op's list: ops selected[i] for op index i (all when no --op was given). */
static int op_selected[64];
static int any_selection;
static int selected(const char *op) { return !any_selection || op_selected[hx_op_index(op)]; }

/* Parses "a,b,c" into op_selected; dies on an unknown name. */
static void select_ops(const char *list)
{
    char buf[512];
    if (strlen(list) >= sizeof buf) hx_die("--op: list too long");
    strcpy(buf, list);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        const int i = hx_op_index(tok);
        if (i < 0) hx_die("--op %s: not an op of moe_ops", tok);
        op_selected[i] = 1;
    }
    any_selection = 1;
}

/* A backend of this build by name, the guarded CPU backend, or a broken copy of the CPU backend. */
static const moe_backend *find_backend(const char *name)
{
    static moe_backend guarded;
    if (strcmp(name, "guarded-cpu") == 0) {
        guarded = guarded_backend();
        return &guarded;
    }
    const moe_backend *be = hx_broken_backend(name, NULL);
    if (be) return be;
#ifdef MOE_HAVE_SIM
    if (strcmp(name, "sim") == 0) return moe_sim_backend();
    if (strncmp(name, "sim-planted-", 12) == 0) return moe_sim_planted_backend(name + 12);
#endif
    const int32_t types[] = {MOE_DEVICE_CPU, MOE_DEVICE_CUDA};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        be = moe_backend_for_device(types[i]);
        if (be && strcmp(be->name, name) == 0) return be;
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int kind_by_name(const char *s)
{
    for (int k = HX_FAIL_SETUP; k <= HX_FAIL_VALUE; k++)
        if (strcmp(hx_fail_name(k), s) == 0) return k;
    return -1;
}

int main(int argc, char **argv)
{
    const char *name_a = "cpu", *name_b = "cpu", *only = NULL;
    char expect_op[64] = "";
    int expect_kind = 0; /* 0: any failure kind */
    int light = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--backend-a") == 0 && v) name_a = v, i++;
        else if (strcmp(argv[i], "--backend-b") == 0 && v) name_b = v, i++;
        else if (strcmp(argv[i], "--op") == 0 && v) only = v, i++;
        else if (strcmp(argv[i], "--light") == 0) light = 1;
        else if (strcmp(argv[i], "--expect-fail") == 0 && v && strlen(v) < sizeof expect_op) {
            strcpy(expect_op, v), i++;
            char *colon = strchr(expect_op, ':');
            if (colon) {
                *colon = '\0';
                if ((expect_kind = kind_by_name(colon + 1)) < 0) hx_die("unknown failure kind '%s'", colon + 1);
            }
        } else {
            fputs(usage, stdout);
            return 2;
        }
    }
    if (!hx_ops_check()) return 2;
    if (hx_ops_count > 64) hx_die("more than 64 ops: enlarge the per-op tallies");
    if (only) select_ops(only);
    if (expect_op[0] && hx_op_index(expect_op) < 0) hx_die("--expect-fail %s: not an op of moe_ops", expect_op);
    /* the self-test must run the op it expects to fail: otherwise it could pass without a check */
    if (expect_op[0] && !selected(expect_op)) hx_die("--expect-fail %s: not among --op %s", expect_op, only);
    /* the broken tables are static: one variant per process */
    if (hx_broken_backend(name_a, NULL) && hx_broken_backend(name_b, NULL) && strcmp(name_a, name_b) != 0)
        hx_die("A and B cannot be two different broken backends");
    const moe_backend *be_a = find_backend(name_a), *be_b = find_backend(name_b);
    if (!be_a || !be_b) hx_die("backend '%s' is not in this build", be_a ? name_b : name_a);

    hx_suite suite = {0};
    const int32_t dtypes[2] = {MOE_DTYPE_FP32, MOE_DTYPE_FP64};
    for (int d = 0; d < 2; d++) {
        hx_cases_gemm(&suite, dtypes[d]);
        hx_cases_route(&suite, dtypes[d]);
        hx_cases_dispatch(&suite, dtypes[d]);
        hx_cases_rows(&suite, dtypes[d]);
        hx_cases_elementwise(&suite, dtypes[d]);
        hx_cases_quant(&suite, dtypes[d]);
        hx_cases_huge(&suite, dtypes[d]);
    }

    hx_side a, b;
    int32_t st;
    if ((st = hx_side_open(&a, be_a)) != MOE_OK) hx_die("%s: device_open: %s", be_a->name, moe_status_name(st));
    int32_t ndev = 1;
    if (be_b->device_count(&ndev) == MOE_OK && ndev == 0) { /* a GPU backend where no GPU is */
        printf("SKIP: backend %s has no device on this machine (no driver or no GPU)\n", be_b->name);
        hx_side_close(&a);
        hx_suite_free(&suite);
        return 77;
    }
    if ((st = hx_side_open(&b, be_b)) != MOE_OK) hx_die("%s: device_open: %s", be_b->name, moe_status_name(st));
    printf("backend-ops: A = %s, B = %s, %d cases%s\n", be_a->name, be_b->name, suite.n,
           be_a == be_b ? " (one backend twice: outputs must be bitwise identical)" : "");

    /* per op: cases that passed / failed, and whether a failure of the expected kind was seen */
    int op_pass[64] = {0}, op_fail[64] = {0}, op_kind_seen[64] = {0}, passed = 0, failed = 0, skipped = 0;
    const double t0 = now_s();
    for (int i = 0; i < suite.n; i++) {
        const hx_case *c = &suite.cases[i];
        if (!selected(c->op)) continue;
        const char *dn = c->dtype == MOE_DTYPE_FP64 ? "f64" : "f32";
        if (light && c->heavy) {
            skipped++;
            printf("%-19s %s  %-58s %-17s skip: heavy (runs without --light)\n", c->op, dn, c->shape, "");
            continue;
        }
        hx_result r;
        const double tc = now_s();
        if (c->huge) {
            /* over 2^31 elements: on the simulator only (B's memory is host memory), sampled blocks */
            memset(&r, 0, sizeof r);
            const moe_ops *ops_b = be_b->ops(c->dtype);
            int on_sim = 0;
#ifdef MOE_HAVE_SIM
            on_sim = strncmp(be_b->name, "sim", 3) == 0;
#endif
            if (!on_sim || !ops_b || !be_b->supports_op(c->dtype, c->op)) {
                r.skipped = 1;
                snprintf(r.msg, sizeof r.msg, "over 2^31 elements: the kernel simulator only");
            } else {
#ifdef MOE_HAVE_SIM
                moe_sim_set_order_seed(c->rng.s, 0);
                moe_sim_set_block_sample(2, c->rng.s);
#endif
                c->huge(c, ops_b, &b.ex, &r);
                if (be_b->stream_sync(&b.ex) != MOE_OK && r.fail == HX_OK) {
                    r.fail = HX_FAIL_SETUP;
                    snprintf(r.msg, sizeof r.msg, "stream_sync failed");
                }
#ifdef MOE_HAVE_SIM
                moe_sim_set_block_sample(-1, 0);
#endif
            }
        } else {
#ifdef MOE_HAVE_SIM
        /* the simulator's thread orders follow the case, not the cases that ran before it */
        moe_sim_set_order_seed(c->rng.s, 0);
#endif
        hx_run_case(&a, &b, c, &r);
#ifdef MOE_HAVE_SIM
        /* a single-block launch runs its threads in one order per run: run such a case again with
         * every block's order inverted (each run uploads the inputs afresh), so a missing
         * __syncthreads of a single-block kernel shows whichever order it needs (sim.h) */
        if (!r.skipped && r.fail == HX_OK && moe_sim_single_block_launches() > 0) {
            moe_sim_set_order_seed(c->rng.s, 1);
            hx_run_case(&a, &b, c, &r);
            if (r.fail != HX_OK) {
                char m[sizeof r.msg];
                snprintf(m, sizeof m, "orders inverted: %.200s", r.msg);
                memcpy(r.msg, m, sizeof m);
            }
        }
#endif
        }
        const double dt = now_s() - tc;
        const int oi = hx_op_index(c->op);
        if (r.skipped) {
            skipped++;
            printf("%-19s %s  %-58s %-17s skip: %s\n", c->op, dn, c->shape, "", r.msg);
        } else if (r.fail == HX_OK) {
            passed++, op_pass[oi]++;
            printf("%-19s %s  %-58s max_rel=%.2e  ok  %.3f s\n", c->op, dn, c->shape, r.max_rel, dt);
        } else {
            failed++, op_fail[oi]++;
            op_kind_seen[oi] |= expect_kind == 0 || r.fail == expect_kind;
            printf("%-19s %s  %-58s max_rel=%.2e  FAIL (%s): %s  %.3f s\n", c->op, dn, c->shape, r.max_rel,
                   hx_fail_name(r.fail), r.msg, dt);
        }
    }
    const double secs = now_s() - t0;

    /* coverage: every op slot has a case for both tables (a gap counts as a failure) */
    int gaps = 0;
    for (int o = 0; o < hx_ops_count; o++) {
        if (!selected(hx_ops[o].name)) continue;
        for (int d = 0; d < 2; d++) {
            int n = 0; /* a light run needs a light case of every op too */
            for (int i = 0; i < suite.n; i++)
                n += strcmp(suite.cases[i].op, hx_ops[o].name) == 0 && suite.cases[i].dtype == dtypes[d] &&
                     !(light && suite.cases[i].heavy);
            if (n == 0) {
                printf("coverage: no case of %s for the %s table\n", hx_ops[o].name, d ? "f64" : "f32");
                gaps++;
            }
        }
    }
    failed += gaps;
    printf("backend-ops: %.2f s\n", secs);

    int rc;
    if (!expect_op[0]) {
        printf("backend-ops: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
        printf("%d passed, %d failed\n", passed, failed);
        rc = failed == 0 ? 0 : 1;
    } else {
        /* self-test verdict per op: the broken op must fail (as KIND), every other op must pass */
        int ok_ops = 0, bad_ops = gaps;
        for (int o = 0; o < hx_ops_count; o++) {
            if (!selected(hx_ops[o].name)) continue;
            const int broken = strcmp(hx_ops[o].name, expect_op) == 0;
            const int good = broken ? op_fail[o] > 0 && op_kind_seen[o] : op_fail[o] == 0;
            if (broken || !good)
                printf("self-test: %s %s (%d of %d cases failed%s%s)\n", hx_ops[o].name,
                       good ? "failed as expected" : broken ? "was NOT caught" : "failed but is not the broken op",
                       op_fail[o], op_fail[o] + op_pass[o], expect_kind ? ", expected kind " : "",
                       expect_kind ? hx_fail_name(expect_kind) : "");
            good ? ok_ops++ : bad_ops++;
        }
        printf("backend-ops: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
        printf("%d passed, %d failed\n", ok_ops, bad_ops);
        rc = bad_ops == 0 ? 0 : 1;
    }
    hx_side_close(&a);
    hx_side_close(&b);
    hx_suite_free(&suite);
    return rc;
}
