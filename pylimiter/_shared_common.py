"""What the two host-wide limiter twins share (issue 33): the segment's
layout, the name and path rules, opening and validating the file, the
liveness locks, the error type and messages.

The segment is one file ``<directory>/pylimiter-<uid>-<name>`` mapped
MAP_SHARED by every process that opens it.  Both twins use the same layout
(below) and the same open/attach protocol, written here once; they differ in
the implementation tag of the header (a process of one twin refuses the
other's segment) and in how they lock the state while they change it: the C
twin with a futex word in the header (csrc/plim_shm.c), the pure twin with an
OFD lock on a byte of the file.  ``csrc/plim_shm.c`` opens with the
implementation notes: the invariants, who repairs what after which death,
and why hostile bytes cannot make either twin misbehave.

Liveness without trusting pids: each attached process holds an OFD write
lock (``F_OFD_SETLK``) on byte ``LOCK_BASE + slot`` through a file
description of its own.  The kernel drops it when the process dies, however
it dies, so ``F_OFD_GETLK`` on that byte tells a dead slot from a live one
with no pid-reuse race.  Byte ``OPEN_BYTE`` serialises opens, attaches and
re-initialisations.  Locks may lie beyond the end of the file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import re
import stat
import struct
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ._common import MAX_PERMITS

__all__ = ["SharedLimiterError"]


class SharedLimiterError(OSError):
    """The host-wide limiter's segment cannot be used: the file is missing
    or not ours (a symlink, another owner, a mode other than 0600), its
    header or size does not check, it was made by the other implementation,
    more processes than ``max_processes`` are attached, or its content was
    found corrupt while in use.  ``filename`` is the segment's path."""

    def __str__(self) -> str:
        if len(self.args) == 1:
            return str(self.args[0])
        return super().__str__()


def shared_error(path: str, reason: str, err: Optional[int] = None) -> SharedLimiterError:
    """A SharedLimiterError naming ``path`` and ``reason``."""
    exc = SharedLimiterError(f"pylimiter: shared limiter segment {path}: {reason}")
    exc.filename = path
    if err is not None:
        exc.errno = err
        exc.strerror = os.strerror(err)
    return exc


# ---- platforms --------------------------------------------------------------

#: Where the host-wide limiter runs: Linux on these machines (futexes and OFD
#: locks; the wheels).  A test may patch PLATFORM to see the refusal.
SUPPORTED = (("linux", "x86_64"), ("linux", "aarch64"))
PLATFORM = (sys.platform, platform.machine())


def check_platform(what: str) -> None:
    """NotImplementedError naming the platform, off Linux x86_64/aarch64."""
    plat, machine = PLATFORM
    if (plat, machine) not in SUPPORTED and not (plat.startswith("linux") and (
            "linux", machine) in SUPPORTED):
        raise NotImplementedError(
            f"pylimiter: {what} needs Linux on x86_64 or aarch64; this platform "
            f"is {plat} on {machine or 'an unknown machine'}")


# ---- names and paths --------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
ENV_DIR = "PYLIMITER_SHM_DIR"
DEFAULT_DIR = "/dev/shm"


def check_name(name: object) -> str:
    """A segment name: 1-100 characters of [A-Za-z0-9._-], not starting
    with "." (TypeError for a non-str, ValueError otherwise)."""
    if not isinstance(name, str):
        raise TypeError(f"pylimiter: the name must be a str, not {type(name).__name__}")
    name = str.__str__(name)
    if not _NAME.fullmatch(name) or name.startswith("."):
        raise ValueError(
            f"pylimiter: invalid shared limiter name {name!r}: 1-100 characters of "
            "A-Z a-z 0-9 . _ -, not starting with '.'")
    return name


def segment_dir(directory: object) -> str:
    """The directory argument (str or path-like; None: $PYLIMITER_SHM_DIR,
    else /dev/shm) as a str."""
    if directory is None:
        directory = os.environ.get(ENV_DIR) or DEFAULT_DIR
    if isinstance(directory, bytes) or not isinstance(directory, (str, os.PathLike)):
        raise TypeError("pylimiter: directory must be a str, a path-like object or None, "
                        f"not {type(directory).__name__}")
    d = os.fspath(directory)
    if not isinstance(d, str):
        raise TypeError("pylimiter: directory must name a str path")
    if not d or "\0" in d:
        raise ValueError(f"pylimiter: invalid directory {d!r}")
    return d


