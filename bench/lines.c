/* A service for the output benchmark: writes 100-byte lines on stdout.
 *
 *   lines count N       N numbered lines through stdio (a pipe gets 4 KiB
 *                       writes that cut lines, as most programs make), then
 *                       waits for SIGTERM
 *   lines flood         numbered lines without end, the same way
 *   lines every US N    N lines, one write(2) each, US microseconds apart,
 *                       each starting with its CLOCK_MONOTONIC time in ns,
 *                       then waits for SIGTERM
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SIZE 100

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* seq, padded with dots to SIZE bytes with the newline. */
static void line(char *buf, long long seq) {
    int n = snprintf(buf, SIZE, "%lld ", seq);
    memset(buf + n, '.', SIZE - 1 - n);
    buf[SIZE - 1] = '\n';
}

static void wait_for_term(void) {
    fflush(stdout);
    for (;;)
        pause();
}

int main(int argc, char **argv) {
    char buf[SIZE];
    if (argc == 3 && strcmp(argv[1], "count") == 0) {
        long long n = atoll(argv[2]);
        for (long long i = 0; i < n; i++) {
            line(buf, i);
            fwrite(buf, 1, SIZE, stdout);
        }
        wait_for_term();
    }
    if (argc == 2 && strcmp(argv[1], "flood") == 0) {
        for (long long i = 0;; i++) {
            line(buf, i);
            fwrite(buf, 1, SIZE, stdout);
        }
    }
    if (argc == 4 && strcmp(argv[1], "every") == 0) {
        long us = atol(argv[2]);
        long long n = atoll(argv[3]);
        for (long long i = 0; i < n; i++) {
            line(buf, now_ns());
            if (write(1, buf, SIZE) != SIZE)
                return 1;
            usleep(us);
        }
        wait_for_term();
    }
    fprintf(stderr, "usage: lines count N | lines flood | lines every US N\n");
    return 2;
}
