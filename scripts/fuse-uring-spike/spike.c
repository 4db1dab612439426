// Measurement spike for docs/FUSE-IO-URING.md, not part of the product: a file system of one folder and one empty
// file "f", served either over /dev/fuse (libfuse 3.14's own loop) or over FUSE's io_uring transport (Linux 6.14+),
// with libfuse 3.14 parsing the requests and building the replies through its custom I/O hooks. Entry and attribute
// timeouts are zero, so every stat(2) of MOUNTPOINT/f is a LOOKUP and a GETATTR.
//
//   spike MOUNTPOINT devfuse|uring      (root; for uring, /sys/module/fuse/parameters/enable_uring must be Y)
//   SPIKE_PIN=1: each ring's thread is pinned to its processor, so a request is answered where its caller runs.
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

// The io_uring transport's wire structures (protocol 7.42); this system's <linux/fuse.h> (7.38) lacks them.
struct ring_entry_in_out { uint64_t flags, commit_id; uint32_t payload_size, padding; uint64_t reserved; };
struct ring_header { char in_out[128]; char op_in[128]; struct ring_entry_in_out entry; };
struct ring_command { uint64_t flags, commit_id; uint16_t queue; uint8_t padding[6]; };
struct request_header { uint32_t length, opcode; uint64_t unique, node; uint32_t uid, gid, pid; uint16_t extension_length, padding; };
struct reply_header { uint32_t length; int32_t error; uint64_t unique; };
enum { COMMAND_REGISTER = 1, COMMAND_COMMIT_AND_FETCH = 2, OPCODE_LOOKUP = 1, OPCODE_GETATTR = 3, OPCODE_INIT = 26 };
enum { INIT_EXTENDED = 1u << 30, INIT2_OVER_IO_URING = 1u << 9 };

enum { ENTRIES_PER_QUEUE = 4, PAYLOAD_BYTES = 1 << 20, HEADROOM = 4096 };

struct ring_entry {
    struct ring_header *header;
    char *payload;               // HEADROOM bytes in front of it hold the request's headers for libfuse
    struct iovec buffers[2];
    uint64_t commit_id;
    int replied;
};

struct queue {
    int processor, ring_fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    char *sqes;
    struct io_uring_cqe *cqes;
    unsigned unsubmitted;
    struct ring_entry entries[ENTRIES_PER_QUEUE];
    pthread_t thread;
};

static struct fuse_session *session;
static int device_fd, over_uring;
static uint64_t init_unique = UINT64_MAX;
static atomic_int init_answered;
static __thread struct ring_entry *answering;

static ssize_t read_request(int fd, void *buffer, size_t size, void *unused) {
    (void)unused;
    ssize_t count = read(fd, buffer, size);
    if (count < (ssize_t)sizeof(struct request_header)) return count;
    struct request_header *request = buffer;
    if (request->opcode == OPCODE_INIT) init_unique = request->unique;
    // With the rings in use none of these should come here; run.sh fails the row if one does.
    if (over_uring && (request->opcode == OPCODE_LOOKUP || request->opcode == OPCODE_GETATTR))
        fprintf(stderr, "served over /dev/fuse: opcode %u\n", request->opcode);
    return count;
}

// Every reply libfuse builds comes here: one for a request taken from a ring goes into that ring entry, the rest
// (INIT, notifications) to /dev/fuse. INIT's reply is where the transport is asked for (libfuse 3.14 can't).
static ssize_t write_reply(int fd, struct iovec *parts, int count, void *unused) {
    (void)unused;
    struct reply_header *reply = parts[0].iov_base;
    if (answering && reply->unique == answering->commit_id) {
        size_t size = 0;
        for (int index = 1; index < count; index++) {
            if (size + parts[index].iov_len > PAYLOAD_BYTES) {
                errno = E2BIG;
                return -1;
            }
            memcpy(answering->payload + size, parts[index].iov_base, parts[index].iov_len);
            size += parts[index].iov_len;
        }
        memcpy(answering->header->in_out, reply, sizeof *reply);
        answering->header->entry.payload_size = (uint32_t)size;
        answering->replied = 1;
        return (ssize_t)(sizeof *reply + size);
    }
    int is_init = reply->unique == init_unique;
    if (is_init && over_uring && reply->error == 0 && count >= 2 && parts[1].iov_len >= 36) {
        char *init = parts[1].iov_base;
        *(uint32_t *)(init + 12) |= INIT_EXTENDED;
        *(uint32_t *)(init + 32) |= INIT2_OVER_IO_URING;
    }
    ssize_t written = writev(fd, parts, count);
    if (is_init) atomic_store(&init_answered, 1);
    return written;
}

