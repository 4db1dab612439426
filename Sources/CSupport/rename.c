#define _GNU_SOURCE
#include <stdio.h>
#include <fcntl.h>
#include "CSupport.h"

int ps_rename_noreplace(int old_directory, const char *old_name, int new_directory, const char *new_name) {
    return renameat2(old_directory, old_name, new_directory, new_name, RENAME_NOREPLACE);
}

int ps_rename_exchange(int old_directory, const char *old_name, int new_directory, const char *new_name) {
    return renameat2(old_directory, old_name, new_directory, new_name, RENAME_EXCHANGE);
}
