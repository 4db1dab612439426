// pam_sandboxctl: unlock the user's ProtectedStore device with the login password (docs/PROTOCOL.md, docs/SECURITY.md).
//
// auth:     the typed password becomes an `unlock` of the user's daemon. Right: PAM_SUCCESS. Wrong: PAM_AUTH_ERR (the
//           daemon counts one failed attempt, as any unlock). No daemon, a daemon of another user, any other problem:
//           PAM_IGNORE, so a login is never blocked by this module.
// password: with the old and the new password, a `change-passcode`.
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
#include <security/pam_ext.h>
#include <security/pam_modules.h>

#include "pam_sandboxctl.h"

#define MAX_FRAME 65536
#define TIMEOUT_MS 5000

struct options {
    char root[4096];
    char socket[108];
};

// Daemon replies this module understands.
enum outcome { OUTCOME_OK, OUTCOME_REFUSED, OUTCOME_UNAVAILABLE };

static int parse_options(pam_handle_t *pamh, const char *user, int argc, const char **argv, struct options *options) {
    memset(options, 0, sizeof(*options));
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "root=", 5) == 0) {
            snprintf(options->root, sizeof(options->root), "%s", argv[i] + 5);
        } else if (strncmp(argv[i], "socket=", 7) == 0) {
            snprintf(options->socket, sizeof(options->socket), "%s", argv[i] + 7);
        } else {
            pam_syslog(pamh, LOG_WARNING, "unknown option %s (known: root=, socket=)", argv[i]);
        }
    }
    if (options->root[0] == 0) {
        struct passwd *entry = getpwnam(user);
        if (entry == NULL || entry->pw_dir == NULL) return -1;
        snprintf(options->root, sizeof(options->root), "%s/.local/share/sandboxctl", entry->pw_dir);
    }
    if (options->socket[0] == 0) {
        int written = snprintf(options->socket, sizeof(options->socket), "%s/daemon.sock", options->root);
        if (written < 0 || (size_t)written >= sizeof(options->socket)) return -1;
    }
    return 0;
}

// Connects to the daemon and checks that it runs as `uid` or root (docs/PROTOCOL.md §1: who clients trust).
static int connect_daemon(const struct options *options, uid_t uid) {
    struct sockaddr_un address;
    memset(&address, 0, sizeof(address));
    address.sun_family = AF_UNIX;
    snprintf(address.sun_path, sizeof(address.sun_path), "%s", options->socket);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) != 0) {
        close(fd);
        return -1;
    }
    struct ucred peer;
    socklen_t size = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 || (peer.uid != uid && peer.uid != 0)) {
        close(fd);
        return -1;
    }
    struct timeval timeout = { TIMEOUT_MS / 1000, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    return fd;
}

