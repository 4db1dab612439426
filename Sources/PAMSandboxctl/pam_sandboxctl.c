// pam_sandboxctl: unlock the user's ProtectedStore device with the login password (docs/PROTOCOL.md, docs/SECURITY.md).
//
// auth:     the password becomes an `unlock` of the user's daemon. Placed after the line that checks it (at the end of
//           Debian's common-auth), only a checked password reaches it. Wrong: PAM_AUTH_ERR (the daemon counts one
//           failed attempt, as any unlock). Right: PAM_IGNORE, never PAM_SUCCESS: the daemon is a process of the user,
//           and must not be able to vouch for a password. With no daemon yet, the checked password is kept (zeroed
//           when PAM ends) for:
// session:  at the opening of the session, when socket activation can start the daemon, the kept password unlocks.
// password: with the old and the new password, a `change-passcode`.
// No daemon, a daemon of another user, a timeout (5 s for everything) or any other problem: PAM_IGNORE without a
// prompt, so a login is never blocked by this module.
//
// Options: root=DIR (the device root; default ~USER/.local/share/sandboxctl), socket=PATH (default DIR/daemon.sock).
// The password is never logged; every copy this module makes is zeroed.
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define PAM_SM_AUTH
#define PAM_SM_PASSWORD
#define PAM_SM_SESSION
#include <security/pam_ext.h>
#include <security/pam_modules.h>

#include "pam_sandboxctl.h"

#define MAX_FRAME 65536
#define TIMEOUT_MS 5000
#define MAX_PASSWORD 4096

struct options {
    char root[4096];
    char socket[108];
};

// Daemon replies this module understands.
enum outcome { OUTCOME_OK, OUTCOME_REFUSED, OUTCOME_UNAVAILABLE };

// The user's uid and home, with the reentrant lookup (PAM programs may be threaded).
static int lookup_user(const char *user, uid_t *uid, char *home, size_t home_size) {
    struct passwd entry, *found = NULL;
    char buffer[4096];
    if (getpwnam_r(user, &entry, buffer, sizeof(buffer), &found) != 0 || found == NULL || entry.pw_dir == NULL) return -1;
    *uid = entry.pw_uid;
    int written = snprintf(home, home_size, "%s", entry.pw_dir);
    return written < 0 || (size_t)written >= home_size ? -1 : 0;
}

static int parse_options(pam_handle_t *pamh, const char *home, int argc, const char **argv, struct options *options) {
    memset(options, 0, sizeof(*options));
    for (int i = 0; i < argc; i++) {
        int written = 0;
        if (strncmp(argv[i], "root=", 5) == 0) {
            written = snprintf(options->root, sizeof(options->root), "%s", argv[i] + 5);
            if (written < 0 || (size_t)written >= sizeof(options->root)) goto too_long;
        } else if (strncmp(argv[i], "socket=", 7) == 0) {
            written = snprintf(options->socket, sizeof(options->socket), "%s", argv[i] + 7);
            if (written < 0 || (size_t)written >= sizeof(options->socket)) goto too_long;
        } else {
            pam_syslog(pamh, LOG_WARNING, "unknown option %s (known: root=, socket=)", argv[i]);
        }
        continue;
    too_long:
        pam_syslog(pamh, LOG_ERR, "option %s is too long (a socket path has at most 107 bytes); doing nothing", argv[i]);
        return -1;
    }
    if (options->root[0] == 0) {
        int written = snprintf(options->root, sizeof(options->root), "%s/.local/share/sandboxctl", home);
        if (written < 0 || (size_t)written >= sizeof(options->root)) return -1;
    }
    if (options->socket[0] == 0) {
        int written = snprintf(options->socket, sizeof(options->socket), "%s/daemon.sock", options->root);
        if (written < 0 || (size_t)written >= sizeof(options->socket)) return -1;
    }
    return 0;
}

static long long now_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

// Waits until `fd` is ready for `events` or the deadline passes; 0 when ready.
static int wait_until(int fd, short events, long long deadline) {
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0) return -1;
        struct pollfd polled = { fd, events, 0 };
        int ready = poll(&polled, 1, (int)left);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) return -1;
        return 0;
    }
}

