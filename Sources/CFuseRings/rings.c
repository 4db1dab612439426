// FUSE over io_uring beside libfuse 3.14's /dev/fuse loop. libfuse 3.14 has no such transport, so this file does
// what libfuse 3.18 does, through 3.14's custom I/O hooks (docs/FUSE-IO-URING.md has the protocol, with sources):
// INIT's reply is patched to ask for the rings; each thread registers one ring entry for its processor's queue,
// rebuilds each request it is handed as /dev/fuse would have delivered it, lets libfuse (and the mount's high-level
// operations) answer it, and sends the answer back with the fetch of the next request.
//
// One entry per thread, several threads per queue: a request that blocks (an fsync, a round trip to the key daemon)
// holds up only its own thread, and the kernel hands the next request for that processor to a free entry.
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include "CFuseRings.h"

// The transport's wire structures (FUSE protocol 7.42); this system's <linux/fuse.h> (7.38) lacks them.
struct ring_entry_in_out { uint64_t flags, commit_id; uint32_t payload_size, padding; uint64_t reserved; };
struct ring_header { char in_out[128]; char op_in[128]; struct ring_entry_in_out entry; };
struct ring_command { uint64_t flags, commit_id; uint16_t queue; uint8_t padding[6]; };
struct request_header { uint32_t length, opcode; uint64_t unique, node; uint32_t uid, gid, pid; uint16_t extension_length, padding; };
struct reply_header { uint32_t length; int32_t error; uint64_t unique; };

enum { COMMAND_REGISTER = 1, COMMAND_COMMIT_AND_FETCH = 2, OPCODE_READ = 15, OPCODE_INIT = 26 };
enum { INIT_MAX_PAGES = 1u << 22, INIT_EXTENDED = 1u << 30, INIT2_OVER_IO_URING = 1u << 9 };
// Offsets in INIT's request (after its 40-byte header) and in its reply's fuse_init_out.
enum { INIT_IN_FLAGS2 = 40 + 16, INIT_OUT_FLAGS = 12, INIT_OUT_MAX_WRITE = 20, INIT_OUT_MAX_PAGES = 28, INIT_OUT_FLAGS2 = 32 };
// The request's headers are rebuilt in front of its payload, which the kernel never writes. Entries hold requests of
// up to 1 MiB, the mounts' max_write: a connection that could send larger ones is not asked for the rings.
enum { HEADROOM = 4096, MINIMUM_PAYLOAD = 8192, ENTRY_PAYLOAD = 1 << 20 };
enum { TAG_STOP = 1, TAG_ENTRY = 2 };
enum { FORGET_BATCHING_MICROSECONDS = 1000 };

enum phase { WAITING_FOR_INIT, REGISTERING, STOPPING };

struct ring_thread {
    ps_fuse_rings *rings;
    unsigned queue;
    pthread_t thread;
    int ring_fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    char *sqes;
    struct io_uring_cqe *cqes;
    size_t rings_size, sqes_size;
    char *rings_map;
    unsigned unsubmitted;
    struct ring_header *header;
    char *buffer;                // HEADROOM, then the payload
    size_t buffer_size;
    struct iovec registered[2];
    uint64_t commit_id, replies;
    int replied, last_command;
    size_t reply_in_place;       // bytes of the answer's payload the operation itself wrote into the entry (0: none)
    atomic_size_t stale;         // bytes of a READ's answer still in the payload, plaintext until the next request
};

struct ps_fuse_rings {
    struct fuse_session *session;
    int device_fd, stop_fd;
    unsigned thread_count;
    struct ring_thread *threads;
    pthread_mutex_t lock, reading;
    pthread_cond_t changed;
    enum phase phase;
    _Atomic uint64_t init_unique;
    atomic_int kernel_offers_rings, rings_carry_requests;
    _Atomic uint64_t over_device;
    ps_fuse_rings_report report;
    void *context;
};

