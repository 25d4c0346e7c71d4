/* Minimal assertion helpers for the C tier: no framework, so the tests build
 * with nothing but a C11 compiler and run the same under TSAN/ASAN/qemu. */
#ifndef PLIM_TEST_H
#define PLIM_TEST_H
#include <stdio.h>
#include <stdlib.h>

static int plim_test_failures = 0;
static int plim_test_passed = 0;
static int plim_test_failed = 0;

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            plim_test_failures++;                                            \
        }                                                                    \
    } while (0)

#define CHECK_EQ(a, b)                                                        \
    do {                                                                      \
        long long va_ = (long long)(a), vb_ = (long long)(b);                 \
        if (va_ != vb_) {                                                     \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld != %lld)\n", \
                    __FILE__, __LINE__, #a, #b, va_, vb_);                    \
            plim_test_failures++;                                             \
        }                                                                     \
    } while (0)

#define RUN(fn)                                                   \
    do {                                                          \
        int before_ = plim_test_failures;                         \
        fn();                                                     \
        if (plim_test_failures == before_) plim_test_passed++;    \
        else { plim_test_failed++; fprintf(stderr, "FAILED %s\n", #fn); }                 \
    } while (0)

#define TEST_EXIT()                                                        \
    do {                                                                   \
        printf("%d passed, %d failed\n", plim_test_passed,                 \
               plim_test_failed);                                          \
        return plim_test_failures ? 1 : 0;                                 \
    } while (0)

#endif
