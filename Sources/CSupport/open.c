#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "CSupport.h"

int ps_open_beneath(int directory, const char *path, int flags) {
    struct open_how how = {
        .flags = (unsigned long long)(flags | O_CLOEXEC),
        .mode = 0,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
    };
    int fd;
    do {
        fd = (int)syscall(SYS_openat2, directory, path, &how, sizeof(how));
    } while (fd < 0 && (errno == EINTR || errno == EAGAIN));
    return fd;
}
