/*
 * Parallel Folding layouts (moe.h "Parallel Folding layouts", docs/math.md §8, docs/parallel.md).
 *
 *  - a table of configurations with hand-derived groups: every group kind of a few ranks, the resolved
 *    sizes, each rank's index; small worlds written out member by member, the 256-rank case of the
 *    issue (attention TP4 CP2 DP8 PP4, MoE EP64 ETP1 EDP1) as ranges derived in comments;
 *  - structure: every group kind partitions the world into equal groups, members ascending, and agrees
 *    with a brute-force oracle that compares coordinates (decoded here by repeated division);
 *  - every one of the 120 rank orders over several size sets: creation succeeds exactly when the two
 *    decompositions have the same pipeline groups (brute force), and then the groups match the oracle;
 *  - moe_comm_split_layout over a fake world comm: colors and keys form exactly the groups, ordered;
 *  - validation: status and message (naming the field) for every bad input, outputs untouched.
 *
 * Range syntax in the expectation strings: "a" one rank, "a-b" a..b inclusive, "a-b:s" every s-th.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "comm/comm.h"
#include "testutil.h"

#define SENTINEL_PTR ((void *)(uintptr_t)0x5E57AB1Eu)
#define SENTINEL_I32 0x5EA5
enum { MAXW = 256, NG = MOE_GROUP_NUM };

static const char *const group_names[NG] = {"TP", "CP", "DP", "PP", "ETP", "EP", "EDP", "DP_CP", "TP_CP", "TP_CP_DP"};

/* ------------------------------------------------------------------ helpers */
static moe_layout_config make_cfg(int32_t world, int32_t tp, int32_t cp, int32_t dp, int32_t pp, int32_t etp, int32_t ep,
                                  const char *order)
{
    moe_layout_config c;
    ck_assert_int_eq(moe_layout_config_init(&c, sizeof c), MOE_OK);
    c.world_size = world;
    c.tp = tp, c.cp = cp, c.dp = dp, c.pp = pp;
    c.etp = etp, c.ep = ep;
    c.order = order;
    return c;
}

static moe_layout *create_ok(const moe_layout_config *c)
{
    moe_layout *L = NULL;
    int32_t st = moe_layout_create(c, &L);
    if (st != MOE_OK) {
        char msg[512];
        moe_last_error(msg, sizeof msg);
        ck_abort_msg("moe_layout_create failed: %s", msg);
    }
    ck_assert_ptr_nonnull(L);
    return L;
}

/* Parses "0 2 4-7 8-56:8" into ascending ranks; returns the count. */
static int parse_ranks(const char *spec, int32_t *out, int cap)
{
    int n = 0;
    const char *p = spec;
    while (*p) {
        if (*p == ' ') {
            p++;
            continue;
        }
        char *end;
        long a = strtol(p, &end, 10), b = a, s = 1;
        ck_assert_msg(end != p, "bad spec \"%s\"", spec);
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            p = end;
            if (*p == ':') {
                s = strtol(p + 1, &end, 10);
                p = end;
            }
        }
        for (long r = a; r <= b; r += s) {
            ck_assert_msg(n < cap, "spec \"%s\" too long", spec);
            out[n++] = (int32_t)r;
        }
    }
    return n;
}

static void expect_error(int32_t got, int32_t want, const char *msg, const char *const *needles, int nneedles,
                         const char *what)
{
    ck_assert_msg(got == want, "%s: status %s, expected %s (message: %s)", what, moe_status_name(got),
                  moe_status_name(want), msg);
    const char *prefix = moe_status_name(want);
    ck_assert_msg(strncmp(msg, prefix, strlen(prefix)) == 0, "%s: message \"%s\" does not begin with %s", what, msg,
                  prefix);
    for (int i = 0; i < nneedles; i++)
        if (needles[i]) ck_assert_msg(strstr(msg, needles[i]) != NULL, "%s: message \"%s\" lacks \"%s\"", what, msg,
                                      needles[i]);
}

/* Checks the last thread-local error after a call that had to fail. */
static void expect_tls(int32_t got, int32_t want, const char *needle1, const char *needle2, const char *what)
{
    char msg[1024];
    moe_last_error(msg, sizeof msg);
    const char *n[2] = {needle1, needle2};
    expect_error(got, want, msg, n, 2, what);
}

/* ------------------------------------------------------------------ the oracle (test-side) */
/* Dimensions in the test's own numbering; the order string is split here independently. */
static const char *const dim_names[5] = {"tp", "cp", "ep", "dp", "pp"};
typedef struct oracle {
    int world;
    int order[5];        /* dimension numbers, fastest first */
    int attn[5], moe[5]; /* sizes by dimension number */
} oracle;

static void oracle_make(oracle *o, int world, int tp, int cp, int dp, int pp, int etp, int ep, const char *order)
{
    if (!order) order = "tp-cp-ep-dp-pp";
    for (int i = 0; i < 5; i++) {
        const char *tok = order + 3 * i; /* only called with well-formed orders: "xx-xx-xx-xx-xx" */
        for (int d = 0; d < 5; d++)
            if (strncmp(tok, dim_names[d], 2) == 0) o->order[i] = d;
    }
    o->world = world;
    int a[5] = {tp, cp, 1, dp, pp}, m[5] = {etp, 1, ep, world / (etp * ep * pp), pp};
    memcpy(o->attn, a, sizeof a);
    memcpy(o->moe, m, sizeof m);
}

/* Mixed-radix digits of r over the order (fastest first) with the given sizes. */
static void oracle_coords(const oracle *o, const int *size, int r, int *c)
{
    for (int i = 0; i < 5; i++) {
        int d = o->order[i];
        c[d] = r % size[d];
        r /= size[d];
    }
}

/* Each kind: MoE grid or not, dimensions allowed to differ. */
static void oracle_kind(int g, int *moe, int vary[5])
{
    memset(vary, 0, 5 * sizeof(int));
    *moe = g == MOE_GROUP_ETP || g == MOE_GROUP_EP || g == MOE_GROUP_EDP;
    switch (g) {
    case MOE_GROUP_TP: case MOE_GROUP_ETP: vary[0] = 1; break;
    case MOE_GROUP_CP: vary[1] = 1; break;
    case MOE_GROUP_EP: vary[2] = 1; break;
    case MOE_GROUP_DP: case MOE_GROUP_EDP: vary[3] = 1; break;
    case MOE_GROUP_PP: vary[4] = 1; break;
    case MOE_GROUP_DP_CP: vary[3] = vary[1] = 1; break;
    case MOE_GROUP_TP_CP: vary[0] = vary[1] = 1; break;
    default: vary[0] = vary[1] = vary[3] = 1; break; /* TP_CP_DP */
    }
}