// Connects to the daemon (non-blocking, within the deadline) and checks that it runs as `uid` or root
// (docs/PROTOCOL.md §1: who clients trust).
static int connect_daemon(const struct options *options, uid_t uid, long long deadline) {
    struct sockaddr_un address;
    memset(&address, 0, sizeof(address));
    address.sun_family = AF_UNIX;
    snprintf(address.sun_path, sizeof(address.sun_path), "%s", options->socket);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) != 0) {
        // A full backlog: wait for room, within the deadline.
        int error = 0;
        socklen_t length = sizeof(error);
        if ((errno != EAGAIN && errno != EINPROGRESS) || wait_until(fd, POLLOUT, deadline) != 0
            || getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
            close(fd);
            return -1;
        }
    }
    struct ucred peer;
    socklen_t size = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 || (peer.uid != uid && peer.uid != 0)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const unsigned char *bytes, size_t count, long long deadline) {
    while (count > 0) {
        if (wait_until(fd, POLLOUT, deadline) != 0) return -1;
        ssize_t sent = send(fd, bytes, count, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (sent <= 0) return -1;
        bytes += sent;
        count -= (size_t)sent;
    }
    return 0;
}

static int receive_all(int fd, unsigned char *bytes, size_t count, long long deadline) {
    while (count > 0) {
        if (wait_until(fd, POLLIN, deadline) != 0) return -1;
        ssize_t got = recv(fd, bytes, count, MSG_DONTWAIT);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) return -1;
        bytes += got;
        count -= (size_t)got;
    }
    return 0;
}

// One request frame (docs/PROTOCOL.md §2): payload length, message length, the JSON message, the attachment.
static int send_frame(int fd, const char *message, const unsigned char *attachment, size_t attachment_length, long long deadline) {
    size_t message_length = strlen(message);
    size_t payload = 2 + message_length + attachment_length;
    if (payload > MAX_FRAME) return -1;
    size_t total = 4 + payload;
    unsigned char *frame = malloc(total);
    if (frame == NULL) return -1;
    frame[0] = (unsigned char)(payload >> 24);
    frame[1] = (unsigned char)(payload >> 16);
    frame[2] = (unsigned char)(payload >> 8);
    frame[3] = (unsigned char)payload;
    frame[4] = (unsigned char)(message_length >> 8);
    frame[5] = (unsigned char)message_length;
    memcpy(frame + 6, message, message_length);
    if (attachment_length > 0) memcpy(frame + 6 + message_length, attachment, attachment_length);
    int result = send_all(fd, frame, total, deadline);
    explicit_bzero(frame, total);
    free(frame);
    return result;
}

// Reads frames until the reply to `id` (events carry no id), and tells what it says.
static enum outcome read_reply(int fd, unsigned id, long long deadline) {
    char expected[32];
    snprintf(expected, sizeof(expected), "\"id\":%u", id);
    for (int frames = 0; frames < 16; frames++) {
        unsigned char header[4];
        if (receive_all(fd, header, 4, deadline) != 0) return OUTCOME_UNAVAILABLE;
        size_t payload = ((size_t)header[0] << 24) | ((size_t)header[1] << 16) | ((size_t)header[2] << 8) | header[3];
        if (payload < 2 || payload > MAX_FRAME) return OUTCOME_UNAVAILABLE;
        unsigned char *body = malloc(payload + 1);
        if (body == NULL) return OUTCOME_UNAVAILABLE;
        if (receive_all(fd, body, payload, deadline) != 0) {
            free(body);
            return OUTCOME_UNAVAILABLE;
        }
        size_t message_length = ((size_t)body[0] << 8) | body[1];
        if (message_length > payload - 2) message_length = payload - 2;
        char *message = (char *)body + 2;
        message[message_length] = 0;
        enum outcome outcome = OUTCOME_UNAVAILABLE;
        int matched = strstr(message, expected) != NULL;
        if (matched) {
            if (strstr(message, "\"error\"") == NULL) {
                outcome = OUTCOME_OK;
            } else if (strstr(message, "\"wrong-passcode\"") != NULL || strstr(message, "\"throttled\"") != NULL) {
                outcome = OUTCOME_REFUSED;
            }
        }
        explicit_bzero(body, payload + 1);
        free(body);
        if (matched) return outcome;
    }
    return OUTCOME_UNAVAILABLE;
}

