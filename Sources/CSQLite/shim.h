#include <sqlite3.h>

/// An open file of one of the package's SQLite VFSes (the keychain's, the notes example's): SQLite allocates
/// `szOsFile` bytes per file and passes them to every I/O method; `handle` is the retained Swift object behind it.
typedef struct ps_sqlite_file {
    sqlite3_file base;
    void *handle;
} ps_sqlite_file;

// SQLite's extended result codes are macros Swift does not import.
static const int PS_SQLITE_IOERR_READ = SQLITE_IOERR_READ;
static const int PS_SQLITE_IOERR_SHORT_READ = SQLITE_IOERR_SHORT_READ;
static const int PS_SQLITE_IOERR_WRITE = SQLITE_IOERR_WRITE;
static const int PS_SQLITE_IOERR_FSYNC = SQLITE_IOERR_FSYNC;
static const int PS_SQLITE_IOERR_TRUNCATE = SQLITE_IOERR_TRUNCATE;
static const int PS_SQLITE_IOERR_CLOSE = SQLITE_IOERR_CLOSE;
static const int PS_SQLITE_IOERR_FSTAT = SQLITE_IOERR_FSTAT;
static const int PS_SQLITE_IOERR_DELETE = SQLITE_IOERR_DELETE;
static const int PS_SQLITE_IOERR_DELETE_NOENT = SQLITE_IOERR_DELETE_NOENT;
static const int PS_SQLITE_IOERR_ACCESS = SQLITE_IOERR_ACCESS;
static const int PS_SQLITE_IOERR_DIR_FSYNC = SQLITE_IOERR_DIR_FSYNC;
static const int PS_SQLITE_CONSTRAINT_UNIQUE = SQLITE_CONSTRAINT_UNIQUE;
static const int PS_SQLITE_CONSTRAINT_PRIMARYKEY = SQLITE_CONSTRAINT_PRIMARYKEY;