// The hooks are handed libfuse's userdata (the high-level API's struct fuse), not ours, so each session's state is
// found by it. A lookup compares keys only and dereferences just its own session's state, which outlives its hooks.
enum { MAXIMUM_SESSIONS = 8 };
static _Atomic(void *) session_keys[MAXIMUM_SESSIONS];
static _Atomic(ps_fuse_rings *) session_states[MAXIMUM_SESSIONS];

// The ring entry whose request this thread is answering; libfuse's high-level operations reply on the same thread.
static _Thread_local struct ring_thread *answering;

static void say(ps_fuse_rings *rings, int is_error, const char *format, ...) {
    char message[512];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(message, sizeof message, format, arguments);
    va_end(arguments);
    rings->report(rings->context, is_error, message);
}

static void report_setup_failure(ps_fuse_rings_report report, void *context, int error) {
    char message[256];
    snprintf(message, sizeof message, "FUSE over io_uring: cannot set up the rings (%s); requests stay on /dev/fuse", strerror(error));
    report(context, 1, message);
}

static ps_fuse_rings *session_of(void *userdata) {
    for (int index = 0; index < MAXIMUM_SESSIONS; index++) {
        if (userdata != NULL && atomic_load(&session_keys[index]) == userdata) return atomic_load(&session_states[index]);
    }
    return NULL;
}

static void enter_phase(ps_fuse_rings *rings, enum phase phase) {
    pthread_mutex_lock(&rings->lock);
    if (rings->phase != STOPPING) rings->phase = phase;
    pthread_cond_broadcast(&rings->changed);
    pthread_mutex_unlock(&rings->lock);
}

static void unlock_mutex(void *mutex) { pthread_mutex_unlock(mutex); }

// Waits for a request on /dev/fuse or for the stop, then reads; -1 with ENODEV at the stop.
static ssize_t read_in_turn(ps_fuse_rings *rings, void *buffer, size_t size) {
    struct pollfd waits[2] = { { .fd = rings->device_fd, .events = POLLIN }, { .fd = rings->stop_fd, .events = POLLIN } };
    while (poll(waits, 2, -1) < 0) {
        if (errno != EINTR) return -1;
    }
    if (waits[1].revents & POLLIN) {
        errno = ENODEV;   // what libfuse's loop takes for "unmounted": it ends quietly
        return -1;
    }
    // Once the rings carry the requests, what comes here is FORGETs (one per inode the kernel drops: a file removed,
    // a cache trimmed), INTERRUPTs, and once any request sent before the rings were ready; nobody waits for a FORGET.
    // Waiting a moment lets the kernel batch the FORGETs into one read instead of waking a thread for each.
    if (atomic_load(&rings->rings_carry_requests)) usleep(FORGET_BATCHING_MICROSECONDS);
    return read(rings->device_fd, buffer, size);
}

// libfuse's /dev/fuse loop reads here, its threads one at a time: the one reading waits for the stop as well as for
// requests (once the rings carry the requests, nothing else would wake it after a lazy unmount of a busy mount, and
// the loop would never end), and the others must not read a FORGET each while it waits for a batch. libfuse ends its
// loop by cancelling its threads, so the turn is given back at a cancellation too.
static ssize_t read_request(int fd, void *buffer, size_t size, void *userdata) {
    ps_fuse_rings *rings = session_of(userdata);
    if (rings == NULL) return read(fd, buffer, size);
    ssize_t count;
    pthread_mutex_lock(&rings->reading);
    pthread_cleanup_push(unlock_mutex, &rings->reading);
    count = read_in_turn(rings, buffer, size);
    pthread_cleanup_pop(1);
    if (count >= INIT_IN_FLAGS2 + 4) {
        const struct request_header *request = buffer;
        if (request->opcode == OPCODE_INIT) {
            uint32_t flags2;
            memcpy(&flags2, (const char *)buffer + INIT_IN_FLAGS2, sizeof flags2);
            atomic_store(&rings->kernel_offers_rings, (flags2 & INIT2_OVER_IO_URING) != 0);
            atomic_store(&rings->init_unique, request->unique);
        }
    }
    return count;
}

