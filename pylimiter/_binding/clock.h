/* clock.h: the monotonic clock of wait-time statistics and request
 * deadlines, in int64 nanoseconds.
 *
 * Part of the limiter's binding (pylimiter/_limiter_c.pyx), not of the core:
 * csrc/ takes no clock, its callers pass times in.  Python.h comes first,
 * as everywhere in this folder: it sets the feature macros that declare
 * clock_gettime under -std=c11.
 *
 * Rules: called on slow paths only (enqueue, grants of queued waiters, timer
 * arming), never per uncontended acquire; safe without the GIL (the
 * binding declares it nogil), since it touches no Python object.  On
 * Windows the frequency is read once and cached in a static; a race on that
 * first read writes the same value twice.
 */
#ifndef PLIM_BINDING_CLOCK_H
#define PLIM_BINDING_CLOCK_H

#include <Python.h>
#include <stdint.h>
#ifdef _WIN32
#  include <windows.h>
#else
#  include <time.h>
#endif

static int64_t plim_monotonic_ns(void)
{
#ifdef _WIN32
    static LARGE_INTEGER freq;
    LARGE_INTEGER now;
    if (freq.QuadPart == 0)
        QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&now);
    return (int64_t)((double)now.QuadPart * 1e9 / (double)freq.QuadPart);
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

#endif /* PLIM_BINDING_CLOCK_H */