def segment_path(name: str, directory: str) -> str:
    return os.path.join(directory, f"pylimiter-{os.geteuid()}-{name}")


# ---- creation settings ------------------------------------------------------

#: The largest max_queue_size (records are preallocated in the file, sparse).
MAX_QUEUE_LIMIT = 1 << 20
#: Records of an unbounded queue (max_queue_size <= 0), per pool.
UNBOUNDED_QUEUE_RECORDS = 1 << 16
#: The largest max_processes.
MAX_PROCESSES_LIMIT = 4096


def check_int(value: object, what: str) -> int:
    if type(value) is bool or not isinstance(value, int):
        raise TypeError(f"pylimiter: {what} must be an int, not {type(value).__name__}")
    return int.__index__(value)


def check_settings(maxes: tuple[object, ...], names: tuple[str, ...], max_queue_size: object,
                   max_processes: object) -> tuple[tuple[int, ...], int, int]:
    """The creation settings' checks (TypeError / ValueError)."""
    out = []
    for value, what in zip(maxes, names):
        v = check_int(value, what)
        if v > MAX_PERMITS:
            raise ValueError(f"pylimiter: {what}={v} exceeds {MAX_PERMITS}")
        out.append(v)
    q = check_int(max_queue_size, "max_queue_size")
    if q > MAX_QUEUE_LIMIT:
        raise ValueError(f"pylimiter: max_queue_size={q} exceeds {MAX_QUEUE_LIMIT} "
                         "(a shared queue's records live in the segment); use <= 0 for "
                         f"an unbounded queue of up to {UNBOUNDED_QUEUE_RECORDS} requests")
    p = check_int(max_processes, "max_processes")
    if not 1 <= p <= MAX_PROCESSES_LIMIT:
        raise ValueError(f"pylimiter: max_processes must be in 1..{MAX_PROCESSES_LIMIT}, "
                         f"got {p}")
    return tuple(out), q, p


# ---- the layout ---------------------------------------------------------------
# Every offset below is computed from the creation settings this process
# validated when it opened the file, never re-read from the file: bytes
# written into a live segment cannot move what this process reads or writes.
# Little-endian native (x86_64, aarch64); all fields naturally aligned.

MAGIC = b"PLIMSHM\x01"
LAYOUT_VERSION = 2   # 2: the C twin's counter word and two-line slots
IMPL_C = 1
IMPL_PY = 2
IMPL_NAMES = {IMPL_C: "the C implementation", IMPL_PY: "the pure-Python implementation"}
KIND_SEM = 1
KIND_DUAL = 2
KIND_NAMES = {KIND_SEM: "a SharedSemaphore", KIND_DUAL: "a SharedDualMemoryLimiter"}
NIL = 0xFFFFFFFF
PAGE = 4096

HEADER_SIZE = 256
POOL_SIZE = 256
SLOT_SIZE = 128
REC_SIZE = 96

# header
H_MAGIC = 0          # 8s
H_VERSION = 8        # u32
H_IMPL = 12          # u32
H_SIZE = 16          # u64
H_KIND = 24          # u32
H_NPOOLS = 28        # u32
H_CFG_MAX = 32       # i64[2]: max_permits per pool at creation
H_CFG_QUEUE = 48     # i64
H_MAXPROC = 56       # u32
H_NREC = 60          # u32
H_MUTEX = 64         # u32 (C twin: the futex mutex word)
H_DIRTY = 68         # u32 (pure twin: a critical section is under way)
H_SEQ = 72           # u64 arrival counter
H_FREE = 80          # u32 free record list head
H_BUMP = 84          # u32 records >= bump were never used (free)
H_EPOCH = 88         # u32 re-initialisations
H_TICKET = 92        # u32 record tickets
H_SWEEP = 96         # i64 monotonic ns of the last sweep for dead processes
H_REPAIR_AT = 104    # i64 (C twin) a repair is due again from then (0: none)
HEADER_FMT = "<8sIIQII2qqII"
HEADER_STRUCT = struct.Struct(HEADER_FMT)