static int send_all(int fd, const unsigned char *bytes, size_t count) {
    while (count > 0) {
        ssize_t sent = send(fd, bytes, count, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return -1;
        bytes += sent;
        count -= (size_t)sent;
    }
    return 0;
}

static int receive_all(int fd, unsigned char *bytes, size_t count) {
    while (count > 0) {
        ssize_t got = recv(fd, bytes, count, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        bytes += got;
        count -= (size_t)got;
    }
    return 0;
}

// One request frame (docs/PROTOCOL.md §2): payload length, message length, the JSON message, the attachment.
static int send_frame(int fd, const char *message, const unsigned char *attachment, size_t attachment_length) {
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
    int result = send_all(fd, frame, total);
    explicit_bzero(frame, total);
    free(frame);
    return result;
}

// Reads frames until the reply to `id` (events carry no id), and tells what it says.
static enum outcome read_reply(int fd, unsigned id) {
    char expected[32];
    snprintf(expected, sizeof(expected), "\"id\":%u", id);
    for (int frames = 0; frames < 16; frames++) {
        unsigned char header[4];
        if (receive_all(fd, header, 4) != 0) return OUTCOME_UNAVAILABLE;
        size_t payload = ((size_t)header[0] << 24) | ((size_t)header[1] << 16) | ((size_t)header[2] << 8) | header[3];
        if (payload < 2 || payload > MAX_FRAME) return OUTCOME_UNAVAILABLE;
        unsigned char *body = malloc(payload + 1);
        if (body == NULL) return OUTCOME_UNAVAILABLE;
        if (receive_all(fd, body, payload) != 0) {
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

// hello, then `op` with `secret` as the attachment; the outcome of `op`.
static enum outcome request(const struct options *options, uid_t uid, const char *op, const unsigned char *secret, size_t secret_length) {
    int fd = connect_daemon(options, uid);
    if (fd < 0) return OUTCOME_UNAVAILABLE;
    enum outcome outcome = OUTCOME_UNAVAILABLE;
    char message[96];
    if (send_frame(fd, "{\"id\":1,\"op\":\"hello\",\"version\":1}", NULL, 0) == 0 && read_reply(fd, 1) == OUTCOME_OK) {
        snprintf(message, sizeof(message), "{\"id\":2,\"op\":\"%s\"}", op);
        if (send_frame(fd, message, secret, secret_length) == 0) outcome = read_reply(fd, 2);
    }
    close(fd);
    return outcome;
}

static int user_and_options(pam_handle_t *pamh, int argc, const char **argv, uid_t *uid, struct options *options) {
    const char *user = NULL;
    if (pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || user == NULL) return -1;
    struct passwd *entry = getpwnam(user);
    if (entry == NULL) return -1;
    *uid = entry->pw_uid;
    return parse_options(pamh, user, argc, argv, options);
}

PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    uid_t uid;
    struct options options;
    if (user_and_options(pamh, argc, argv, &uid, &options) != 0) return PAM_IGNORE;
    // Only if a daemon of this user is there: no prompt, and nothing asked, otherwise.
    int probe = connect_daemon(&options, uid);
    if (probe < 0) return PAM_IGNORE;
    close(probe);
    const char *password = NULL;
    if (pam_get_authtok(pamh, PAM_AUTHTOK, &password, NULL) != PAM_SUCCESS || password == NULL) return PAM_IGNORE;
    enum outcome outcome = request(&options, uid, "unlock", (const unsigned char *)password, strlen(password));
    switch (outcome) {
    case OUTCOME_OK:
        pam_syslog(pamh, LOG_INFO, "unlocked the device of %s", options.root);
        return PAM_SUCCESS;
    case OUTCOME_REFUSED:
        pam_syslog(pamh, LOG_NOTICE, "the device of %s refused the password", options.root);
        return PAM_AUTH_ERR;
    default:
        return PAM_IGNORE;
    }
}

PAM_EXTERN int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_IGNORE;
}

PAM_EXTERN int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    uid_t uid;
    struct options options;
    if (user_and_options(pamh, argc, argv, &uid, &options) != 0) return PAM_IGNORE;
    if (flags & PAM_PRELIM_CHECK) return PAM_SUCCESS;
    if (!(flags & PAM_UPDATE_AUTHTOK)) return PAM_IGNORE;
    int probe = connect_daemon(&options, uid);
    if (probe < 0) return PAM_IGNORE;
    close(probe);
    const char *old_password = NULL, *new_password = NULL;
    if (pam_get_authtok(pamh, PAM_OLDAUTHTOK, &old_password, NULL) != PAM_SUCCESS || old_password == NULL) return PAM_IGNORE;
    if (pam_get_authtok(pamh, PAM_AUTHTOK, &new_password, NULL) != PAM_SUCCESS || new_password == NULL) return PAM_IGNORE;
    size_t old_length = strlen(old_password), new_length = strlen(new_password);
    if (old_length > 0xffff || 2 + old_length + new_length > 4096) return PAM_IGNORE;
    // docs/PROTOCOL.md §3: old length (2 bytes, big-endian) ‖ old ‖ new.
    unsigned char both[4096];
    both[0] = (unsigned char)(old_length >> 8);
    both[1] = (unsigned char)old_length;
    memcpy(both + 2, old_password, old_length);
    memcpy(both + 2 + old_length, new_password, new_length);
    enum outcome outcome = request(&options, uid, "change-passcode", both, 2 + old_length + new_length);
    explicit_bzero(both, sizeof(both));
    switch (outcome) {
    case OUTCOME_OK:
        pam_syslog(pamh, LOG_INFO, "changed the passcode of the device of %s", options.root);
        return PAM_SUCCESS;
    case OUTCOME_REFUSED:
        return PAM_AUTHTOK_ERR;
    default:
        return PAM_IGNORE;
    }
}
