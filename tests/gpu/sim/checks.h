/* The simulator tests' checks (test_sim.cc, test_lt_probe.c): CHECK counts and prints the failing line;
 * each test prints "N passed, M failed" last from `passed` and `failed`. */
#ifndef MOE_TESTS_GPU_SIM_CHECKS_H
#define MOE_TESTS_GPU_SIM_CHECKS_H

#include <stdio.h>

static int passed, failed;
#define CHECK(cond)                                                                                                \
    do {                                                                                                           \
        if (cond) passed++;                                                                                        \
        else {                                                                                                     \
            failed++;                                                                                              \
            printf("FAIL line %d: %s\n", __LINE__, #cond);                                                         \
        }                                                                                                          \
    } while (0)

#endif
