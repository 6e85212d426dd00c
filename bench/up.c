/* A trivial service for the services benchmark: writes "up <ns>" (its
 * CLOCK_MONOTONIC time once it runs) on stdout in one write(2), then waits
 * for a signal that ends it.
 */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int main(void) {
    struct timespec t;
    char buf[64];
    clock_gettime(CLOCK_MONOTONIC, &t);
    int n = snprintf(buf, sizeof buf, "up %lld\n", t.tv_sec * 1000000000LL + t.tv_nsec);
    if (write(1, buf, n) != n)
        return 1;
    for (;;)
        pause();
}
