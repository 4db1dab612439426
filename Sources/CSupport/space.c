#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>
#include "CSupport.h"

int ps_reserve_space(int fd, long long offset, long long length) {
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)length);
}

long long ps_seek_data(int fd, long long offset) {
    return (long long)lseek(fd, (off_t)offset, SEEK_DATA);
}

long long ps_seek_hole(int fd, long long offset) {
    return (long long)lseek(fd, (off_t)offset, SEEK_HOLE);
}

int ps_fallocate(int fd, int mode, long long offset, long long length) {
    return fallocate(fd, mode, (off_t)offset, (off_t)length);
}