/* All r2 whose coordinates agree with r's outside the group's dimensions, ascending. */
static int oracle_members(const oracle *o, int r, int g, int32_t *out)
{
    int moe, vary[5], c[5], c2[5], n = 0;
    oracle_kind(g, &moe, vary);
    const int *size = moe ? o->moe : o->attn;
    oracle_coords(o, size, r, c);
    for (int r2 = 0; r2 < o->world; r2++) {
        oracle_coords(o, size, r2, c2);
        int same = 1;
        for (int d = 0; d < 5; d++)
            if (!vary[d] && c[d] != c2[d]) same = 0;
        if (same) out[n++] = r2;
    }
    return n;
}

/* The pipeline groups of both grids are the same sets. */
static int oracle_pp_consistent(const oracle *o)
{
    int32_t a[MAXW], b[MAXW];
    for (int r = 0; r < o->world; r++) {
        int vary[5] = {0, 0, 0, 0, 1}, c[5], c2[5], na = 0, nb = 0;
        for (int grid = 0; grid < 2; grid++) {
            const int *size = grid ? o->moe : o->attn;
            oracle_coords(o, size, r, c);
            for (int r2 = 0; r2 < o->world; r2++) {
                oracle_coords(o, size, r2, c2);
                int same = 1;
                for (int d = 0; d < 5; d++)
                    if (!vary[d] && c[d] != c2[d]) same = 0;
                if (same) {
                    if (grid) b[nb++] = r2;
                    else a[na++] = r2;
                }
            }
        }
        if (na != nb || memcmp(a, b, sizeof(int32_t) * (size_t)na) != 0) return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ structural checks */
/* Every kind: equal-size groups partitioning the world, ascending members, rank at *index, and the
 * oracle's members. */
static void check_structure(const moe_layout *L, const oracle *o, const char *name)
{
    static int32_t mem[MAXW], ref[MAXW], first[MAXW];
    const int world = o->world;
    for (int g = 0; g < NG; g++) {
        int32_t size0 = -1, ngroups = 0;
        for (int r = 0; r < world; r++) first[r] = -1;
        for (int r = 0; r < world; r++) {
            int32_t count = -1, index = -1;
            tu_check_int_eq(moe_layout_group(L, r, g, mem, MAXW, &count, &index), MOE_OK);
            if (size0 < 0) size0 = count;
            tu_check_msg(count == size0, "%s %s: rank %d's group has %d members, rank 0's %d", name, group_names[g], r,
                         count, size0);
            tu_check_msg(index >= 0 && index < count && mem[index] == r, "%s %s: rank %d not at index %d", name,
                         group_names[g], r, index);
            for (int i = 1; i < count; i++)
                tu_check_msg(mem[i - 1] < mem[i], "%s %s: rank %d's members not ascending", name, group_names[g], r);
            if (first[r] < 0) { /* a new group: claim its members */
                ngroups++;
                for (int i = 0; i < count; i++) {
                    tu_check_msg(first[mem[i]] < 0, "%s %s: rank %d is in two groups", name, group_names[g], mem[i]);
                    first[mem[i]] = mem[0];
                }
            } else {
                tu_check_msg(first[r] == mem[0], "%s %s: rank %d's group differs from its members'", name, group_names[g], r);
            }
            int n = oracle_members(o, r, g, ref);
            tu_check_msg(n == count && memcmp(ref, mem, sizeof(int32_t) * (size_t)n) == 0,
                         "%s %s: rank %d's members differ from the oracle's", name, group_names[g], r);
        }
        tu_check_msg((int64_t)ngroups * size0 == world, "%s %s: %d groups of %d do not cover %d ranks", name,
                     group_names[g], ngroups, size0, world);
    }
}

/* ------------------------------------------------------------------ the table */
typedef struct rank_expect {
    int32_t rank;
    const char *groups[NG]; /* TP, CP, DP, PP, ETP, EP, EDP, DP_CP, TP_CP, TP_CP_DP */
} rank_expect;

typedef struct layout_case {
    const char *name;
    int32_t world, tp, cp, dp, pp, etp, ep; /* as configured (0 = default) */
    const char *order;
    int32_t sizes[7]; /* resolved tp, cp, dp, pp, etp, ep, edp */
    rank_expect ranks[5];
} layout_case;

static const layout_case cases[] = {
    /* world 1, everything default: every group is {0}. */
    {"w1 defaults", 1, 0, 0, 0, 0, 0, 0, NULL, {1, 1, 1, 1, 1, 1, 1},
     {{0, {"0", "0", "0", "0", "0", "0", "0", "0", "0", "0"}}, {-1, {0}}}},

    /* world 8, TP2 DP4 | EP2 ETP1 (EDP = 8/2 = 4), default order tp-cp-ep-dp-pp.
     * attention: r = tp + 2*dp;  MoE: r = ep + 2*edp.  EP is folded onto the TP ranks.
     * rank 0: tp0 dp0 | ep0 edp0.   rank 5: tp1 dp2 | ep1 edp2.   rank 6: tp0 dp3 | ep0 edp3. */
    {"w8 tp2 dp4 | ep2", 8, 2, 0, 4, 0, 0, 2, NULL, {2, 1, 4, 1, 1, 2, 4},
     {{0, {"0 1", "0", "0 2 4 6", "0", "0", "0 1", "0 2 4 6", "0 2 4 6", "0 1", "0 1 2 3 4 5 6 7"}},
      {5, {"4 5", "5", "1 3 5 7", "5", "5", "4 5", "1 3 5 7", "1 3 5 7", "4 5", "0 1 2 3 4 5 6 7"}},
      {6, {"6 7", "6", "0 2 4 6", "6", "6", "6 7", "0 2 4 6", "0 2 4 6", "6 7", "0 1 2 3 4 5 6 7"}},
      {-1, {0}}}},

    /* The same sizes under "tp-cp-dp-ep-pp": attention is unchanged (ep is 1 there); MoE becomes
     * r = edp + 4*ep (etp = 1, cp = 1), so EP strides across the DP replicas.
     * rank 5: tp1 dp2 | edp1 ep1.   rank 2: tp0 dp1 | edp2 ep0. */
    {"w8 tp2 dp4 | ep2, tp-cp-dp-ep-pp", 8, 2, 0, 4, 0, 0, 2, "tp-cp-dp-ep-pp", {2, 1, 4, 1, 1, 2, 4},
     {{5, {"4 5", "5", "1 3 5 7", "5", "5", "1 5", "4 5 6 7", "1 3 5 7", "4 5", "0 1 2 3 4 5 6 7"}},
      {2, {"2 3", "2", "0 2 4 6", "2", "2", "2 6", "0 1 2 3", "0 2 4 6", "2 3", "0 1 2 3 4 5 6 7"}},
      {-1, {0}}}},

    /* world 16, TP2 CP2 DP4 | EP4 ETP2 (EDP = 16/8 = 2), default order.
     * attention: r = tp + 2*cp + 4*dp;  MoE: r = etp + 2*ep + 8*edp.
     * rank 6: tp0 cp1 dp1 | etp0 ep3 edp0.   rank 13: tp1 cp0 dp3 | etp1 ep2 edp1. */
    {"w16 tp2 cp2 dp4 | ep4 etp2", 16, 2, 2, 4, 0, 2, 4, NULL, {2, 2, 4, 1, 2, 4, 2},
     {{6, {"6 7", "4 6", "2 6 10 14", "6", "6 7", "0 2 4 6", "6 14", "0 2 4 6 8 10 12 14", "4 5 6 7",
           "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"}},
      {13, {"12 13", "13 15", "1 5 9 13", "13", "12 13", "9 11 13 15", "5 13", "1 3 5 7 9 11 13 15", "12 13 14 15",
            "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"}},
      {-1, {0}}}},

    /* "tp-ep-cp-dp-pp" swaps two dimensions of which each grid has one at size 1 (ep in attention, cp in
     * MoE), so the layout equals the default order's: the same expectations as above. */
    {"w16 tp2 cp2 dp4 | ep4 etp2, tp-ep-cp-dp-pp", 16, 2, 2, 4, 0, 2, 4, "tp-ep-cp-dp-pp", {2, 2, 4, 1, 2, 4, 2},
     {{6, {"6 7", "4 6", "2 6 10 14", "6", "6 7", "0 2 4 6", "6 14", "0 2 4 6 8 10 12 14", "4 5 6 7",
           "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"}},
      {13, {"12 13", "13 15", "1 5 9 13", "13", "12 13", "9 11 13 15", "5 13", "1 3 5 7 9 11 13 15", "12 13 14 15",
            "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"}},
      {-1, {0}}}},

    /* world 16, TP2 DP4 PP2 | EP4 ETP1 (EDP = 16/(4*2) = 2), default order.
     * attention: r = tp + 2*dp + 8*pp;  MoE: r = ep + 4*edp + 8*pp (pp stride 8 in both).
     * rank 11: tp1 dp1 pp1 | ep3 edp0 pp1.   rank 4: tp0 dp2 pp0 | ep0 edp1 pp0. */
    {"w16 tp2 dp4 pp2 | ep4", 16, 2, 0, 4, 2, 0, 4, NULL, {2, 1, 4, 2, 1, 4, 2},
     {{11, {"10 11", "11", "9 11 13 15", "3 11", "11", "8 9 10 11", "11 15", "9 11 13 15", "10 11",
            "8 9 10 11 12 13 14 15"}},
      {4, {"4 5", "4", "0 2 4 6", "4 12", "4", "4 5 6 7", "0 4", "0 2 4 6", "4 5", "0 1 2 3 4 5 6 7"}},
      {-1, {0}}}},

    /* pp first, "pp-tp-cp-ep-dp": world 8, TP2 PP2 DP2 | EP2 ETP1 (EDP = 8/(2*2) = 2).
     * attention: r = pp + 2*tp + 4*dp;  MoE: r = pp + 2*ep + 4*edp (pp stride 1 in both).
     * rank 6: pp0 tp1 dp1 | pp0 ep1 edp1.   rank 3: pp1 tp1 dp0 | pp1 ep1 edp0. */
    {"w8 tp2 pp2 dp2 | ep2, pp-tp-cp-ep-dp", 8, 2, 0, 2, 2, 0, 2, "pp-tp-cp-ep-dp", {2, 1, 2, 2, 1, 2, 2},
     {{6, {"4 6", "6", "2 6", "6 7", "6", "4 6", "2 6", "2 6", "4 6", "0 2 4 6"}},
      {3, {"1 3", "3", "3 7", "2 3", "3", "1 3", "3 7", "3 7", "1 3", "1 3 5 7"}},
      {-1, {0}}}},

    /* "tp-dp-cp-ep-pp": world 8, TP2 DP2 CP2 | EP2 ETP1 (EDP = 4). attention: r = tp + 2*dp + 4*cp, so
     * TP_CP is not contiguous; MoE: r = edp + 4*ep.
     * rank 5: tp1 dp0 cp1 | edp1 ep1.   rank 2: tp0 dp1 cp0 | edp2 ep0. */
    {"w8 tp2 dp2 cp2 | ep2, tp-dp-cp-ep-pp", 8, 2, 2, 2, 0, 0, 2, "tp-dp-cp-ep-pp", {2, 2, 2, 1, 1, 2, 4},
     {{5, {"4 5", "1 5", "5 7", "5", "5", "1 5", "4 5 6 7", "1 3 5 7", "0 1 4 5", "0 1 2 3 4 5 6 7"}},
      {2, {"2 3", "2 6", "0 2", "2", "2", "2 6", "0 1 2 3", "0 2 4 6", "2 3 6 7", "0 1 2 3 4 5 6 7"}},
      {-1, {0}}}},

    /* pp in the middle, allowed because the dimensions before it multiply to 2 in both grids:
     * "tp-pp-cp-ep-dp", world 8, TP2 PP2 DP2 | ETP2 EP1 (EDP = 8/(2*1*2) = 2).
     * attention: r = tp + 2*pp + 4*dp;  MoE: r = etp + 2*pp + 4*edp.
     * rank 5: tp1 pp0 dp1.   rank 2: tp0 pp1 dp0 (same coordinates in MoE). */
    {"w8 tp2 pp2 dp2 | etp2, tp-pp-cp-ep-dp", 8, 2, 0, 2, 2, 2, 0, "tp-pp-cp-ep-dp", {2, 1, 2, 2, 2, 1, 2},
     {{5, {"4 5", "5", "1 5", "5 7", "4 5", "5", "1 5", "1 5", "4 5", "0 1 4 5"}},
      {2, {"2 3", "2", "2 6", "0 2", "2 3", "2", "2 6", "2 6", "2 3", "2 3 6 7"}},
      {-1, {0}}}},

    /* Defaults: world 16, TP2 CP2, dp = 0 -> 16/(2*2*1) = 4; etp = ep = 0 -> 1, EDP = 16.
     * attention: r = tp + 2*cp + 4*dp; MoE: r = edp.  rank 9: tp1 cp0 dp2. */
    {"w16 tp2 cp2 dp derived", 16, 2, 2, 0, 0, 0, 0, NULL, {2, 2, 4, 1, 1, 1, 16},
     {{9, {"8 9", "9 11", "1 5 9 13", "9", "9", "9", "0-15", "1 3 5 7 9 11 13 15", "8 9 10 11", "0-15"}},
      {-1, {0}}}},

    /* The case: 256 ranks, attention TP4 CP2 DP8 PP4, MoE EP64 ETP1 (EDP = 256/(64*4) = 1).
     * attention: r = tp + 4*cp + 8*dp + 64*pp;  MoE: r = ep + 64*pp (etp, edp = 1; pp stride 64 in both).
     *   TP: vary tp -> 4 consecutive ranks;  CP: vary cp -> step 4;  DP: vary dp -> step 8, 8 members;
     *   PP: vary pp -> step 64;  ETP, EDP: singletons;  EP: vary ep -> the 64 ranks of the stage;
     *   DP_CP: tp and pp fixed -> step 4, 16 members;  TP_CP: tp + 4*cp -> 8 consecutive ranks;
     *   TP_CP_DP: the 64 ranks of the stage.
     * rank 0:   tp0 cp0 dp0 pp0 | ep0  pp0
     * rank 1:   tp1 cp0 dp0 pp0 | ep1  pp0
     * rank 7:   tp3 cp1 dp0 pp0 | ep7  pp0          (7 = 3 + 4)
     * rank 100: tp0 cp1 dp4 pp1 | ep36 pp1          (100 = 0 + 4 + 32 + 64)
     * rank 255: tp3 cp1 dp7 pp3 | ep63 pp3          (255 = 3 + 4 + 56 + 192) */
    {"w256 tp4 cp2 dp8 pp4 | ep64 etp1", 256, 4, 2, 8, 4, 1, 64, NULL, {4, 2, 8, 4, 1, 64, 1},
     {{0, {"0-3", "0 4", "0-56:8", "0-192:64", "0", "0-63", "0", "0-60:4", "0-7", "0-63"}},
      {1, {"0-3", "1 5", "1-57:8", "1-193:64", "1", "0-63", "1", "1-61:4", "0-7", "0-63"}},
      {7, {"4-7", "3 7", "7-63:8", "7-199:64", "7", "0-63", "7", "3-63:4", "0-7", "0-63"}},
      {100, {"100-103", "96 100", "68-124:8", "36-228:64", "100", "64-127", "100", "64-124:4", "96-103", "64-127"}},
      {255, {"252-255", "251 255", "199-255:8", "63-255:64", "255", "192-255", "255", "195-255:4", "248-255", "192-255"}}}},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

START_TEST(test_table)
{
    const layout_case *tc = &cases[_i];
    moe_layout_config c = make_cfg(tc->world, tc->tp, tc->cp, tc->dp, tc->pp, tc->etp, tc->ep, tc->order);
    moe_layout *L = create_ok(&c);
    int32_t s[7] = {-1, -1, -1, -1, -1, -1, -1};
    ck_assert_int_eq(moe_layout_sizes(L, &s[0], &s[1], &s[2], &s[3], &s[4], &s[5], &s[6]), MOE_OK);
    for (int i = 0; i < 7; i++)
        ck_assert_msg(s[i] == tc->sizes[i], "%s: size %d is %d, expected %d", tc->name, i, s[i], tc->sizes[i]);
    /* hand-derived groups */
    for (int k = 0; k < 5 && tc->ranks[k].rank >= 0; k++) {
        const rank_expect *re = &tc->ranks[k];
        for (int g = 0; g < NG; g++) {
            int32_t want[MAXW], got[MAXW], count = -1, index = -1, qcount = -1, qindex = -1;
            int n = parse_ranks(re->groups[g], want, MAXW);
            int want_index = -1;
            for (int i = 0; i < n; i++)
                if (want[i] == re->rank) want_index = i;
            tu_check_msg(want_index >= 0, "%s: table error, rank %d not in its %s group", tc->name, re->rank,
                         group_names[g]);
            tu_check_int_eq(moe_layout_group(L, re->rank, g, got, MAXW, &count, &index), MOE_OK);
            tu_check_msg(count == n, "%s rank %d %s: %d members, expected %d", tc->name, re->rank, group_names[g], count, n);
            for (int i = 0; i < n; i++)
                tu_check_msg(got[i] == want[i], "%s rank %d %s: member %d is %d, expected %d", tc->name, re->rank,
                             group_names[g], i, got[i], want[i]);
            tu_check_msg(index == want_index, "%s rank %d %s: index %d, expected %d", tc->name, re->rank, group_names[g],
                         index, want_index);
            /* size query without a buffer */
            tu_check_int_eq(moe_layout_group(L, re->rank, g, NULL, 0, &qcount, &qindex), MOE_OK);
            tu_check_int_eq(qcount, n);
            tu_check_int_eq(qindex, want_index);
        }
    }
    /* every kind partitions the world, as the oracle says */
    oracle o;
    oracle_make(&o, tc->world, tc->sizes[0], tc->sizes[1], tc->sizes[2], tc->sizes[3], tc->sizes[4], tc->sizes[5],
                tc->order);
    check_structure(L, &o, tc->name);
    moe_layout_destroy(L);
}
END_TEST

/* 256 ranks: the group sizes and counts of every kind. */
START_TEST(test_large_sizes)
{
    moe_layout_config c = make_cfg(256, 4, 2, 8, 4, 1, 64, NULL);
    moe_layout *L = create_ok(&c);
    /* TP CP DP PP ETP EP EDP DP_CP TP_CP TP_CP_DP */
    const int32_t want[NG] = {4, 2, 8, 4, 1, 64, 1, 16, 8, 64};
    for (int g = 0; g < NG; g++)
        for (int r = 0; r < 256; r++) {
            int32_t count = -1;
            tu_check_int_eq(moe_layout_group(L, r, g, NULL, 0, &count, NULL), MOE_OK);
            tu_check_msg(count == want[g], "%s group of rank %d has %d members, expected %d", group_names[g], r, count,
                         want[g]);
        }
    moe_layout_destroy(L);
    /* dp derived from the world gives the same layout */
    c.dp = 0;
    L = create_ok(&c);
    int32_t dp = -1, edp = -1;
    ck_assert_int_eq(moe_layout_sizes(L, NULL, NULL, &dp, NULL, NULL, NULL, &edp), MOE_OK);
    ck_assert_int_eq(dp, 8);
    ck_assert_int_eq(edp, 1);
    moe_layout_destroy(L);
}
END_TEST

/* Every permutation of the five dimensions, over a few size sets: creation succeeds iff the pipeline
 * groups of both grids coincide, and then every group matches the oracle. */
START_TEST(test_all_orders)
{
    static const int32_t sizes[][7] = {
        /* world tp cp dp pp etp ep */
        {8, 2, 1, 4, 1, 1, 2},  {16, 2, 2, 4, 1, 2, 4}, {16, 2, 1, 4, 2, 1, 4}, {8, 2, 1, 2, 2, 2, 1},
        {24, 2, 3, 2, 2, 3, 2}, {12, 1, 2, 3, 2, 2, 3}, {16, 1, 1, 8, 2, 2, 2}, {32, 2, 2, 4, 2, 1, 16},
    };
    int perm[5] = {0, 1, 2, 3, 4};
    int accepted = 0, rejected = 0;
    /* under valgrind (tu_light) every 120 orders over the first three size sets */
    const size_t nsizes = tu_light() ? 3 : sizeof sizes / sizeof sizes[0];
    for (size_t si = 0; si < nsizes; si++) {
        const int32_t *z = sizes[si];
        /* iterate permutations of perm by Heap's algorithm (iterative form) */
        int cnt[5] = {0}, i = 0;
        for (int first = 1;; first = 0) {
            if (!first) {
                while (i < 5 && cnt[i] >= i) cnt[i++] = 0;
                if (i == 5) break;
                int j = (i % 2) ? cnt[i] : 0, t = perm[j];
                perm[j] = perm[i], perm[i] = t;
                cnt[i]++;
                i = 0;
            }
            char order[16];
            snprintf(order, sizeof order, "%s-%s-%s-%s-%s", dim_names[perm[0]], dim_names[perm[1]], dim_names[perm[2]],
                     dim_names[perm[3]], dim_names[perm[4]]);
            oracle o;
            oracle_make(&o, z[0], z[1], z[2], z[3], z[4], z[5], z[6], order);
            moe_layout_config c = make_cfg(z[0], z[1], z[2], z[3], z[4], z[5], z[6], order);
            moe_layout *L = SENTINEL_PTR;
            int32_t st = moe_layout_create(&c, &L);
            char name[96];
            snprintf(name, sizeof name, "world %d order %s", z[0], order);
            if (oracle_pp_consistent(&o)) {
                ck_assert_msg(st == MOE_OK, "%s: rejected although the pipeline groups agree", name);
                check_structure(L, &o, name);
                moe_layout_destroy(L);
                accepted++;
            } else {
                expect_tls(st, MOE_ERR_INVALID_ARGUMENT, "moe_layout_config.order", "pipeline", name);
                ck_assert_ptr_eq(L, SENTINEL_PTR);
                rejected++;
            }
        }
    }
    ck_assert_int_eq(accepted + rejected, (int)nsizes * 120);
    ck_assert_int_gt(rejected, 0); /* the sweep covers both outcomes */
}
END_TEST

/* ------------------------------------------------------------------ moe_comm_split_layout */
static struct {
    int32_t calls, color, key, status;
} split_log;
static moe_comm fake_sub;

static int32_t fake_split(moe_comm *c, int32_t color, int32_t key, moe_comm **out)
{
    split_log.calls++;
    split_log.color = color;
    split_log.key = key;
    if (split_log.status) return split_log.status;
    *out = &fake_sub;
    return MOE_OK;
}

static const moe_comm_ops fake_ops = {.name = "fake", .split = fake_split};
static const moe_comm_ops fake_nosplit_ops = {.name = "nosplit"};

static void fake_world(moe_comm *w, moe_context *ctx, const moe_comm_ops *ops, int32_t rank, int32_t size)
{
    memset(w, 0, sizeof *w);
    atomic_init(&w->refs, 1);
    w->ctx = ctx;
    w->ops = ops;
    w->rank = rank;
    w->size = size;
    w->timeout_ms = 1000;
}

/* Simulates every rank of the world: its (color, key) must describe exactly its group. */
static void check_split_colors(const moe_layout_config *cfg)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_layout *L = create_ok(cfg);
    const int32_t world = cfg->world_size;
    static int32_t color_of[MAXW], key_of[MAXW], first_of_color[MAXW], mem[MAXW];
    for (int g = 0; g < NG; g++) {
        int32_t size = 0;
        for (int i = 0; i < world; i++) first_of_color[i] = -1;
        for (int32_t r = 0; r < world; r++) {
            moe_comm w;
            fake_world(&w, ctx, &fake_ops, r, world);
            moe_comm *out = SENTINEL_PTR;
            memset(&split_log, 0, sizeof split_log);
            tu_check_int_eq(moe_comm_split_layout(&w, L, g, &out), MOE_OK);
            tu_check_int_eq(split_log.calls, 1);
            ck_assert_ptr_eq(out, &fake_sub);
            color_of[r] = split_log.color;
            key_of[r] = split_log.key;
            int32_t index = -1;
            tu_check_int_eq(moe_layout_group(L, r, g, mem, MAXW, &size, &index), MOE_OK);
            tu_check_msg(key_of[r] == index, "%s rank %d: key %d, index %d", group_names[g], r, key_of[r], index);
            tu_check_msg(color_of[r] >= 0 && color_of[r] < world / size, "%s rank %d: color %d outside 0..%d",
                         group_names[g], r, color_of[r], world / size - 1);
            /* one color per group, one group per color */
            if (first_of_color[color_of[r]] < 0) first_of_color[color_of[r]] = mem[0];
            tu_check_msg(first_of_color[color_of[r]] == mem[0], "%s: color %d names two groups", group_names[g],
                         color_of[r]);
        }
        for (int32_t r = 0; r < world; r++) {
            int32_t count = 0;
            tu_check_int_eq(moe_layout_group(L, r, g, mem, MAXW, &count, NULL), MOE_OK);
            for (int i = 0; i < count; i++) {
                tu_check_msg(color_of[mem[i]] == color_of[r], "%s: ranks %d and %d share a group but not a color",
                             group_names[g], r, mem[i]);
                tu_check_int_eq(key_of[mem[i]], i); /* the new comm's ranks follow the member order */
           }
       }
   }
   moe_layout_destroy(L);
    moe_context_destroy(ctx);
}

START_TEST(test_split_colors)
{
    moe_layout_config c = make_cfg(16, 2, 2, 4, 0, 2, 4, NULL);
    check_split_colors(&c);
    c = make_cfg(8, 2, 2, 2, 0, 0, 2, "tp-dp-cp-ep-pp");
    check_split_colors(&c);
    c = make_cfg(16, 2, 0, 4, 2, 0, 4, NULL);
    check_split_colors(&c);
    c = make_cfg(256, 4, 2, 8, 4, 1, 64, NULL);
    check_split_colors(&c);
}
END_TEST

START_TEST(test_split_errors)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_layout_config c = make_cfg(8, 2, 0, 4, 0, 0, 2, NULL);
    moe_layout *L = create_ok(&c);
    moe_comm w;
    moe_comm *out = SENTINEL_PTR;
    char msg[1024];
    const char *n[2];

    ck_assert_int_eq(moe_comm_split_layout(NULL, L, MOE_GROUP_EP, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_tls(MOE_ERR_INVALID_ARGUMENT, MOE_ERR_INVALID_ARGUMENT, "world is NULL", NULL, "NULL world");

#define SPLIT_FAILS(world_ptr, layout, group, outp, status, needle1, needle2, what)                                  \
    do {                                                                                                             \
        memset(&split_log, 0, sizeof split_log);                                                                     \
        int32_t st_ = moe_comm_split_layout(world_ptr, layout, group, outp);                                         \
        moe_context_last_error(ctx, msg, sizeof msg);                                                                \
        n[0] = needle1, n[1] = needle2;                                                                              \
        expect_error(st_, status, msg, n, 2, what);                                                                  \
        ck_assert_int_eq(split_log.calls, 0);                                                                        \
        ck_assert_ptr_eq(out, SENTINEL_PTR);                                                                         \
    } while (0)

    fake_world(&w, ctx, &fake_ops, 0, 8);
    SPLIT_FAILS(&w, L, MOE_GROUP_EP, NULL, MOE_ERR_INVALID_ARGUMENT, "out is NULL", NULL, "NULL out");
    SPLIT_FAILS(&w, NULL, MOE_GROUP_EP, &out, MOE_ERR_INVALID_ARGUMENT, "layout is NULL", NULL, "NULL layout");
    SPLIT_FAILS(&w, L, -1, &out, MOE_ERR_INVALID_ARGUMENT, "group = -1", NULL, "group -1");
    SPLIT_FAILS(&w, L, MOE_GROUP_NUM, &out, MOE_ERR_INVALID_ARGUMENT, "group = 10", NULL, "group 10");
    fake_world(&w, ctx, &fake_ops, 0, 4);
    SPLIT_FAILS(&w, L, MOE_GROUP_EP, &out, MOE_ERR_INVALID_ARGUMENT, "world has 4 ranks", "world_size = 8", "size mismatch");
    fake_world(&w, ctx, &fake_ops, 0, 8);
    w.broken = 1;
    SPLIT_FAILS(&w, L, MOE_GROUP_EP, &out, MOE_ERR_COMM, "broken", NULL, "broken world");
    fake_world(&w, ctx, &fake_nosplit_ops, 0, 8);
    SPLIT_FAILS(&w, L, MOE_GROUP_EP, &out, MOE_ERR_UNSUPPORTED, "nosplit", NULL, "no split op");

    /* the implementation's failure passes through unchanged and leaves *out alone */
    fake_world(&w, ctx, &fake_ops, 3, 8);
    memset(&split_log, 0, sizeof split_log);
    split_log.status = MOE_ERR_TIMEOUT;
    ck_assert_int_eq(moe_comm_split_layout(&w, L, MOE_GROUP_EP, &out), MOE_ERR_TIMEOUT);
    ck_assert_int_eq(split_log.calls, 1);
    ck_assert_ptr_eq(out, SENTINEL_PTR);
    /* rank 3: tp1 dp1 | ep1 edp1 -> EP group {2, 3} is the second of four: color 1, key 1 */
    ck_assert_int_eq(split_log.color, 1);
    ck_assert_int_eq(split_log.key, 1);
#undef SPLIT_FAILS
    moe_layout_destroy(L);
    moe_context_destroy(ctx);
}
END_TEST

/* The real self communicator: a one-rank layout splits into one-rank comms of every kind; a layout of
 * another world size is refused. */
START_TEST(test_split_self)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    moe_comm *world = NULL;
    ck_assert_int_eq(moe_comm_create_self(ctx, NULL, &world), MOE_OK);
    moe_layout_config c = make_cfg(1, 0, 0, 0, 0, 0, 0, NULL);
    moe_layout *L = create_ok(&c);
    for (int g = 0; g < NG; g++) {
        moe_comm *sub = NULL;
        int32_t rank = -1, size = -1;
        ck_assert_int_eq(moe_comm_split_layout(world, L, g, &sub), MOE_OK);
        ck_assert_ptr_nonnull(sub);
        ck_assert_int_eq(moe_comm_rank(sub, &rank), MOE_OK);
        ck_assert_int_eq(moe_comm_size(sub, &size), MOE_OK);
        ck_assert_int_eq(rank, 0);
        ck_assert_int_eq(size, 1);
        moe_comm_destroy(sub);
    }
    moe_layout_destroy(L);
    c = make_cfg(8, 2, 0, 4, 0, 0, 2, NULL);
    L = create_ok(&c);
    moe_comm *sub = SENTINEL_PTR;
    char msg[1024];
    const char *n[2] = {"world has 1 ranks", "world_size = 8"};
    int32_t st = moe_comm_split_layout(world, L, MOE_GROUP_EP, &sub);
    moe_context_last_error(ctx, msg, sizeof msg);
    expect_error(st, MOE_ERR_INVALID_ARGUMENT, msg, n, 2, "self comm, world 8 layout");
    ck_assert_ptr_eq(sub, SENTINEL_PTR);
    moe_layout_destroy(L);
    moe_comm_destroy(world);
    moe_context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------ validation */
typedef struct bad_case {
    const char *what;
    int32_t world, tp, cp, dp, pp, etp, ep;
    const char *order;
    const char *needle1, *needle2;
} bad_case;

static const bad_case bad_cases[] = {
    {"world 0", 0, 1, 0, 0, 0, 0, 0, NULL, "moe_layout_config.world_size = 0", ">= 1"},
    {"world negative", -4, 1, 0, 0, 0, 0, 0, NULL, "moe_layout_config.world_size = -4", NULL},
    {"tp negative", 8, -1, 0, 0, 0, 0, 0, NULL, "moe_layout_config.tp = -1", "negative"},
    {"cp negative", 8, 0, -2, 0, 0, 0, 0, NULL, "moe_layout_config.cp = -2", "negative"},
    {"dp negative", 8, 0, 0, -1, 0, 0, 0, NULL, "moe_layout_config.dp = -1", "negative"},
    {"pp negative", 8, 0, 0, 0, -1, 0, 0, NULL, "moe_layout_config.pp = -1", "negative"},
    {"etp negative", 8, 0, 0, 0, 0, -1, 0, NULL, "moe_layout_config.etp = -1", "negative"},
    {"ep negative", 8, 0, 0, 0, 0, 0, -3, NULL, "moe_layout_config.ep = -3", "negative"},
    {"tp above world", 8, 16, 0, 0, 0, 0, 0, NULL, "moe_layout_config.tp = 16", "exceeds world_size = 8"},
    {"ep above world", 8, 0, 0, 0, 0, 0, 9, NULL, "moe_layout_config.ep = 9", "exceeds world_size = 8"},
    {"world not divisible (dp derived)", 12, 5, 0, 0, 0, 0, 0, NULL, "moe_layout_config.dp = 0",
     "not divisible by tp*cp*pp = 5*1*1 = 5"},
    {"tp*cp*pp above world (dp derived)", 8, 4, 4, 0, 0, 0, 0, NULL, "moe_layout_config.dp = 0", "tp*cp*pp = 4*4*1 exceeds"},
    {"tp*cp*dp*pp below world", 8, 2, 0, 2, 0, 0, 0, NULL, "tp*cp*dp*pp = 2*1*2*1 = 4 differs from world_size = 8", NULL},
    {"tp*cp*dp*pp above world", 8, 2, 0, 8, 0, 0, 0, NULL, "tp*cp*dp*pp = 2*1*8*1 exceeds world_size = 8", NULL},
    {"etp*ep*pp does not divide", 12, 2, 0, 6, 0, 0, 8, NULL, "etp*ep*pp = 1*8*1 = 8 does not divide world_size = 12", NULL},
    {"etp*ep*pp above world", 8, 0, 0, 8, 0, 4, 4, NULL, "etp*ep*pp = 4*4*1 exceeds world_size = 8", NULL},
    {"etp*ep*pp with pp", 16, 2, 0, 4, 2, 2, 3, NULL, "etp*ep*pp = 2*3*2 = 12 does not divide world_size = 16", NULL},
    {"order empty", 8, 0, 0, 0, 0, 0, 0, "", "moe_layout_config.order = \"\"", "empty"},
    {"order missing pp", 8, 0, 0, 0, 0, 0, 0, "tp-cp-ep-dp", "moe_layout_config.order", "lacks \"pp\""},
    {"order missing ep", 8, 0, 0, 0, 0, 0, 0, "tp-cp-dp-pp", "moe_layout_config.order", "lacks \"ep\""},
    {"order duplicate", 8, 0, 0, 0, 0, 0, 0, "tp-tp-ep-dp-pp", "moe_layout_config.order", "\"tp\" twice"},
    {"order six tokens", 8, 0, 0, 0, 0, 0, 0, "tp-cp-ep-dp-pp-tp", "moe_layout_config.order", "\"tp\" twice"},
    {"order unknown token", 8, 0, 0, 0, 0, 0, 0, "tp-cp-xp-dp-pp", "moe_layout_config.order", "unknown token \"xp\""},
    {"order upper case", 8, 0, 0, 0, 0, 0, 0, "TP-CP-EP-DP-PP", "moe_layout_config.order", "unknown token \"TP\""},
    {"order etp token", 8, 0, 0, 0, 0, 0, 0, "etp-cp-ep-dp-pp", "moe_layout_config.order", "unknown token \"etp\""},
    {"order no separators", 8, 0, 0, 0, 0, 0, 0, "tpcpepdppp", "moe_layout_config.order", "unknown token"},
    {"order trailing space", 8, 0, 0, 0, 0, 0, 0, "tp-cp-ep-dp-pp ", "moe_layout_config.order", "unknown token \"pp \""},
    {"order double dash", 8, 0, 0, 0, 0, 0, 0, "tp--cp-ep-dp-pp", "moe_layout_config.order", "empty token at position 2"},
    {"order trailing dash", 8, 0, 0, 0, 0, 0, 0, "tp-cp-ep-dp-pp-", "moe_layout_config.order", "empty token at position 6"},
    {"order leading dash", 8, 0, 0, 0, 0, 0, 0, "-tp-cp-ep-dp-pp", "moe_layout_config.order", "empty token at position 1"},
    {"order comma", 8, 0, 0, 0, 0, 0, 0, "tp,cp,ep,dp,pp", "moe_layout_config.order", "unknown token"},
    /* attention pp stride tp = 2, MoE pp stride etp = 1: different pipeline groups */
    {"pp inconsistent", 8, 2, 0, 2, 2, 0, 2, "tp-pp-cp-ep-dp", "moe_layout_config.order = \"tp-pp-cp-ep-dp\"",
     "pipeline groups"},
};
enum { NBAD = sizeof bad_cases / sizeof bad_cases[0] };

START_TEST(test_bad_config)
{
    const bad_case *b = &bad_cases[_i];
    moe_layout_config c = make_cfg(b->world, b->tp, b->cp, b->dp, b->pp, b->etp, b->ep, b->order);
    moe_layout *L = SENTINEL_PTR;
    int32_t st = moe_layout_create(&c, &L);
    expect_tls(st, MOE_ERR_INVALID_ARGUMENT, b->needle1, b->needle2, b->what);
    ck_assert_ptr_eq(L, SENTINEL_PTR);
}
END_TEST

START_TEST(test_header_and_null)
{
    moe_layout_config c = make_cfg(8, 2, 0, 4, 0, 0, 2, NULL), bad;
    moe_layout *L = SENTINEL_PTR;

    expect_tls(moe_layout_config_init(NULL, sizeof c), MOE_ERR_INVALID_ARGUMENT, "moe_layout_config_init", "cfg is NULL",
               "init NULL");
    expect_tls(moe_layout_config_init(&bad, 8), MOE_ERR_VERSION, "moe_layout_config_init", "struct_size = 8",
               "init small size");
    ck_assert_int_eq(moe_layout_config_init(&bad, sizeof bad), MOE_OK);
    ck_assert_uint_eq(bad.struct_size, sizeof bad);
    ck_assert_uint_eq(bad.api_version, MOE_API_VERSION);
    ck_assert_int_eq(bad.world_size, 0);
    ck_assert_ptr_null(bad.order);

    expect_tls(moe_layout_create(NULL, &L), MOE_ERR_INVALID_ARGUMENT, "cfg is NULL", "moe_layout_config", "NULL cfg");
    ck_assert_ptr_eq(L, SENTINEL_PTR);
    expect_tls(moe_layout_create(&c, NULL), MOE_ERR_INVALID_ARGUMENT, "moe_layout_create", "out is NULL", "NULL out");

    bad = c;
    bad.struct_size = 8;
    expect_tls(moe_layout_create(&bad, &L), MOE_ERR_VERSION, "moe_layout_config.struct_size = 8", NULL, "small struct");
    bad = c;
    bad.api_version = 0;
    expect_tls(moe_layout_create(&bad, &L), MOE_ERR_VERSION, "moe_layout_config.api_version = 0", NULL, "version 0");
    bad = c;
    bad.api_version = (MOE_VERSION_MAJOR + 1) * 10000;
    expect_tls(moe_layout_create(&bad, &L), MOE_ERR_VERSION, "moe_layout_config.api_version", NULL, "next major");
    bad = c;
    bad.next = &c;
    expect_tls(moe_layout_create(&bad, &L), MOE_ERR_UNSUPPORTED, "moe_layout_config.next", NULL, "next set");
    ck_assert_ptr_eq(L, SENTINEL_PTR);

    /* a newer host's larger struct: a zero tail is fine, a set field beyond ours is not */
    struct {
        moe_layout_config c;
        int64_t extra[2];
    } big;
    memset(&big, 0, sizeof big);
    ck_assert_int_eq(moe_layout_config_init(&big.c, sizeof big), MOE_OK);
    big.c.world_size = 8, big.c.tp = 2, big.c.ep = 2;
    ck_assert_int_eq(moe_layout_create(&big.c, &L), MOE_OK);
    ck_assert_ptr_ne(L, SENTINEL_PTR);
    int32_t dp = 0;
    ck_assert_int_eq(moe_layout_sizes(L, NULL, NULL, &dp, NULL, NULL, NULL, NULL), MOE_OK);
    ck_assert_int_eq(dp, 4);
    moe_layout_destroy(L);
    L = SENTINEL_PTR;
    big.extra[1] = 1;
    expect_tls(moe_layout_create(&big.c, &L), MOE_ERR_VERSION, "moe_layout_config", "byte offset", "nonzero tail");
    ck_assert_ptr_eq(L, SENTINEL_PTR);

    moe_layout_destroy(NULL); /* no-op */
}
END_TEST

START_TEST(test_query_errors)
{
    moe_layout_config c = make_cfg(8, 2, 0, 4, 0, 0, 2, NULL);
    moe_layout *L = create_ok(&c);
    int32_t mem[8], count = SENTINEL_I32, index = SENTINEL_I32, tp = SENTINEL_I32;
    for (int i = 0; i < 8; i++) mem[i] = SENTINEL_I32;

    expect_tls(moe_layout_sizes(NULL, &tp, NULL, NULL, NULL, NULL, NULL, NULL), MOE_ERR_INVALID_ARGUMENT,
               "moe_layout_sizes", "layout is NULL", "sizes NULL");
    ck_assert_int_eq(tp, SENTINEL_I32);

    expect_tls(moe_layout_group(NULL, 0, MOE_GROUP_TP, mem, 8, &count, &index), MOE_ERR_INVALID_ARGUMENT,
               "moe_layout_group", "layout is NULL", "group NULL layout");
    expect_tls(moe_layout_group(L, 0, -1, mem, 8, &count, &index), MOE_ERR_INVALID_ARGUMENT, "moe_layout_group",
               "group = -1", "group -1");
    expect_tls(moe_layout_group(L, 0, MOE_GROUP_NUM, mem, 8, &count, &index), MOE_ERR_INVALID_ARGUMENT,
               "moe_layout_group", "group = 10", "group 10");
    expect_tls(moe_layout_group(L, -1, MOE_GROUP_TP, mem, 8, &count, &index), MOE_ERR_INVALID_ARGUMENT,
               "rank = -1", "0 .. 7", "rank -1");
    expect_tls(moe_layout_group(L, 8, MOE_GROUP_TP, mem, 8, &count, &index), MOE_ERR_INVALID_ARGUMENT, "rank = 8",
               "0 .. 7", "rank 8");
    expect_tls(moe_layout_group(L, 0, MOE_GROUP_TP, mem, -1, &count, &index), MOE_ERR_INVALID_ARGUMENT, "cap = -1",
               NULL, "cap negative");
    ck_assert_int_eq(count, SENTINEL_I32);
    ck_assert_int_eq(index, SENTINEL_I32);
    for (int i = 0; i < 8; i++) ck_assert_int_eq(mem[i], SENTINEL_I32);

    /* too small a buffer: an error, but *count (and *index) answer so the caller can retry */
    expect_tls(moe_layout_group(L, 5, MOE_GROUP_DP, mem, 3, &count, &index), MOE_ERR_INVALID_ARGUMENT, "cap = 3",
               "4 members", "cap small");
    ck_assert_int_eq(count, 4);
    ck_assert_int_eq(index, 2); /* rank 5 in DP {1, 3, 5, 7} */
    for (int i = 0; i < 8; i++) ck_assert_int_eq(mem[i], SENTINEL_I32);
    /* cap == size works; count and index may be NULL */
    ck_assert_int_eq(moe_layout_group(L, 5, MOE_GROUP_DP, mem, 4, NULL, NULL), MOE_OK);
    ck_assert_int_eq(mem[0], 1);
    ck_assert_int_eq(mem[3], 7);
    ck_assert_int_eq(mem[4], SENTINEL_I32);
    moe_layout_destroy(L);
}
END_TEST

static Suite *layout_suite(void)
{
    Suite *s = suite_create("layout");
    TCase *t = tcase_create("groups");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, test_table, 0, NCASES);
    tcase_add_test(t, test_large_sizes);
    tcase_add_test(t, test_all_orders);
    suite_add_tcase(s, t);
    t = tcase_create("split");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_split_colors);
    tcase_add_test(t, test_split_errors);
    tcase_add_test(t, test_split_self);
    suite_add_tcase(s, t);
    t = tcase_create("validation");
    tcase_add_loop_test(t, test_bad_config, 0, NBAD);
    tcase_add_test(t, test_header_and_null);
    tcase_add_test(t, test_query_errors);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(layout_suite()); }
