// The daemon's lock triggers from systemd-logind, with libsystemd's sd-bus (docs/DESIGN.md, "Lock triggers").
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <systemd/sd-bus.h>
#include <unistd.h>
#include "CLogind.h"

#define LOGIND "org.freedesktop.login1"
#define MANAGER_PATH "/org/freedesktop/login1"
// No call to the bus may hold up a stop or a sleep for long.
#define CALL_TIMEOUT_USEC 2000000
#define INHIBITOR_RETRY_SECONDS 2

struct ps_logind_stop { atomic_int requested; };

ps_logind_stop *ps_logind_stop_new(void) {
    ps_logind_stop *stop = calloc(1, sizeof(*stop));
    if (stop != NULL) atomic_init(&stop->requested, 0);
    return stop;
}

void ps_logind_stop_request(ps_logind_stop *stop) { atomic_store(&stop->requested, 1); }

void ps_logind_stop_free(ps_logind_stop *stop) { free(stop); }

static int stop_requested(ps_logind_stop *stop) { return atomic_load(&stop->requested); }

struct watcher {
    void *context;
    ps_logind_callback callback;
    int session_lock;
    int inhibitor;
    time_t inhibitor_tried;
    uid_t uid;
};

// Whether the session at `path` is this user's (its User property).
static int is_own_session(sd_bus *bus, const char *path, uid_t uid) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int result = sd_bus_get_property(bus, LOGIND, path, LOGIND ".Session", "User", &error, &reply, "(uo)");
    sd_bus_error_free(&error);
    if (result < 0) return 0;
    uint32_t owner = 0;
    const char *user_path = NULL;
    result = sd_bus_message_read(reply, "(uo)", &owner, &user_path);
    sd_bus_message_unref(reply);
    return result >= 0 && owner == uid;
}

// A delay inhibitor for sleep: logind waits (up to its InhibitDelayMaxSec) until it is closed.
static void take_inhibitor(sd_bus *bus, struct watcher *watcher) {
    if (watcher->inhibitor >= 0) return;
    watcher->inhibitor_tried = time(NULL);
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    if (sd_bus_call_method(bus, LOGIND, MANAGER_PATH, LOGIND ".Manager", "Inhibit", &error, &reply, "ssss",
                           "sleep", "sandboxctl", "Discard the data protection keys before sleep", "delay") >= 0) {
        int fd = -1;
        if (sd_bus_message_read(reply, "h", &fd) >= 0 && fd >= 0) watcher->inhibitor = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    }
    sd_bus_error_free(&error);
    sd_bus_message_unref(reply);
}

static void release_inhibitor(struct watcher *watcher) {
    if (watcher->inhibitor >= 0) close(watcher->inhibitor);
    watcher->inhibitor = -1;
}

static int on_lock(sd_bus_message *message, void *userdata, sd_bus_error *error) {
    (void)error;
    struct watcher *watcher = userdata;
    const char *path = sd_bus_message_get_path(message);
    if (path != NULL && is_own_session(sd_bus_message_get_bus(message), path, watcher->uid)) {
        watcher->callback(watcher->context, PS_LOGIND_SESSION_LOCK);
    }
    return 0;
}

static int on_properties(sd_bus_message *message, void *userdata, sd_bus_error *error) {
    (void)error;
    struct watcher *watcher = userdata;
    const char *interface = NULL;
    if (sd_bus_message_read(message, "s", &interface) < 0 || strcmp(interface, LOGIND ".Session") != 0) return 0;
    int locked = -1, idle = -1;
    if (sd_bus_message_enter_container(message, 'a', "{sv}") < 0) return 0;
    while (sd_bus_message_enter_container(message, 'e', "sv") > 0) {
        const char *name = NULL;
        if (sd_bus_message_read(message, "s", &name) < 0) return 0;
        int value = 0;
        if ((strcmp(name, "LockedHint") == 0 || strcmp(name, "IdleHint") == 0) && sd_bus_message_read(message, "v", "b", &value) >= 0) {
            if (name[0] == 'L') locked = value; else idle = value;
        } else if (sd_bus_message_skip(message, "v") < 0) {
            return 0;
        }
        if (sd_bus_message_exit_container(message) < 0) return 0;
    }
    if (locked < 0 && idle < 0) return 0;
    const char *path = sd_bus_message_get_path(message);
    if (path == NULL || !is_own_session(sd_bus_message_get_bus(message), path, watcher->uid)) return 0;
    if (locked == 1 && watcher->session_lock) watcher->callback(watcher->context, PS_LOGIND_SESSION_LOCK);
    if (idle == 1) watcher->callback(watcher->context, PS_LOGIND_IDLE);
    if (idle == 0) watcher->callback(watcher->context, PS_LOGIND_ACTIVE);
    return 0;
}

static int on_sleep(sd_bus_message *message, void *userdata, sd_bus_error *error) {
    (void)error;
    struct watcher *watcher = userdata;
    int starting = 0;
    if (sd_bus_message_read(message, "b", &starting) < 0) return 0;
    if (starting) {
        watcher->callback(watcher->context, PS_LOGIND_SLEEP);
        release_inhibitor(watcher);
    } else {
        take_inhibitor(sd_bus_message_get_bus(message), watcher);
    }
    return 0;
}

static int stopped_within(ps_logind_stop *stop, int milliseconds) {
    for (int waited = 0; waited < milliseconds; waited += 100) {
        if (stop_requested(stop)) return 1;
        usleep(100000);
    }
    return stop_requested(stop);
}

void ps_logind_run(void *context, ps_logind_callback callback, int session_lock, int sleep, int idle, ps_logind_stop *stop) {
    struct watcher watcher = { context, callback, session_lock, -1, 0, getuid() };
    while (!stop_requested(stop)) {
        sd_bus *bus = NULL;
        int ok = sd_bus_open_system(&bus) >= 0;
        if (ok) ok = sd_bus_set_method_call_timeout(bus, CALL_TIMEOUT_USEC) >= 0;
        if (ok && session_lock) ok = sd_bus_match_signal(bus, NULL, LOGIND, NULL, LOGIND ".Session", "Lock", on_lock, &watcher) >= 0;
        if (ok && (session_lock || idle)) {
            ok = sd_bus_match_signal(bus, NULL, LOGIND, NULL, "org.freedesktop.DBus.Properties", "PropertiesChanged", on_properties, &watcher) >= 0;
        }
        if (ok && sleep) ok = sd_bus_match_signal(bus, NULL, LOGIND, MANAGER_PATH, LOGIND ".Manager", "PrepareForSleep", on_sleep, &watcher) >= 0;
        if (ok) {
            if (sleep) take_inhibitor(bus, &watcher);
            callback(context, PS_LOGIND_CONNECTED);
            while (!stop_requested(stop)) {
                int processed = sd_bus_process(bus, NULL);
                if (processed < 0) break;
                if (processed > 0) continue;
                // logind was not there yet, or restarted: keep trying for the sleep inhibitor.
                if (sleep && watcher.inhibitor < 0 && time(NULL) - watcher.inhibitor_tried >= INHIBITOR_RETRY_SECONDS) take_inhibitor(bus, &watcher);
                int waited = sd_bus_wait(bus, 500000);
                if (waited < 0 && waited != -EINTR) break;
            }
            callback(context, PS_LOGIND_DISCONNECTED);
        }
        release_inhibitor(&watcher);
        sd_bus_flush_close_unref(bus);
        if (stopped_within(stop, 1000)) break;
    }
}