# pool
P_MAX = 0            # i64 the live limit (<= 0: unbounded)
P_AVAIL = 8          # pure twin: i64 max - acquired (bounded), -acquired
                     # (unbounded); C twin: u64 the counter word, flags |
                     # (avail + W_BIAS) << 3 (csrc/plim_shm.c)
P_HEAD = 16          # u32
P_TAIL = 20          # u32
P_QLEN = 24          # i64
P_ACQ_TOTAL = 32     # i64 counters
P_TIMEOUT_TOTAL = 40
P_FULL_TOTAL = 48
P_CANCEL_TOTAL = 56
P_WAIT_NS = 64       # i64 sum of waits, ns
P_HWM = 72           # i64 high-water mark of acquired permits
P_BUCKETS = 80       # i64[16] wait histogram (per bucket)

# slot
S_STATE = 0          # u32 FREE / LIVE
S_GEN = 4            # u32 bumped at every registration and every death
S_PID = 8            # i32
S_WAKE = 12          # u32 the process's waker futex (C twin)
S_LOOPMASK = 16      # u64 loops of that process with a decided request (C twin)
S_HELD = 24          # i64[2] permits this process holds, per pool (C twin:
                     # through critical sections; it holds S_HELD + S_FHELD)
S_DIRECT = 40        # u64 (C twin) its loops with a wake socket
S_INFLIGHT = 64      # u32 (C twin) inside a lock-free path
S_FHELD = 72         # i64[2] (C twin) permits held through lock-free paths
S_FCOUNT = 88        # i64[2] (C twin) lock-free grants made through the slot

# the C twin's counter word (csrc/plim_shm.h, PLIM_SHM_W_*)
W_QUEUED = 1
W_RECOVERING = 2
W_UNBOUNDED = 4
W_SHIFT = 3
W_BIAS = 1 << 60


def c_word(avail: int, max_permits: int) -> int:
    """The C twin's counter word for an idle pool with ``avail`` free."""
    return ((avail + W_BIAS) << W_SHIFT) | (0 if max_permits > 0 else W_UNBOUNDED)

SLOT_FREE = 0
SLOT_LIVE = 1

# record
R_STATE = 0          # u32 a W_* state; 0 (W_IDLE) is FREE
R_OWNER = 4          # u32 slot
R_OWNER_GEN = 8      # u32
R_TICKET = 12        # u32
R_POOL = 16          # u32
R_TAG = 20           # u32 0: a blocking thread; else the owner's loop bit + 1
R_PREV = 24          # u32
R_NEXT = 28          # u32
R_NEED = 32          # i64
R_TOTAL = 40         # i64
R_GRANTED = 48       # i64
R_SEQ = 56           # u64
R_ENQ_NS = 64        # i64
R_LIMIT = 72         # i64 the limit that made it TOO_LARGE

# OFD lock bytes (beyond any file size)
LOCK_BASE = 1 << 40
OPEN_BYTE = LOCK_BASE - 1
MUTEX_BYTE = LOCK_BASE - 2   # the pure twin's mutex


def nrecords(npools: int, max_queue: int, max_processes: int) -> int:
    """Records: each pool's queue twice over (queued, plus granted and not
    yet collected by its owner), and two per process."""
    q = max_queue if max_queue > 0 else UNBOUNDED_QUEUE_RECORDS
    return npools * 2 * q + 2 * max_processes


@dataclass(frozen=True)
class Layout:
    """Offsets of one segment, from its creation settings."""

    npools: int
    max_processes: int
    nrec: int

    @property
    def pools(self) -> int:
        return HEADER_SIZE

    @property
    def slots(self) -> int:
        return HEADER_SIZE + POOL_SIZE * self.npools

    @property
    def records(self) -> int:
        return self.slots + SLOT_SIZE * self.max_processes

    @property
    def size(self) -> int:
        raw = self.records + REC_SIZE * self.nrec
        return (raw + PAGE - 1) // PAGE * PAGE

    def pool(self, i: int) -> int:
        return HEADER_SIZE + POOL_SIZE * i

    def slot(self, i: int) -> int:
        return self.slots + SLOT_SIZE * i

    def rec(self, i: int) -> int:
        return self.records + REC_SIZE * i


