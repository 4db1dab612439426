#ifndef PROTECTEDSTORE_CFUSERINGS_H
#define PROTECTEDSTORE_CFUSERINGS_H

#include <stddef.h>
#include <stdint.h>

struct fuse_session;

/// FUSE over io_uring (Linux 6.14+) beside libfuse 3.14's /dev/fuse loop (docs/FUSE-IO-URING.md): one queue per
/// possible processor, served by threads pinned to it, so a request is answered on the processor its caller waits on.
typedef struct ps_fuse_rings ps_fuse_rings;

/// How the transport tells the mount what happened: an informational line, or an error (is_error 1).
typedef void (*ps_fuse_rings_report)(void *context, int is_error, const char *message);

/// Asks for the rings (after fuse_mount, before the session's loop): starts about `threads` threads, at least two per
/// online processor and one per other possible one, and routes the session's replies through libfuse's custom I/O
/// hooks, so that INIT's reply asks for the rings and the threads register once it is written. `userdata` is what
/// libfuse hands the hooks: the struct fuse of the high-level API. Requests the rings do not carry (and all of them
/// if the kernel declines) stay on /dev/fuse. NULL, after reporting why, if the rings cannot be set up; then the
/// session is unchanged.
ps_fuse_rings *ps_fuse_rings_start(struct fuse_session *session, void *userdata, unsigned threads,
                                   ps_fuse_rings_report report, void *context);

/// Where the operation answering a request taken from a ring can write up to `size` bytes of its reply's payload, so
/// that they need not be copied into the entry: the next reply of this thread is then taken to be there already
/// (libfuse still hands the hook its own buffer, unwritten; the hook uses only its length, and answers EIO if that
/// exceeds `size`). NULL on other threads, or if `size` is 0 or does not fit.
void *ps_fuse_rings_reply_space(size_t size);

/// At a lock: has every ring entry that still holds a READ's answer (plaintext) take a request, which zeroes it,
/// by asking for `path`'s statvfs from each entry's processor, in up to 16 rounds. `userdata` is libfuse's (the
/// high-level API's struct fuse). Returns how many entries still hold one (0; and 0 without rings).
int ps_fuse_rings_scrub(void *userdata, const char *path);

/// After the mount's own unmount (fuse_session_exit, then fuse_unmount): ends the ring threads and wakes libfuse's
/// loop, which then returns even if the unmount was lazy and files are still open (their requests fail once the mount
/// has ended).
void ps_fuse_rings_end(ps_fuse_rings *rings);

/// Ends the ring threads and frees them: after the session's loop has returned (an unmount ends the rings too) and
/// before fuse_destroy. Reports how many replies went over each transport, if any went over the rings.
void ps_fuse_rings_stop(ps_fuse_rings *rings);

#endif
