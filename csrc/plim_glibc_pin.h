/* plim_glibc_pin.h: bind the few glibc symbols plim_shm.c calls that a new
 * glibc versions anew to their oldest versions, so that an extension built
 * on this Debian (glibc 2.36) still loads on manylinux_2_17 (glibc 2.17).
 *
 * Invariants:
 *  - Only symbols whose old and new versions are one function at one
 *    address in the new glibc (objdump -T libc.so.6 shows both): the
 *    pthread_* calls moved from libpthread into libc in 2.34 (new version
 *    GLIBC_2.34; pthread_sigmask GLIBC_2.32) with the same ABI.  The old
 *    version is what every binary linked before the move references.
 *  - fstat is not pinned: before 2.33 it was an inline wrapper of
 *    __fxstat, with no symbol of its own, so plim_shm.c asks the kernel
 *    directly (plim_fstat below) for the two fields it reads.
 *  - Pinned only where PLIM_PIN_GLIBC is defined (setup.py, for the
 *    extension; not under a sanitizer, whose runtime intercepts pthread_*
 *    by their unversioned names, and not in the C tests, which link
 *    statically against this host's glibc).
 * Locking: none (declarations only).  Included by plim_shm.c alone; it has
 * no Python headers, as all of csrc/.
 */
#ifndef PLIM_GLIBC_PIN_H
#define PLIM_GLIBC_PIN_H

#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(PLIM_PIN_GLIBC) && defined(__GLIBC__)
#  if defined(__x86_64__)
#    define PLIM_GLIBC_BASE "GLIBC_2.2.5"
#  elif defined(__aarch64__)
#    define PLIM_GLIBC_BASE "GLIBC_2.17"
#  endif
#  ifdef PLIM_GLIBC_BASE
__asm__(".symver pthread_create,pthread_create@" PLIM_GLIBC_BASE);
__asm__(".symver pthread_join,pthread_join@" PLIM_GLIBC_BASE);
__asm__(".symver pthread_attr_setstacksize,pthread_attr_setstacksize@" PLIM_GLIBC_BASE);
__asm__(".symver pthread_sigmask,pthread_sigmask@" PLIM_GLIBC_BASE);
#  endif
#endif

/* The (st_dev, st_ino) of an open file, from the kernel: 0 or -1 (errno).
 * The kernel's struct stat is glibc's on x86_64 and aarch64 (the generic
 * 64-bit layout), and dev and ino are its first two fields on both. */
static inline int plim_fstat_ids(int fd, uint64_t *dev, uint64_t *ino)
{
#if defined(SYS_fstat)
    struct stat st;
    if (syscall(SYS_fstat, fd, &st) != 0)
        return -1;
#else
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -1;
#endif
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
    return 0;
}

#endif
