#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>
#include <sys/vfs.h>
#include "CSupport.h"

int ps_access_open_file(int fd, int mode) {
    return faccessat(fd, "", mode, AT_EACCESS | AT_EMPTY_PATH);
}

long long ps_file_system_type(int fd) {
    struct statfs info;
    return fstatfs(fd, &info) == 0 ? (long long)info.f_type : -1;
}
