#ifndef PROTECTEDSTORE_CSUPPORT_H
#define PROTECTEDSTORE_CSUPPORT_H

/// renameat2(RENAME_NOREPLACE): glibc declares it only under _GNU_SOURCE, which Swift's Glibc module does not set.
/// Returns 0, or -1 with errno set (EEXIST when the target exists).
int ps_rename_noreplace(int old_directory, const char *old_name, int new_directory, const char *new_name);

#endif
