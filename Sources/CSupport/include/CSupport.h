#ifndef PROTECTEDSTORE_CSUPPORT_H
#define PROTECTEDSTORE_CSUPPORT_H

// getxattr and friends, which Swift's Glibc module does not include.
#include <sys/xattr.h>

/// renameat2(RENAME_NOREPLACE): glibc declares it only under _GNU_SOURCE, which Swift's Glibc module does not set.
/// Returns 0, or -1 with errno set (EEXIST when the target exists).
int ps_rename_noreplace(int old_directory, const char *old_name, int new_directory, const char *new_name);

/// fallocate(FALLOC_FL_KEEP_SIZE): reserves disk space for `length` bytes at `offset` without changing the file's size
/// (fallocate is declared only under _GNU_SOURCE). Returns 0, or -1 with errno set (ENOSPC, EOPNOTSUPP, ...).
int ps_reserve_space(int fd, long long offset, long long length);

/// lseek(SEEK_DATA) and lseek(SEEK_HOLE): the next data or hole offset at or after `offset`, or -1 with errno
/// (ENXIO: none before the end of the file).
long long ps_seek_data(int fd, long long offset);
long long ps_seek_hole(int fd, long long offset);

/// fallocate with any mode (tests drive the mount with it). Returns 0, or -1 with errno set.
int ps_fallocate(int fd, int mode, long long offset, long long length);

/// renameat2(RENAME_EXCHANGE): swaps the two names atomically. Returns 0, or -1 with errno set.
int ps_rename_exchange(int old_directory, const char *old_name, int new_directory, const char *new_name);

/// access(2) of an open file by this process's effective user and groups (faccessat with AT_EMPTY_PATH, declared
/// only under _GNU_SOURCE). Returns 0, or -1 with errno set (EACCES when `mode` is not allowed).
int ps_access_open_file(int fd, int mode);

/// The statfs magic number of the file system holding `fd` (sys/vfs.h, which Swift's Glibc module does not include),
/// or -1 with errno set.
long long ps_file_system_type(int fd);

/// A non-blocking, close-on-exec Unix stream socket bound to `path` and listening; -1 with errno set
/// (ENAMETOOLONG when the path does not fit a sockaddr_un).
int ps_unix_listen(const char *path, int backlog);

/// A blocking, close-on-exec Unix stream socket connected to `path`, waiting at most 5 s for room in the listener's
/// queue (then -1 with EAGAIN); -1 with errno set.
int ps_unix_connect(const char *path);

/// Takes over a listening socket inherited from systemd (socket activation): checks that `fd` is a listening Unix
/// stream socket bound to a path, copies that path into `path` (`capacity` bytes), and makes it non-blocking and
/// close-on-exec. Returns 0, or -1 with errno set (EINVAL: not a listening Unix stream socket bound to a path).
int ps_adopt_listening_unix_socket(int fd, char *path, int capacity);

/// The peer's pid and uid (SO_PEERCRED, whose struct ucred glibc declares only under _GNU_SOURCE); -1 with errno set.
int ps_peer_credentials(int fd, int *pid, unsigned int *uid);

/// accept4 with SOCK_CLOEXEC | SOCK_NONBLOCK; -1 with errno set (EAGAIN when no connection waits).
int ps_accept(int listener);

/// pipe2 with O_CLOEXEC | O_NONBLOCK; -1 with errno set.
int ps_pipe(int ends[2]);

/// No core file, and no ptrace attach or /proc/PID/mem read by other processes of the same user: RLIMIT_CORE 0 and
/// prctl(PR_SET_DUMPABLE, 0). Returns 0, or -1 with errno set.
int ps_disable_core_dumps(void);

/// Freed heap blocks are overwritten as they are freed (glibc's mallopt M_PERTURB): plaintext a process of ours held
/// is not left behind in the heap's free lists. Returns 1 on success, 0 if glibc refused.
int ps_overwrite_freed_memory(void);

/// Returns the free pages of every heap arena to the kernel (glibc's malloc_trim), which zeroes them: what the free
/// lists still held of earlier plaintext goes with them.
void ps_release_freed_memory(void);

/// Zeroes `size` bytes of this thread's stack below the caller's frame, where the calls it has made left their
/// locals (libsodium leaves a cipher's last partial block there).
#include <stddef.h>
void ps_scrub_stack_below(size_t size);

/// prctl(PR_GET_DUMPABLE): 1 if this process may be dumped or traced, 0 if not, -1 with errno set.
int ps_is_dumpable(void);

/// posix_spawn_file_actions_addclosefrom_np (glibc 2.34, declared only under _GNU_SOURCE): the child closes every
/// descriptor from `from` up. Returns 0 or an error number.
#include <spawn.h>
int ps_spawn_close_from(posix_spawn_file_actions_t *actions, int from);

/// A timerfd on CLOCK_REALTIME (non-blocking) for the daemon's significant-time-change watch; -1 with errno set.
int ps_realtime_alarm(void);
/// Arms it to expire at `seconds` since the epoch, cancelled when the clock is set (TFD_TIMER_CANCEL_ON_SET).
/// Returns 0, or -1 with errno set.
int ps_realtime_alarm_set(int fd, long long seconds);
/// Reads it: 1 if it expired, 2 if the clock was set (ECANCELED), 0 if nothing is there yet or on another error.
int ps_realtime_alarm_read(int fd);

#endif