# ---- OFD locks ------------------------------------------------------------------
# struct flock on LP64 Linux: short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid (l_pid must be 0 for the OFD commands).
_FLOCK = struct.Struct("hhxxxxqqixxxx")


def _flock(kind: int, start: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, start, 1, 0)


#: ``fcntl(fd, F_OFD_SETLK, UNLOCK_MUTEX)`` drops the pure twin's mutex in
#: one C call, with nothing built first that an interrupt could stop.
UNLOCK_MUTEX = _flock(fcntl.F_UNLCK, MUTEX_BYTE)


def ofd_trylock(fd: int, byte: int) -> bool:
    """Take the write lock on ``byte`` through ``fd``'s file description,
    without waiting.  False if another file description holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, byte))
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def ofd_lock(fd: int, byte: int) -> None:
    """Take the write lock on ``byte``, waiting for it (the kernel drops a
    dead holder's lock, so only a live holder makes us wait)."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _flock(fcntl.F_WRLCK, byte))


def ofd_unlock(fd: int, byte: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(fcntl.F_UNLCK, byte))


def ofd_held(fd: int, byte: int) -> bool:
    """Whether another file description than ``fd``'s holds a lock on
    ``byte`` (``fd`` itself must hold none there)."""
    res = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK, byte))
    return bool(_FLOCK.unpack(res)[0] != fcntl.F_UNLCK)


#: How long an open waits for another opener (a live one) before it gives up.
OPEN_LOCK_TIMEOUT_S = 10.0


