#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>
#include "CSupport.h"

int ps_access_open_file(int fd, int mode) {
    return faccessat(fd, "", mode, AT_EACCESS | AT_EMPTY_PATH);
}