static void answer_with_error(struct ring_thread *self, int error) {
    struct reply_header failed = { sizeof failed, -error, self->commit_id };
    memcpy(self->header->in_out, &failed, sizeof failed);
    self->header->entry.payload_size = 0;
}

static uint32_t load32(const char *at) { uint32_t value; memcpy(&value, at, sizeof value); return value; }
static void store32(char *at, uint32_t value) { memcpy(at, &value, sizeof value); }

void *ps_fuse_rings_reply_space(size_t size) {
    struct ring_thread *entry = answering;
    if (entry == NULL || size == 0 || size > ENTRY_PAYLOAD) return NULL;
    entry->reply_in_place = size;
    return entry->buffer + HEADROOM;
}

// Every reply libfuse builds comes here. One to a request taken from a ring goes into that ring's entry and leaves
// with the next fetch; the rest (INIT, requests read from /dev/fuse, notifications) are written to /dev/fuse.
static ssize_t write_reply(int fd, struct iovec *parts, int count, void *userdata) {
    const struct reply_header *reply = parts[0].iov_base;
    struct ring_thread *entry = answering;
    if (entry != NULL && reply->unique == entry->commit_id) {
        size_t in_place = entry->reply_in_place;
        entry->reply_in_place = 0;
        size_t size = 0;
        for (int index = 1; index < count; index++) {
            if (size + parts[index].iov_len > (in_place ? in_place : ENTRY_PAYLOAD)) {
                // Cannot happen while requests are capped at the entry's size, and a reply written in place at what
                // its operation was given; if it did, a short READ would pass for the end of the file, so the caller
                // gets EIO.
                answer_with_error(entry, EIO);
                entry->replied = 1;
                errno = E2BIG;
                return -1;
            }
            if (!in_place) memcpy(entry->buffer + HEADROOM + size, parts[index].iov_base, parts[index].iov_len);
            size += parts[index].iov_len;
        }
        memcpy(entry->header->in_out, reply, sizeof *reply);
        entry->header->entry.payload_size = (uint32_t)size;
        entry->replied = 1;
        entry->replies++;
        return (ssize_t)(sizeof *reply + size);
    }
    ps_fuse_rings *rings = session_of(userdata);
    int is_init = rings != NULL && reply->unique != 0 && reply->unique == atomic_load(&rings->init_unique);
    int asks_for_rings = 0;
    if (is_init && reply->error == 0 && count >= 2 && parts[1].iov_len >= INIT_OUT_FLAGS2 + 4) {
        char *init = parts[1].iov_base;
        uint32_t flags = load32(init + INIT_OUT_FLAGS);
        // The kernel wants room in every entry for its largest request: max(8 KiB, max_write, max_pages pages).
        uint32_t max_write = load32(init + INIT_OUT_MAX_WRITE);
        uint16_t max_pages = 32;
        if (flags & INIT_MAX_PAGES) memcpy(&max_pages, init + INIT_OUT_MAX_PAGES, sizeof max_pages);
        size_t payload = MINIMUM_PAYLOAD;
        if (max_write > payload) payload = max_write;
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        if ((size_t)max_pages * page > payload) payload = (size_t)max_pages * page;
        if (!atomic_load(&rings->kernel_offers_rings)) {
            say(rings, 0, "the kernel did not offer FUSE over io_uring for this mount; requests go over /dev/fuse");
        } else if (payload > ENTRY_PAYLOAD) {
            say(rings, 0, "requests of up to %zu bytes do not fit FUSE over io_uring's entries (%d); requests go over /dev/fuse",
                payload, ENTRY_PAYLOAD);
        } else {
            store32(init + INIT_OUT_FLAGS, flags | INIT_EXTENDED);
            store32(init + INIT_OUT_FLAGS2, load32(init + INIT_OUT_FLAGS2) | INIT2_OVER_IO_URING);
            asks_for_rings = 1;
        }
    }
    ssize_t written = writev(rings != NULL ? rings->device_fd : fd, parts, count);
    int error = errno;
    if (rings != NULL && reply->unique != 0) atomic_fetch_add_explicit(&rings->over_device, 1, memory_order_relaxed);
    // Entries can be registered only once the kernel has taken INIT's reply, which it does inside this writev.
    if (is_init) enter_phase(rings, asks_for_rings && written >= 0 ? REGISTERING : STOPPING);
    errno = error;
    return written;
}

