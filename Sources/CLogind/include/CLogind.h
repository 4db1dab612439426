#ifndef PROTECTEDSTORE_CLOGIND_H
#define PROTECTEDSTORE_CLOGIND_H

/// What systemd-logind told the daemon (through sd-bus, on the system bus).
enum {
    PS_LOGIND_SESSION_LOCK = 1, ///< a session of this user locked (its Lock signal, or LockedHint became true)
    PS_LOGIND_SLEEP = 2,        ///< PrepareForSleep(true): the callback returns once the keys are gone
    PS_LOGIND_IDLE = 3,         ///< a session of this user became idle (IdleHint true)
    PS_LOGIND_ACTIVE = 4,       ///< it is no longer idle
    PS_LOGIND_CONNECTED = 5,    ///< subscribed on the system bus (again)
    PS_LOGIND_DISCONNECTED = 6  ///< the bus went away; connecting again every second
};

typedef void (*ps_logind_callback)(void *context, int event);

/// A stop request another thread makes (an atomic flag).
typedef struct ps_logind_stop ps_logind_stop;
ps_logind_stop *ps_logind_stop_new(void);
void ps_logind_stop_request(ps_logind_stop *stop);
void ps_logind_stop_free(ps_logind_stop *stop);

/// Follows logind until a stop is requested: the signals asked for (session locks, sleep with a delay inhibitor held
/// until the callback for PS_LOGIND_SLEEP returns, idle hints) of sessions of this process's uid. The system bus is
/// $DBUS_SYSTEM_BUS_ADDRESS if set. Connects again after the bus goes away; every call to the bus times out in 2 s.
void ps_logind_run(void *context, ps_logind_callback callback, int session_lock, int sleep, int idle, ps_logind_stop *stop);

#endif