static void initialize(void *unused, struct fuse_conn_info *connection) {
    (void)unused;
    // A spliced reply would bypass write_reply.
    connection->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
    connection->max_write = 128 * 1024;
}

static void describe(struct stat *info, fuse_ino_t node) {
    memset(info, 0, sizeof *info);
    info->st_ino = node;
    info->st_mode = node == FUSE_ROOT_ID ? S_IFDIR | 0755 : S_IFREG | 0644;
    info->st_nlink = node == FUSE_ROOT_ID ? 2 : 1;
}

static void look_up(fuse_req_t request, fuse_ino_t parent, const char *name) {
    if (parent != FUSE_ROOT_ID || strcmp(name, "f") != 0) {
        fuse_reply_err(request, ENOENT);
        return;
    }
    struct fuse_entry_param entry;
    memset(&entry, 0, sizeof entry);
    entry.ino = 2;
    describe(&entry.attr, 2);
    fuse_reply_entry(request, &entry);
}

static void get_attributes(fuse_req_t request, fuse_ino_t node, struct fuse_file_info *file) {
    (void)file;
    struct stat info;
    describe(&info, node);
    fuse_reply_attr(request, &info, 0);
}

static void queue_command(struct queue *queue, struct ring_entry *entry, int command) {
    unsigned tail = *queue->sq_tail, slot = tail & *queue->sq_mask;
    struct io_uring_sqe *sqe = (void *)(queue->sqes + ((size_t)slot << 7));   // 128-byte entries (SQE128)
    memset(sqe, 0, 128);
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = device_fd;
    sqe->cmd_op = command;
    if (command == COMMAND_REGISTER) {
        sqe->addr = (uint64_t)(uintptr_t)entry->buffers;
        sqe->len = 2;
    }
    sqe->user_data = (uint64_t)(uintptr_t)entry;
    struct ring_command *arguments = (void *)sqe->cmd;
    arguments->queue = (uint16_t)queue->processor;
    arguments->commit_id = command == COMMAND_COMMIT_AND_FETCH ? entry->commit_id : 0;
    queue->sq_array[slot] = slot;
    atomic_store_explicit((_Atomic unsigned *)queue->sq_tail, tail + 1, memory_order_release);
    queue->unsubmitted++;
}

// Rebuilds the request as /dev/fuse would have delivered it (header, the operation's own header, the rest), in the
// headroom in front of the payload, and has libfuse answer it; the answer goes back with the next fetch.
static void serve(struct queue *queue, struct ring_entry *entry) {
    struct request_header *request = (void *)entry->header->in_out;
    uint32_t payload_size = entry->header->entry.payload_size;
    entry->commit_id = entry->header->entry.commit_id;
    if (request->length < sizeof *request + payload_size
        || request->length - sizeof *request - payload_size > sizeof entry->header->op_in) {
        fprintf(stderr, "ring %d: a request whose sizes do not add up (length %u, payload %u)\n", queue->processor,
                request->length, payload_size);
        struct reply_header failed = { sizeof failed, -EIO, entry->commit_id };
        memcpy(entry->header->in_out, &failed, sizeof failed);
        entry->header->entry.payload_size = 0;
        queue_command(queue, entry, COMMAND_COMMIT_AND_FETCH);
        return;
    }
    uint32_t operation_header_size = request->length - (uint32_t)sizeof *request - payload_size;
    char *rebuilt = entry->payload - sizeof *request - operation_header_size;
    memcpy(rebuilt, request, sizeof *request);
    memcpy(rebuilt + sizeof *request, entry->header->op_in, operation_header_size);
    struct fuse_buf buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.size = request->length;
    buffer.mem = rebuilt;
    entry->replied = 0;
    answering = entry;
    fuse_session_process_buf(session, &buffer);
    answering = NULL;
    if (!entry->replied) {
        struct reply_header empty_reply = { sizeof empty_reply, 0, entry->commit_id };
        memcpy(entry->header->in_out, &empty_reply, sizeof empty_reply);
        entry->header->entry.payload_size = 0;
    }
    queue_command(queue, entry, COMMAND_COMMIT_AND_FETCH);
}

