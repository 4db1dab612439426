#ifndef PROTECTEDSTORE_CFUSE_SHIM_H
#define PROTECTEDSTORE_CFUSE_SHIM_H

// libfuse 3.12's API: fuse_loop_mt takes a loop configuration.
#define FUSE_USE_VERSION 312
#include <fuse.h>
#include <fuse_lowlevel.h>

// fuse_new and fuse_loop_mt are macros picking a versioned symbol; Swift imports functions, not such macros.

static inline struct fuse *ps_fuse_new(struct fuse_args *args, const struct fuse_operations *operations, void *private_data) {
    return fuse_new(args, operations, sizeof(*operations), private_data);
}

static inline int ps_fuse_loop_mt(struct fuse *fuse, unsigned int max_threads) {
    struct fuse_loop_config *config = fuse_loop_cfg_create();
    if (config == NULL) return -1;
    fuse_loop_cfg_set_max_threads(config, max_threads);
    fuse_loop_cfg_set_clone_fd(config, 0);
    int result = fuse_loop_mt(fuse, config);
    fuse_loop_cfg_destroy(config);
    return result;
}

#endif