// hello, then `op` with `secret` as the attachment, all within the deadline; the outcome of `op`.
static enum outcome request(const struct options *options, uid_t uid, const char *op, const unsigned char *secret, size_t secret_length,
                            long long deadline) {
    int fd = connect_daemon(options, uid, deadline);
    if (fd < 0) return OUTCOME_UNAVAILABLE;
    enum outcome outcome = OUTCOME_UNAVAILABLE;
    char message[96];
    if (send_frame(fd, "{\"id\":1,\"op\":\"hello\",\"version\":1}", NULL, 0, deadline) == 0 && read_reply(fd, 1, deadline) == OUTCOME_OK) {
        snprintf(message, sizeof(message), "{\"id\":2,\"op\":\"%s\"}", op);
        if (send_frame(fd, message, secret, secret_length, deadline) == 0) outcome = read_reply(fd, 2, deadline);
    }
    close(fd);
    return outcome;
}

// The target user's uid and the module's options; -1 if either can't be had.
static int user_and_options(pam_handle_t *pamh, int argc, const char **argv, uid_t *uid, struct options *options) {
    const char *user = NULL;
    char home[4096];
    if (pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || user == NULL) return -1;
    if (lookup_user(user, uid, home, sizeof(home)) != 0) return -1;
    return parse_options(pamh, home, argc, argv, options);
}

// Whether a daemon of the user answers by `deadline`: nothing is asked of anyone otherwise.
static int daemon_present(const struct options *options, uid_t uid, long long deadline) {
    int probe = connect_daemon(options, uid, deadline);
    if (probe < 0) return 0;
    close(probe);
    return 1;
}

// Quietly OUTCOME_UNAVAILABLE when no daemon of the user answers.
static enum outcome unlock(pam_handle_t *pamh, const struct options *options, uid_t uid, const char *password, long long deadline) {
    size_t length = strnlen(password, MAX_PASSWORD + 1);
    if (length > MAX_PASSWORD) return OUTCOME_UNAVAILABLE;
    enum outcome outcome = request(options, uid, "unlock", (const unsigned char *)password, length, deadline);
    if (outcome == OUTCOME_OK) pam_syslog(pamh, LOG_INFO, "unlocked the device of %s", options->root);
    if (outcome == OUTCOME_REFUSED) pam_syslog(pamh, LOG_NOTICE, "the device of %s refused the password", options->root);
    return outcome;
}

#define STASH "pam_sandboxctl_password"

static void forget_stash(pam_handle_t *pamh, void *data, int status) {
    (void)pamh; (void)status;
    if (data == NULL) return;
    explicit_bzero(data, strlen(data));
    free(data);
}

PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    uid_t uid;
    struct options options;
    if (user_and_options(pamh, argc, argv, &uid, &options) != 0) return PAM_IGNORE;
    // One deadline for the probe and the unlock: the whole auth line waits at most TIMEOUT_MS.
    long long deadline = now_ms() + TIMEOUT_MS;
    if (!daemon_present(&options, uid, deadline)) {
        // The daemon may come with the session (socket activation once pam_systemd has started the user's manager):
        // keep a password the lines before this one checked for pam_sm_open_session; never ask for one here.
        const void *checked = NULL;
        if (pam_get_item(pamh, PAM_AUTHTOK, &checked) == PAM_SUCCESS && checked != NULL && strnlen(checked, MAX_PASSWORD + 1) <= MAX_PASSWORD) {
            char *copy = strdup(checked);
            if (copy != NULL && pam_set_data(pamh, STASH, copy, forget_stash) != PAM_SUCCESS) forget_stash(pamh, copy, 0);
        }
        return PAM_IGNORE;
    }
    const char *password = NULL;
    if (pam_get_authtok(pamh, PAM_AUTHTOK, &password, NULL) != PAM_SUCCESS || password == NULL) return PAM_IGNORE;
    // A right password is not vouched for (PAM_IGNORE): the daemon is the user's own process.
    return unlock(pamh, &options, uid, password, deadline) == OUTCOME_REFUSED ? PAM_AUTH_ERR : PAM_IGNORE;
}