def lock_open_byte(lockfd: int, path: str) -> None:
    """The open lock, polled with a deadline: a live process stuck inside
    its open (stopped, say) makes ours fail, not hang."""
    deadline = time.monotonic() + OPEN_LOCK_TIMEOUT_S
    delay = 0.0005
    while not ofd_trylock(lockfd, OPEN_BYTE):
        if time.monotonic() > deadline:
            raise shared_error(path, f"another process has held the open lock for more "
                                     f"than {OPEN_LOCK_TIMEOUT_S:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


# ---- opening ----------------------------------------------------------------------


@dataclass
class Opened:
    """A validated, mapped-to-be segment file with the open lock held
    (``lockfd``); the caller registers its process, then calls
    ``release_open``."""

    path: str
    fd: int          # the mapping's file description: never holds a lock
    lockfd: int      # this process's own file description: its slot lock
    layout: Layout
    created: bool    # made or re-initialised by this open

    def release_open(self) -> None:
        ofd_unlock(self.lockfd, OPEN_BYTE)


def reopen_fd(fd: int) -> int:
    """A second, independent file description of the file open on ``fd``
    (even if unlinked): OFD locks belong to file descriptions."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)


def _header_bytes(impl: int, kind: int, maxes: tuple[int, ...], max_queue: int,
                  lay: Layout) -> bytes:
    cfg = list(maxes) + [0] * (2 - len(maxes))
    return HEADER_STRUCT.pack(MAGIC, LAYOUT_VERSION, impl, lay.size, kind, lay.npools,
                              cfg[0], cfg[1], max_queue, lay.max_processes, lay.nrec)


def init_state(fd: int, impl: int, kind: int, maxes: tuple[int, ...], max_queue: int,
               lay: Layout) -> None:
    """Write a fresh segment: header, pools at their limits, every slot free,
    no record used (records beyond the bump mark need no initialising, so
    an untouched record costs no memory on tmpfs)."""
    os.pwrite(fd, bytes(lay.records), 0)   # header, pools and slots zeroed
    os.pwrite(fd, _header_bytes(impl, kind, maxes, max_queue, lay), 0)
    os.pwrite(fd, struct.pack("<II", NIL, 0), H_FREE)
    for i, m in enumerate(maxes):
        base = lay.pool(i)
        avail = m if m > 0 else 0
        if impl == IMPL_C:
            os.pwrite(fd, struct.pack("<qQII", m, c_word(avail, m), NIL, NIL), base)
        else:
            os.pwrite(fd, struct.pack("<qqII", m, avail, NIL, NIL), base)


def _check_file(fd: int, path: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise shared_error(path, "not a regular file")
    if st.st_uid != os.geteuid():
        raise shared_error(path, f"owned by uid {st.st_uid}, not by this process's "
                                 f"uid {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) != 0o600:
        raise shared_error(path, f"mode {stat.S_IMODE(st.st_mode):04o}, not 0600")
    return st


def _read_header(fd: int, path: str, st: os.stat_result, impl: int,
                 kind: int) -> tuple[tuple[int, ...], int, int, Layout]:
    raw = os.pread(fd, HEADER_STRUCT.size, 0)
    if len(raw) < HEADER_STRUCT.size:
        raise shared_error(path, f"wrong size ({st.st_size} bytes): too short for a header")
    (magic, version, f_impl, size, f_kind, npools, m0, m1, q, maxp,
     nrec) = HEADER_STRUCT.unpack(raw)
    if magic != MAGIC:
        raise shared_error(path, "not a pylimiter segment (bad magic)")
    if version != LAYOUT_VERSION:
        raise shared_error(path, f"layout version {version}, this pylimiter reads "
                                 f"{LAYOUT_VERSION}")
    if f_impl != impl:
        made = IMPL_NAMES.get(f_impl, f"an unknown implementation ({f_impl})")
        raise shared_error(path, f"made by {made}; this process uses {IMPL_NAMES[impl]} "
                                 "(the two cannot share a segment)")
    if f_kind not in KIND_NAMES or npools != (1 if f_kind == KIND_SEM else 2):
        raise shared_error(path, "corrupt header (kind)")
    if f_kind != kind:
        raise shared_error(path, f"belongs to {KIND_NAMES[f_kind]}, not to "
                                 f"{KIND_NAMES[kind]}")
    if not 1 <= maxp <= MAX_PROCESSES_LIMIT or not -(1 << 62) < q <= MAX_QUEUE_LIMIT:
        raise shared_error(path, "corrupt header (settings)")
    maxes = (m0, m1)[:npools]
    if any(m > MAX_PERMITS or m < -(1 << 62) for m in maxes):
        raise shared_error(path, "corrupt header (settings)")
    lay = Layout(npools, maxp, nrecords(npools, q, maxp))
    if nrec != lay.nrec:
        raise shared_error(path, "corrupt header (record count)")
    if size != lay.size or st.st_size != lay.size:
        raise shared_error(path, f"wrong size ({st.st_size} bytes; its settings need "
                                 f"{lay.size})")
    return maxes, q, maxp, lay


def _any_live(fd: int, maxp: int) -> bool:
    return any(ofd_held(fd, LOCK_BASE + s) for s in range(maxp))


def _settings_text(maxes: tuple[int, ...], names: tuple[str, ...], q: int, p: int) -> str:
    parts = [f"{n}={m}" for n, m in zip(names, maxes)]
    parts += [f"max_queue_size={q}", f"max_processes={p}"]
    return ", ".join(parts)


def _create(directory: str, name: str, path: str, impl: int, kind: int,
            maxes: tuple[int, ...], max_queue: int, lay: Layout) -> None:
    """Build the segment under a temporary name, then publish it with
    link(): EEXIST means another opener won (its segment is used)."""
    tmp = os.path.join(directory, f".pylimiter-{os.geteuid()}-{name}.{os.getpid()}."
                                  f"{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, 0o600)   # whatever the umask
        os.ftruncate(fd, lay.size)
        init_state(fd, impl, kind, maxes, max_queue, lay)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def open_segment(name: str, directory: object, impl: int, kind: int, maxes: tuple[int, ...],
                 names: tuple[str, ...], max_queue: int, max_processes: int) -> Opened:
    """Open (creating, attaching or re-initialising) the segment of
    ``name``; return it with the open lock held.  SharedLimiterError for a
    file that is not a sound segment of this implementation; ValueError
    when a live segment was created with other settings."""
    d = segment_dir(directory)
    path = segment_path(name, d)
    lay = Layout(len(maxes), max_processes, nrecords(len(maxes), max_queue, max_processes))
    for _attempt in range(50):
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                _create(d, name, path, impl, kind, maxes, max_queue, lay)
            except OSError as exc:
                raise shared_error(path, f"cannot create it ({exc.strerror or exc})",
                                   exc.errno) from None
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise shared_error(path, "is a symbolic link", exc.errno) from None
            raise shared_error(path, f"cannot open it ({exc.strerror or exc})",
                               exc.errno) from None
        lockfd = -1
        keep = False
        try:
            st = _check_file(fd, path)
            lockfd = reopen_fd(fd)
            lock_open_byte(lockfd, path)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
                continue   # unlinked or replaced while we waited: open again
            st = _check_file(fd, path)
            f_maxes, f_q, f_p, f_lay = _read_header(fd, path, st, impl, kind)
            if not _any_live(fd, f_p):
                if (f_maxes, f_q, f_p) == (tuple(maxes), max_queue, max_processes):
                    # Every attached process has died: a fresh state.
                    epoch = struct.unpack("<I", os.pread(fd, 4, H_EPOCH))[0]
                    init_state(fd, impl, kind, maxes, max_queue, lay)
                    os.pwrite(fd, struct.pack("<I", (epoch + 1) & 0xFFFFFFFF), H_EPOCH)
                    keep = True
                    return Opened(path, fd, lockfd, lay, True)
                # Nobody uses it and it has other settings: replace it.
                os.unlink(path)
                continue
            if (f_maxes, f_q, f_p) != (tuple(maxes), max_queue, max_processes):
                raise ValueError(
                    f"pylimiter: {path} was created with "
                    f"{_settings_text(f_maxes, names, f_q, f_p)}; this open asks for "
                    f"{_settings_text(tuple(maxes), names, max_queue, max_processes)}")
            keep = True
            return Opened(path, fd, lockfd, f_lay, False)
        except OSError as exc:
            if isinstance(exc, SharedLimiterError):
                raise
            raise shared_error(path, f"{exc.strerror or exc}", exc.errno) from None
        finally:
            if not keep:
                if lockfd >= 0:
                    os.close(lockfd)   # drops the open lock with the description
                os.close(fd)
    raise shared_error(path, "replaced by other processes too often while opening it")


def unlink_segment(name: object, directory: object = None) -> None:
    """Remove the segment file of ``name`` (attached processes keep working
    on their mapping).  A missing file is not an error."""
    path = segment_path(check_name(name), segment_dir(directory))
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise shared_error(path, f"cannot remove it ({exc.strerror or exc})",
                           exc.errno) from None


# ---- fork ---------------------------------------------------------------------------
# A child forked after its parent opened a segment is a new process: it
# must not keep the parent's slot lock alive (OFD locks belong to the file
# description, which a fork shares), and its first call registers it.

_forkable: "weakref.WeakSet[Any]" = weakref.WeakSet()
# An RLock: the collector may run in add() or discard() and finalise an
# attachment, whose close() untracks it.
_forkable_lock = threading.RLock()


def track_fork(obj: Any) -> None:
    """Call ``obj._after_fork_in_child()`` in a child forked later."""
    with _forkable_lock:
        _forkable.add(obj)


def untrack_fork(obj: Any) -> None:
    with _forkable_lock:
        _forkable.discard(obj)


def _after_fork_in_child() -> None:
    global _forkable_lock
    _forkable_lock = threading.RLock()   # another thread may have held it
    for obj in list(_forkable):
        try:
            obj._after_fork_in_child()
        except Exception:   # pragma: no cover - a child must come up
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---- messages -----------------------------------------------------------------------

MSG_FOREIGN_PROCESS_PERMIT = (
    "pylimiter: the permit belongs to another process (held before fork(), or "
    "before this semaphore was closed and reopened)")
MSG_REQUEST_LOST = ("pylimiter: the request was dropped from the shared queue (the "
                    "segment was found corrupt and repaired)")
MSG_LOCK_STUCK = ("the process holding the segment lock (pid {}) has not released it "
                  "for {} s")


def pool_names(kind: int) -> tuple[str, ...]:
    return ("max_permits",) if kind == KIND_SEM else ("max_heap_memory", "max_direct_memory")


#: Called by SharedDualMemoryLimiter for each pool of its segment.
PoolFactory = Callable[[Any, int], Any]


# ---- the dual limiter, on either twin's pools ------------------------------------

from ._common import (  # noqa: E402
    LimitType,
    check_timeout,
    no_copy_error,
    reinit_error,
    uninitialised_repr,
)
from ._dual import DualMemoryLimiterBase  # noqa: E402

_POOL_TYPES = (LimitType.HEAP_MEMORY, LimitType.DIRECT_MEMORY)


def _reopen(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return cls(*args, **kwargs)


class SharedDualMemoryLimiterBase(DualMemoryLimiterBase[Any]):
    """PIP-442's dual memory limiter shared by every process of the host
    that opens ``name``: the heap and the direct pool are host-wide budgets
    in one segment, each with its own strict FIFO queue.

    ``max_heap_memory`` / ``max_direct_memory`` (bytes; <= 0: that pool is
    unbounded), ``max_queue_size`` (per pool) and ``max_processes`` are the
    creation settings (later opens must pass the same); ``timeout`` is this
    process's default wait.  The API is AsyncDualMemoryLimiter's, plus
    ``close()`` (detach this process), ``holders()`` and ``unlink()``.
    """

    _seg: Any

    def __init__(self, name: str, max_heap_memory: int, max_direct_memory: int,
                 max_queue_size: int = 10000, timeout: Optional[float] = 25.0, *,
                 directory: Any = None, max_processes: int = 256) -> None:
        if getattr(self, "_ready", False):
            raise reinit_error(self)
        name = check_name(name)
        maxes, q, procs = check_settings((max_heap_memory, max_direct_memory),
                                         pool_names(KIND_DUAL), max_queue_size, max_processes)
        t = check_timeout(timeout, None)
        check_platform("SharedDualMemoryLimiter")
        seg, heap, direct = self._open(name, (maxes[0], maxes[1]), q, procs, directory, t)
        self._seg = seg
        self._limiters = {LimitType.HEAP_MEMORY: heap, LimitType.DIRECT_MEMORY: direct}
        self._args = (name, max_heap_memory, max_direct_memory, max_queue_size, timeout)
        self._kwargs = {"directory": directory, "max_processes": max_processes}
        self._ready = True

    def _open(self, name: str, maxes: tuple[int, int], max_queue: int, max_processes: int,
              directory: Any, timeout: Optional[float]) -> tuple[Any, Any, Any]:
        raise NotImplementedError

    def _holders(self) -> dict[int, list[int]]:
        raise NotImplementedError

    unlink = staticmethod(unlink_segment)

    @property
    def name(self) -> str:
        """The segment's name."""
        return str(self._pools[LimitType.HEAP_MEMORY].name)

    @property
    def path(self) -> str:
        """The segment file's path."""
        return str(self._pools[LimitType.HEAP_MEMORY].path)

    @property
    def closed(self) -> bool:
        """True after this process's close()."""
        return bool(self._pools[LimitType.HEAP_MEMORY].closed)

    def close(self) -> None:
        """Detach this process from both pools (idempotent): its queued
        requests fail, what it holds goes back to the host's budgets."""
        self._pools[LimitType.HEAP_MEMORY].close()

    def holders(self) -> dict[int, dict[LimitType, int]]:
        """``{pid: {LimitType.HEAP_MEMORY: n, LimitType.DIRECT_MEMORY: m}}``
        for every live attached process, this one included."""
        self._pools  # noqa: B018 - raises when not initialised
        return {pid: dict(zip(_POOL_TYPES, held)) for pid, held in self._holders().items()}

    def __copy__(self) -> Any:
        raise no_copy_error(self)

    def __deepcopy__(self, memo: object) -> Any:
        raise no_copy_error(self)

    def __reduce__(self) -> Any:
        if not getattr(self, "_ready", False):
            raise no_copy_error(self)
        return (_reopen, (type(self), self._args, self._kwargs))

    def __reduce_ex__(self, protocol: object) -> Any:
        return self.__reduce__()

    def __repr__(self) -> str:
        if not getattr(self, "_ready", False):
            return uninitialised_repr(self)
        h = self._limiters[LimitType.HEAP_MEMORY]
        d = self._limiters[LimitType.DIRECT_MEMORY]
        return (f"<SharedDualMemoryLimiter {self.name!r} "
                f"heap={h.acquired_permits}/{h.max_permits} "
                f"direct={d.acquired_permits}/{d.max_permits}"
                f"{' closed' if self.closed else ''}>")