static void *run_queue(void *argument) {
    struct queue *queue = argument;
    if (getenv("SPIKE_PIN")) {
        cpu_set_t processors;
        CPU_ZERO(&processors);
        CPU_SET(queue->processor, &processors);
        sched_setaffinity(0, sizeof processors, &processors);
    }
    struct io_uring_params parameters;
    memset(&parameters, 0, sizeof parameters);
    parameters.flags = IORING_SETUP_SQE128;
    queue->ring_fd = (int)syscall(__NR_io_uring_setup, 2 * ENTRIES_PER_QUEUE, &parameters);
    if (queue->ring_fd < 0) {
        perror("io_uring_setup");
        exit(1);
    }
    size_t sq_size = parameters.sq_off.array + parameters.sq_entries * sizeof(unsigned);
    size_t cq_size = parameters.cq_off.cqes + parameters.cq_entries * sizeof(struct io_uring_cqe);
    char *rings = mmap(NULL, sq_size > cq_size ? sq_size : cq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                       queue->ring_fd, IORING_OFF_SQ_RING);
    queue->sqes = mmap(NULL, parameters.sq_entries * 128, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, queue->ring_fd,
                       IORING_OFF_SQES);
    if (rings == MAP_FAILED || queue->sqes == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    queue->sq_tail = (void *)(rings + parameters.sq_off.tail);
    queue->sq_mask = (void *)(rings + parameters.sq_off.ring_mask);
    queue->sq_array = (void *)(rings + parameters.sq_off.array);
    queue->cq_head = (void *)(rings + parameters.cq_off.head);
    queue->cq_tail = (void *)(rings + parameters.cq_off.tail);
    queue->cq_mask = (void *)(rings + parameters.cq_off.ring_mask);
    queue->cqes = (void *)(rings + parameters.cq_off.cqes);
    // Entries can be registered only once the kernel has INIT's answer.
    while (!atomic_load(&init_answered)) usleep(1000);
    for (int index = 0; index < ENTRIES_PER_QUEUE; index++) {
        struct ring_entry *entry = &queue->entries[index];
        entry->header = aligned_alloc(4096, 4096);
        entry->payload = (char *)aligned_alloc(4096, HEADROOM + PAYLOAD_BYTES) + HEADROOM;
        entry->buffers[0] = (struct iovec){ entry->header, sizeof *entry->header };
        entry->buffers[1] = (struct iovec){ entry->payload, PAYLOAD_BYTES };
        queue_command(queue, entry, COMMAND_REGISTER);
    }
    for (;;) {
        int result = (int)syscall(__NR_io_uring_enter, queue->ring_fd, queue->unsubmitted, 1, IORING_ENTER_GETEVENTS, NULL, 0);
        if (result > 0) queue->unsubmitted -= (unsigned)result;
        if (result < 0 && errno != EINTR) {
            perror("io_uring_enter");
            return NULL;
        }
        unsigned head = *queue->cq_head;
        unsigned tail = atomic_load_explicit((_Atomic unsigned *)queue->cq_tail, memory_order_acquire);
        int ended = 0;
        for (; head != tail; head++) {
            struct io_uring_cqe *completion = &queue->cqes[head & *queue->cq_mask];
            if (completion->res < 0) {
                // ENOTCONN once unmounted; anything else is a failure run.sh reports.
                fprintf(stderr, "ring %d ended: %s\n", queue->processor, strerror(-completion->res));
                ended = 1;
                continue;
            }
            serve(queue, (void *)(uintptr_t)completion->user_data);
        }
        atomic_store_explicit((_Atomic unsigned *)queue->cq_head, head, memory_order_release);
        if (ended) return NULL;
    }
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[2], "devfuse") != 0 && strcmp(argv[2], "uring") != 0)) {
        fprintf(stderr, "usage: spike MOUNTPOINT devfuse|uring\n");
        return 64;
    }
    over_uring = strcmp(argv[2], "uring") == 0;
    struct fuse_lowlevel_ops operations;
    memset(&operations, 0, sizeof operations);
    operations.init = initialize;
    operations.lookup = look_up;
    operations.getattr = get_attributes;
    char *arguments[] = { "spike", NULL };
    struct fuse_args parsed = FUSE_ARGS_INIT(1, arguments);
    session = fuse_session_new(&parsed, &operations, sizeof operations, NULL);
    device_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    char options[128];
    snprintf(options, sizeof options, "fd=%d,rootmode=40000,user_id=0,group_id=0", device_fd);
    if (session == NULL || device_fd < 0 || mount("spike", argv[1], "fuse.spike", MS_NODEV | MS_NOSUID, options) != 0) {
        perror("cannot mount (needs root and /dev/fuse)");
        return 1;
    }
    struct fuse_custom_io hooks;
    memset(&hooks, 0, sizeof hooks);
    hooks.read = read_request;
    hooks.writev = write_reply;
    if (fuse_session_custom_io(session, &hooks, device_fd) != 0) return 1;
    if (over_uring) {
        // One queue per possible processor: the kernel hands a request to the queue of the processor its caller is on.
        int processors = (int)sysconf(_SC_NPROCESSORS_CONF);
        struct queue *queues = calloc((size_t)processors, sizeof *queues);
        for (int index = 0; index < processors; index++) {
            queues[index].processor = index;
            pthread_create(&queues[index].thread, NULL, run_queue, &queues[index]);
        }
    }
    return fuse_session_loop(session) == 0 ? 0 : 1;
}
