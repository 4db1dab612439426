#define _GNU_SOURCE
#include <malloc.h>
#include <spawn.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include "CSupport.h"

int ps_disable_core_dumps(void) {
    struct rlimit none = { 0, 0 };
    if (setrlimit(RLIMIT_CORE, &none) != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

int ps_is_dumpable(void) {
    return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
}

int ps_spawn_close_from(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

int ps_overwrite_freed_memory(void) {
    return mallopt(M_PERTURB, 0x5a);
}

void ps_release_freed_memory(void) {
    malloc_trim(0);
}

__attribute__((noinline)) void ps_scrub_stack_below(size_t size) {
    unsigned char area[size];
    explicit_bzero(area, size);
    // The area must exist and be written, though nothing reads it.
    __asm__ volatile("" : : "r"(area) : "memory");
}
