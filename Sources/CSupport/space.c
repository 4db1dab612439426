#define _GNU_SOURCE
#include <fcntl.h>
#include "CSupport.h"

int ps_reserve_space(int fd, long long offset, long long length) {
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)length);
}