PAM_EXTERN int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_IGNORE;
}

PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    uid_t uid;
    struct options options;
    const void *password = NULL;
    // The password the auth line kept (PAM itself wipes PAM_AUTHTOK when authentication ends); never a prompt here.
    if (pam_get_data(pamh, STASH, &password) != PAM_SUCCESS || password == NULL) return PAM_IGNORE;
    if (user_and_options(pamh, argc, argv, &uid, &options) == 0) unlock(pamh, &options, uid, password, now_ms() + TIMEOUT_MS);
    // Used once: dropping the data runs forget_stash, which zeroes it.
    pam_set_data(pamh, STASH, NULL, NULL);
    return PAM_IGNORE;
}

PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_IGNORE;
}

PAM_EXTERN int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    uid_t uid;
    struct options options;
    if (user_and_options(pamh, argc, argv, &uid, &options) != 0) return PAM_IGNORE;
    if (flags & PAM_PRELIM_CHECK) return PAM_SUCCESS;
    // Probed before any prompt; the change itself gets a deadline of its own, after the prompts.
    if (!(flags & PAM_UPDATE_AUTHTOK) || !daemon_present(&options, uid, now_ms() + TIMEOUT_MS)) return PAM_IGNORE;
    const void *kept = NULL;
    const char *old_password = NULL, *new_password = NULL;
    if (pam_get_item(pamh, PAM_OLDAUTHTOK, &kept) == PAM_SUCCESS && kept != NULL) {
        old_password = kept;
    } else if (getuid() == 0 && uid != 0) {
        // Root setting another user's password (`passwd alice`) knows no old one: the device keeps its passcode.
        return PAM_IGNORE;
    } else if (pam_get_authtok(pamh, PAM_OLDAUTHTOK, &old_password, NULL) != PAM_SUCCESS || old_password == NULL) {
        return PAM_IGNORE;
    }
    if (pam_get_authtok(pamh, PAM_AUTHTOK, &new_password, NULL) != PAM_SUCCESS || new_password == NULL) return PAM_IGNORE;
    size_t old_length = strnlen(old_password, MAX_PASSWORD + 1), new_length = strnlen(new_password, MAX_PASSWORD + 1);
    if (old_length > MAX_PASSWORD || new_length > MAX_PASSWORD) {
        pam_syslog(pamh, LOG_ERR, "a password is longer than %d bytes; the device's passcode was not changed", MAX_PASSWORD);
        return PAM_IGNORE;
    }
    // docs/PROTOCOL.md §3: old length (2 bytes, big-endian) ‖ old ‖ new.
    unsigned char both[2 + 2 * MAX_PASSWORD];
    both[0] = (unsigned char)(old_length >> 8);
    both[1] = (unsigned char)old_length;
    memcpy(both + 2, old_password, old_length);
    memcpy(both + 2 + old_length, new_password, new_length);
    enum outcome outcome = request(&options, uid, "change-passcode", both, 2 + old_length + new_length, now_ms() + TIMEOUT_MS);
    explicit_bzero(both, sizeof(both));
    switch (outcome) {
    case OUTCOME_OK:
        pam_syslog(pamh, LOG_INFO, "changed the passcode of the device of %s", options.root);
        return PAM_SUCCESS;
    case OUTCOME_REFUSED:
        pam_syslog(pamh, LOG_ERR, "the device of %s refused the old password: its passcode was not changed", options.root);
        return PAM_AUTHTOK_ERR;
    default:
        return PAM_IGNORE;
    }
}
