/* The device simulator tests' check (each test is one file, so the counters are its own): a check
 * that holds counts as passed; one that fails prints its line, its condition and a message. Each test
 * prints "N passed, M failed" last, which is what ctest reads. */
#ifndef MOE_DEVSIM_CHECK_H
#define MOE_DEVSIM_CHECK_H

#include <stdio.h>

static int passed, failed;
#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (cond) passed++;                                                                                        \
        else {                                                                                                     \
            failed++;                                                                                              \
            printf("FAIL line %d: %s: ", __LINE__, #cond);                                                         \
            printf(__VA_ARGS__);                                                                                   \
            printf("\n");                                                                                          \
        }                                                                                                          \
    } while (0)

#endif /* MOE_DEVSIM_CHECK_H */
