/* plim_platform.h: portability shims for the pylimiter core.
 *
 * The core needs exactly two primitives from the platform: C11 atomics on a
 * 64-bit word and a plain mutex.  The mutex is a pthread mutex on POSIX (its
 * symbols predate glibc 2.17, so a manylinux2014 wheel can ship it; C11
 * <threads.h> would need glibc 2.28) and an SRWLOCK on Windows.
 * Nothing here allocates and nothing here includes Python headers.
 */
#ifndef PLIM_PLATFORM_H
#define PLIM_PLATFORM_H

#include <stdint.h>
#include <stddef.h>

#if defined(_MSC_VER) && !defined(__clang__)
/* MSVC needs /std:c11 /experimental:c11atomics for <stdatomic.h>. */
#  define PLIM_INLINE static __inline
#  define PLIM_LIKELY(x) (x)
#  define PLIM_UNLIKELY(x) (x)
#else
#  define PLIM_INLINE static inline
#  define PLIM_LIKELY(x) __builtin_expect(!!(x), 1)
#  define PLIM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#endif

#include <stdatomic.h>

#ifdef PLIM_DEBUG
#  include <assert.h>
#  define PLIM_ASSERT(x) assert(x)
#else
#  define PLIM_ASSERT(x) ((void)0)
#endif

#ifdef _WIN32
#  define WIN32_LEAN_AND_MEAN
#  include <windows.h>
typedef SRWLOCK plim_mutex_t;
PLIM_INLINE int plim_mutex_init(plim_mutex_t *m) { InitializeSRWLock(m); return 0; }
PLIM_INLINE void plim_mutex_destroy(plim_mutex_t *m) { (void)m; }
PLIM_INLINE void plim_mutex_lock(plim_mutex_t *m) { AcquireSRWLockExclusive(m); }
PLIM_INLINE void plim_mutex_unlock(plim_mutex_t *m) { ReleaseSRWLockExclusive(m); }
#else
#  include <pthread.h>
typedef pthread_mutex_t plim_mutex_t;
PLIM_INLINE int plim_mutex_init(plim_mutex_t *m) { return pthread_mutex_init(m, NULL); }
PLIM_INLINE void plim_mutex_destroy(plim_mutex_t *m) { pthread_mutex_destroy(m); }
PLIM_INLINE void plim_mutex_lock(plim_mutex_t *m) { pthread_mutex_lock(m); }
PLIM_INLINE void plim_mutex_unlock(plim_mutex_t *m) { pthread_mutex_unlock(m); }
#endif

#endif /* PLIM_PLATFORM_H */