static void queue_command(struct ring_thread *self, int command, uint64_t tag) {
    unsigned tail = *self->sq_tail, slot = tail & *self->sq_mask;
    struct io_uring_sqe *sqe = (void *)(self->sqes + ((size_t)slot << 7));   // 128-byte entries (SQE128)
    memset(sqe, 0, 128);
    sqe->user_data = tag;
    if (tag == TAG_STOP) {
        sqe->opcode = IORING_OP_POLL_ADD;
        sqe->fd = self->rings->stop_fd;
        sqe->poll32_events = POLLIN;
    } else {
        sqe->opcode = IORING_OP_URING_CMD;
        sqe->fd = self->rings->device_fd;
        sqe->cmd_op = (uint32_t)command;
        if (command == COMMAND_REGISTER) {
            sqe->addr = (uint64_t)(uintptr_t)self->registered;
            sqe->len = 2;
        }
        struct ring_command *arguments = (void *)sqe->cmd;
        arguments->queue = (uint16_t)self->queue;
        arguments->commit_id = command == COMMAND_COMMIT_AND_FETCH ? self->commit_id : 0;
        self->last_command = command;
    }
    self->sq_array[slot] = slot;
    atomic_store_explicit((_Atomic unsigned *)self->sq_tail, tail + 1, memory_order_release);
    self->unsubmitted++;
}

// Rebuilds the request as /dev/fuse would have delivered it (its header, the operation's own header, the rest) in
// the headroom in front of the payload, and has libfuse answer it.
static void serve(struct ring_thread *self) {
    const struct request_header *request = (const void *)self->header->in_out;
    uint32_t payload_size = self->header->entry.payload_size;
    uint32_t opcode = request->opcode;
    self->commit_id = self->header->entry.commit_id;
    if (request->length < sizeof *request + payload_size || payload_size > ENTRY_PAYLOAD
        || request->length - sizeof *request - payload_size > sizeof self->header->op_in) {
        say(self->rings, 1, "FUSE over io_uring: queue %u got a request whose sizes do not add up (length %u, payload %u); answered EIO",
            self->queue, request->length, payload_size);
        answer_with_error(self, EIO);
        return;
    }
    size_t operation_header_size = request->length - sizeof *request - payload_size;
    // The entry is ours until it is handed back: what the last READ's answer left beyond this request goes now.
    size_t stale = atomic_exchange(&self->stale, 0);
    if (stale > payload_size) explicit_bzero(self->buffer + HEADROOM + payload_size, stale - payload_size);
    char *rebuilt = self->buffer + HEADROOM - sizeof *request - operation_header_size;
    memcpy(rebuilt, request, sizeof *request);
    memcpy(rebuilt + sizeof *request, self->header->op_in, operation_header_size);
    struct fuse_buf buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.size = request->length;
    buffer.mem = rebuilt;
    self->replied = 0;
    self->reply_in_place = 0;
    answering = self;
    fuse_session_process_buf(self->rings->session, &buffer);
    answering = NULL;
    // Only a request that wants no answer (FUSE_NOTIFY_REPLY) gets none; the entry is still handed back.
    if (!self->replied) answer_with_error(self, 0);
    // The answer overwrote the request's header: its opcode was kept.
    if (opcode == OPCODE_READ) atomic_store(&self->stale, self->header->entry.payload_size);
    // A load first: an exchange on every request would bounce the flag's cache line between the processors.
    if (!atomic_load_explicit(&self->rings->rings_carry_requests, memory_order_relaxed)
        && !atomic_exchange(&self->rings->rings_carry_requests, 1))
        say(self->rings, 0, "requests come over io_uring now");
}

