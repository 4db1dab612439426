#include <errno.h>
#include <stdint.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include "CSupport.h"

int ps_realtime_alarm(void) {
    return timerfd_create(CLOCK_REALTIME, TFD_CLOEXEC | TFD_NONBLOCK);
}

int ps_realtime_alarm_set(int fd, long long seconds) {
    struct itimerspec when = { { 0, 0 }, { (time_t)seconds, 0 } };
    return timerfd_settime(fd, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &when, NULL);
}

int ps_realtime_alarm_read(int fd) {
    uint64_t expirations = 0;
    ssize_t count = read(fd, &expirations, sizeof expirations);
    if (count == sizeof expirations) return 1;
    if (count < 0 && errno == ECANCELED) return 2;
    return 0;
}
