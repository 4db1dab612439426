// Times N stat(2) calls of one path: µs per call, each two round trips (LOOKUP, GETATTR) to the spike's file system.
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: stat-loop PATH COUNT\n");
        return 64;
    }
    int count = atoi(argv[2]);
    struct stat info;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int index = 0; index < count; index++) {
        if (stat(argv[1], &info) != 0) {
            perror(argv[1]);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    printf("%.1f\n", ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / 1e3 / count);
    return 0;
}
