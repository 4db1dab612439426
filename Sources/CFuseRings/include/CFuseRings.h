#ifndef PROTECTEDSTORE_CFUSERINGS_H
#define PROTECTEDSTORE_CFUSERINGS_H

#include <stdint.h>

struct fuse_session;

/// FUSE over io_uring (Linux 6.14+) beside libfuse 3.14's /dev/fuse loop (docs/FUSE-IO-URING.md): one queue per
/// possible processor, served by threads pinned to it, so a request is answered on the processor its caller waits on.
typedef struct ps_fuse_rings ps_fuse_rings;

/// How the transport tells the mount what happened: an informational line, or an error (is_error 1).
typedef void (*ps_fuse_rings_report)(void *context, int is_error, const char *message);

/// Routes the session's replies (after fuse_mount, before its loop). With use_rings, INIT's reply asks the kernel
/// for the rings, and about `threads` threads (at least two per possible processor) register once it is written;
/// requests the rings do not carry (and all of them if the kernel declines) stay on /dev/fuse. NULL (errno set) if
/// libfuse refused the hooks or memory ran out, and then the session is unchanged.
ps_fuse_rings *ps_fuse_rings_start(struct fuse_session *session, int use_rings, unsigned threads,
                                   ps_fuse_rings_report report, void *context);

/// Ends the ring threads and frees them: after the session's loop has returned (an unmount ends the rings too) and
/// before fuse_destroy. Reports how many replies went over each transport.
void ps_fuse_rings_stop(ps_fuse_rings *rings);

/// Replies sent over the rings and over /dev/fuse so far.
void ps_fuse_rings_counts(ps_fuse_rings *rings, uint64_t *over_rings, uint64_t *over_device);

#endif