// The ring and the entry's buffers exist before INIT is answered: once it asks for the rings, every queue must get
// its entries, or the kernel holds requests back until unmount.
static int set_up_ring(struct ring_thread *self) {
    self->header = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    // Untouched pages cost nothing: the payload fills only as far as the largest request this entry gets.
    self->buffer_size = HEADROOM + ENTRY_PAYLOAD;
    self->buffer = mmap(NULL, self->buffer_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if ((void *)self->header == MAP_FAILED || self->buffer == MAP_FAILED) return -errno;
    self->registered[0] = (struct iovec){ self->header, sizeof *self->header };
    self->registered[1] = (struct iovec){ self->buffer + HEADROOM, ENTRY_PAYLOAD };
    struct io_uring_params parameters;
    memset(&parameters, 0, sizeof parameters);
    parameters.flags = IORING_SETUP_SQE128;
    self->ring_fd = (int)syscall(__NR_io_uring_setup, 4, &parameters);
    if (self->ring_fd < 0) return -errno;
    size_t sq_size = parameters.sq_off.array + parameters.sq_entries * sizeof(unsigned);
    size_t cq_size = parameters.cq_off.cqes + parameters.cq_entries * sizeof(struct io_uring_cqe);
    self->rings_size = sq_size > cq_size ? sq_size : cq_size;
    self->sqes_size = parameters.sq_entries * 128;
    self->rings_map = mmap(NULL, self->rings_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, self->ring_fd,
                           IORING_OFF_SQ_RING);
    self->sqes = mmap(NULL, self->sqes_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, self->ring_fd, IORING_OFF_SQES);
    if (self->rings_map == MAP_FAILED || self->sqes == MAP_FAILED) return -errno;
    char *map = self->rings_map;
    self->sq_tail = (void *)(map + parameters.sq_off.tail);
    self->sq_mask = (void *)(map + parameters.sq_off.ring_mask);
    self->sq_array = (void *)(map + parameters.sq_off.array);
    self->cq_head = (void *)(map + parameters.cq_off.head);
    self->cq_tail = (void *)(map + parameters.cq_off.tail);
    self->cq_mask = (void *)(map + parameters.cq_off.ring_mask);
    self->cqes = (void *)(map + parameters.cq_off.cqes);
    return 0;
}

static void tear_down(struct ring_thread *self) {
    // Closing the ring cancels its parked fetch; the kernel then holds nothing of this thread's.
    if (self->ring_fd >= 0) close(self->ring_fd);
    if (self->rings_map != NULL && self->rings_map != MAP_FAILED) munmap(self->rings_map, self->rings_size);
    if (self->sqes != NULL && self->sqes != MAP_FAILED) munmap(self->sqes, self->sqes_size);
    if (self->buffer != NULL && self->buffer != MAP_FAILED) munmap(self->buffer, self->buffer_size);
    if (self->header != NULL && (void *)self->header != MAP_FAILED) munmap(self->header, 4096);
    self->ring_fd = -1;
}

static int serve_until_the_end(struct ring_thread *self) {
    queue_command(self, 0, TAG_STOP);
    queue_command(self, COMMAND_REGISTER, TAG_ENTRY);
    for (;;) {
        int result = (int)syscall(__NR_io_uring_enter, self->ring_fd, self->unsubmitted, 1, IORING_ENTER_GETEVENTS, NULL, 0);
        if (result < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        self->unsubmitted -= (unsigned)result;
        unsigned head = *self->cq_head;
        unsigned tail = atomic_load_explicit((_Atomic unsigned *)self->cq_tail, memory_order_acquire);
        int outcome = 1;
        for (; head != tail; head++) {
            struct io_uring_cqe *completion = &self->cqes[head & *self->cq_mask];
            if (completion->user_data == TAG_STOP) {
                outcome = 0;
            } else if (completion->res == -EAGAIN || completion->res == -EINTR) {
                if (completion->res == -EAGAIN) usleep(1000);   // not expected once INIT is answered: no busy loop
                queue_command(self, self->last_command, TAG_ENTRY);
            } else if (completion->res == -ENOTCONN || completion->res == -ECONNABORTED || completion->res == -ECANCELED) {
                outcome = 0;   // unmounted
            } else if (completion->res < 0) {
                outcome = completion->res;
            } else {
                serve(self);
                queue_command(self, COMMAND_COMMIT_AND_FETCH, TAG_ENTRY);
            }
        }
        atomic_store_explicit((_Atomic unsigned *)self->cq_head, head, memory_order_release);
        if (outcome <= 0) {
            // An answer given in the same batch as the stop still goes out.
            if (self->unsubmitted > 0) (void)syscall(__NR_io_uring_enter, self->ring_fd, self->unsubmitted, 0, 0, NULL, 0);
            return outcome;
        }
    }
}

static void *run_thread(void *argument) {
    struct ring_thread *self = argument;
    ps_fuse_rings *rings = self->rings;
    char name[16];
    snprintf(name, sizeof name, "fuse-ring-%u", self->queue);
    pthread_setname_np(pthread_self(), name);
    cpu_set_t processors;
    CPU_ZERO(&processors);
    CPU_SET(self->queue, &processors);
    // Where the processor is not ours to run on, the thread still serves its queue, only from elsewhere.
    (void)sched_setaffinity(0, sizeof processors, &processors);
    pthread_mutex_lock(&rings->lock);
    while (rings->phase == WAITING_FOR_INIT) pthread_cond_wait(&rings->changed, &rings->lock);
    enum phase phase = rings->phase;
    pthread_mutex_unlock(&rings->lock);
    if (phase == REGISTERING) {
        int result = serve_until_the_end(self);
        if (result < 0)
            say(rings, 1, "FUSE over io_uring: a thread of queue %u stopped (%s)%s", self->queue, strerror(-result),
                result == -EOPNOTSUPP ? "; /sys/module/fuse/parameters/enable_uring was turned off before the mount registered; requests stay on /dev/fuse"
                                      : "; a request it had taken may wait until unmount: unmount and mount again, with --no-io-uring if it recurs");
    }
    tear_down(self);
    return NULL;
}

// Calls `each` for every processor in a sysfs list ("0-1" here, "0-3,5-7" elsewhere); false if it cannot be read.
static int each_listed_processor(const char *path, void (*each)(unsigned processor, void *context), void *context) {
    FILE *file = fopen(path, "r");
    if (file == NULL) return 0;
    unsigned low, high;
    char separator = 0;
    while (fscanf(file, "%u", &low) == 1) {
        high = low;
        if (fscanf(file, "%c", &separator) == 1 && separator == '-' && fscanf(file, "%u%c", &high, &separator) < 1) break;
        for (unsigned processor = low; processor <= high && processor < 65536; processor++) each(processor, context);
        if (separator != ',') break;
    }
    fclose(file);
    return 1;
}

static void count_processor(unsigned processor, void *context) { (void)processor; (*(unsigned *)context)++; }

struct processor_set { unsigned count; unsigned char *online; };

static void mark_online(unsigned processor, void *context) {
    struct processor_set *set = context;
    if (processor < set->count) set->online[processor] = 1;
}

ps_fuse_rings *ps_fuse_rings_start(struct fuse_session *session, void *userdata, unsigned threads,
                                   ps_fuse_rings_report report, void *context) {
    // The kernel makes one queue per possible processor (num_possible_cpus()), numbered like them.
    unsigned queues = 0;
    each_listed_processor("/sys/devices/system/cpu/possible", count_processor, &queues);
    if (queues == 0) {
        long configured = sysconf(_SC_NPROCESSORS_CONF);
        queues = configured > 0 ? (unsigned)configured : 1;
    }
    struct processor_set processors = { queues, calloc(queues, 1) };
    int device_fd = fcntl(fuse_session_fd(session), F_DUPFD_CLOEXEC, 0);
    int stop_fd = eventfd(0, EFD_CLOEXEC);
    ps_fuse_rings *rings = calloc(1, sizeof *rings);
    int slot = -1;
    for (int index = 0; rings != NULL && index < MAXIMUM_SESSIONS && slot < 0; index++) {
        ps_fuse_rings *empty = NULL;
        if (atomic_compare_exchange_strong(&session_states[index], &empty, rings)) slot = index;
    }
    if (processors.online == NULL || device_fd < 0 || stop_fd < 0 || rings == NULL || slot < 0) {
        int error = slot < 0 && rings != NULL ? EMFILE : errno;
        report_setup_failure(report, context, error);
        if (slot >= 0) atomic_store(&session_states[slot], NULL);
        if (device_fd >= 0) close(device_fd);
        if (stop_fd >= 0) close(stop_fd);
        free(processors.online);
        free(rings);
        errno = error;
        return NULL;
    }
    // The descriptor is the rings' own: libfuse closes its one at unmount, while a ring thread may still answer.
    rings->device_fd = device_fd;
    rings->stop_fd = stop_fd;
    rings->session = session;
    rings->report = report;
    rings->context = context;
    pthread_mutex_init(&rings->lock, NULL);
    pthread_mutex_init(&rings->reading, NULL);
    pthread_cond_init(&rings->changed, NULL);
    atomic_store(&session_keys[slot], userdata);
    // Every queue must get an entry once INIT asks for the rings, or the kernel holds requests back until unmount: so
    // the threads all exist (with their rings and buffers) before INIT is answered, or the rings are not asked for.
    // Processors that are offline get one thread; the online ones share `threads`, at least two each, so that one
    // request that blocks does not hold up its processor's queue.
    unsigned online = 0;
    if (!each_listed_processor("/sys/devices/system/cpu/online", mark_online, &processors)) memset(processors.online, 1, queues);
    for (unsigned queue = 0; queue < queues; queue++) online += processors.online[queue];
    unsigned per_online_queue = online > 0 ? (threads + online - 1) / online : 1;
    if (per_online_queue < 2) per_online_queue = 2;
    unsigned total = queues + online * (per_online_queue - 1);
    rings->threads = calloc(total, sizeof *rings->threads);
    int complete = rings->threads != NULL;
    for (unsigned queue = 0, index = 0; complete && queue < queues; queue++) {
        for (unsigned copy = 0; complete && copy < (processors.online[queue] ? per_online_queue : 1); copy++, index++) {
            struct ring_thread *thread = &rings->threads[index];
            thread->rings = rings;
            thread->queue = queue;
            thread->ring_fd = -1;
            int setup = set_up_ring(thread);
            if (setup < 0) {
                say(rings, 1, "FUSE over io_uring: cannot set up a ring (%s); requests stay on /dev/fuse", strerror(-setup));
                tear_down(thread);
                complete = 0;
            } else if (pthread_create(&thread->thread, NULL, run_thread, thread) != 0) {
                say(rings, 1, "FUSE over io_uring: cannot start a thread; requests stay on /dev/fuse");
                tear_down(thread);
                complete = 0;
            } else {
                rings->thread_count = index + 1;
            }
        }
    }
    free(processors.online);
    struct fuse_custom_io hooks;
    memset(&hooks, 0, sizeof hooks);
    hooks.read = read_request;
    hooks.writev = write_reply;
    if (!complete || fuse_session_custom_io(session, &hooks, fuse_session_fd(session)) != 0) {
        // Without the hooks INIT is not patched: the session stays as libfuse made it, on /dev/fuse.
        if (complete) say(rings, 1, "FUSE over io_uring: libfuse refused the reply hooks; requests stay on /dev/fuse");
        ps_fuse_rings_stop(rings);
        return NULL;
    }
    say(rings, 0, "FUSE over io_uring is on: %u queues, %u threads, each on its queue's processor", queues, rings->thread_count);
    return rings;
}

void ps_fuse_rings_end(ps_fuse_rings *rings) {
    enter_phase(rings, STOPPING);
    uint64_t one = 1;
    (void)!write(rings->stop_fd, &one, sizeof one);
}

void ps_fuse_rings_stop(ps_fuse_rings *rings) {
    ps_fuse_rings_end(rings);
    uint64_t over_rings = 0;
    for (unsigned index = 0; index < rings->thread_count; index++) {
        pthread_join(rings->threads[index].thread, NULL);
        over_rings += rings->threads[index].replies;
    }
    if (atomic_load(&rings->rings_carry_requests))
        say(rings, 0, "replies: %llu over io_uring, %llu over /dev/fuse", (unsigned long long)over_rings,
            (unsigned long long)atomic_load(&rings->over_device));
    for (int index = 0; index < MAXIMUM_SESSIONS; index++) {
        if (atomic_load(&session_states[index]) == rings) {
            atomic_store(&session_keys[index], NULL);
            atomic_store(&session_states[index], NULL);
        }
    }
    close(rings->device_fd);
    close(rings->stop_fd);
    pthread_mutex_destroy(&rings->lock);
    pthread_mutex_destroy(&rings->reading);
    pthread_cond_destroy(&rings->changed);
    free(rings->threads);
    free(rings);
}

// One request from a given processor, which the kernel puts on that processor's queue: any entry it reaches zeroes
// what a READ's answer left in it.
struct scrub_request { const char *path; unsigned processor; };

static void *request_from_processor(void *argument) {
    struct scrub_request *request = argument;
    cpu_set_t processors;
    CPU_ZERO(&processors);
    CPU_SET(request->processor, &processors);
    struct statvfs info;
    if (sched_setaffinity(0, sizeof processors, &processors) == 0) (void)statvfs(request->path, &info);
    return NULL;
}

int ps_fuse_rings_scrub(void *userdata, const char *path) {
    ps_fuse_rings *rings = session_of(userdata);
    if (rings == NULL) return 0;
    for (int round = 0; round < 16; round++) {
        unsigned holding = 0;
        for (unsigned index = 0; index < rings->thread_count; index++) holding += atomic_load(&rings->threads[index].stale) > 0;
        if (holding == 0) return 0;
        // As many requests from each processor at once as it has entries, so each entry is likely to take one.
        pthread_t *workers = calloc(rings->thread_count, sizeof *workers);
        struct scrub_request *requests = calloc(rings->thread_count, sizeof *requests);
        if (workers == NULL || requests == NULL) {
            free(workers);
            free(requests);
            return (int)holding;
        }
        unsigned started = 0;
        for (unsigned index = 0; index < rings->thread_count; index++) {
            requests[started] = (struct scrub_request){ path, rings->threads[index].queue };
            if (pthread_create(&workers[started], NULL, request_from_processor, &requests[started]) == 0) started++;
        }
        for (unsigned index = 0; index < started; index++) pthread_join(workers[index], NULL);
        free(workers);
        free(requests);
    }
    unsigned holding = 0;
    for (unsigned index = 0; index < rings->thread_count; index++) holding += atomic_load(&rings->threads[index].stale) > 0;
    return (int)holding;
}
