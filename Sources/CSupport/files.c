#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include "CSupport.h"

int ps_access_open_file(int fd, int mode) {
    return faccessat(fd, "", mode, AT_EACCESS | AT_EMPTY_PATH);
}

long long ps_file_system_type(int fd) {
    struct statfs info;
    return fstatfs(fd, &info) == 0 ? (long long)info.f_type : -1;
}

int ps_change_times_fine_once_read(int directory) {
    int fd = openat(directory, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    int fine = 1;
    // Two changes a few microseconds apart fall in one clock tick: only a file system that stamps a change after a
    // read of the change time with the fine clock gives them different change times, every time.
    for (int round = 0; round < 5 && fine; round++) {
        struct stat first, second;
        if (fchmod(fd, 0600) != 0 || fstat(fd, &first) != 0 || fchmod(fd, 0640) != 0 || fstat(fd, &second) != 0) {
            fine = 0;
            break;
        }
        fine = first.st_ctim.tv_sec != second.st_ctim.tv_sec || first.st_ctim.tv_nsec != second.st_ctim.tv_nsec;
    }
    close(fd);
    return fine;
}
