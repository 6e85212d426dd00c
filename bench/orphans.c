/* Leaves N orphans for PID 1 to reap, and reports how fast it did.
 *
 *   orphans N
 *
 * Each orphan is a double-forked grandchild: the middle process exits at
 * once, so the grandchild is re-parented to PID 1, and it exits at once too,
 * leaving a zombie that only PID 1 can reap. While forking, and afterwards
 * until no zombie is left (or 10 s pass), this counts the zombies in the PID
 * namespace. Prints: "<ms to create> <ms until none left, or -1> <most zombies
 * seen> <CPU time PID 1 used meanwhile, in us> <times PID 1 was woken
 * meanwhile>" (from the schedstat of each of its tasks, which counts every thread's time
 * on the CPU in nanoseconds and its time slices; -1 if unreadable).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int zombies(void) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    char path[300], buf[512];
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        char *p = strrchr(buf, ')');
        if (p && p[1] == ' ' && p[2] == 'Z') n++;
    }
    closedir(d);
    return n;
}

/* Nanoseconds PID 1 (the init under test) has run on a CPU, all threads,
 * and how many time slices it ran (each wake-up is one). */
static long long pid1_cpu_ns(long long *slices) {
    long long total = 0, ns, wait, n;
    *slices = 0;
    char path[300];
    DIR *d = opendir("/proc/1/task");
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/1/task/%s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fscanf(f, "%lld %lld %lld", &ns, &wait, &n) == 3) {
            total += ns;
            *slices += n;
        }
        fclose(f);
    }
    closedir(d);
    return total;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10000, most = 0, z;
    long long slices0, slices1, cpu0 = pid1_cpu_ns(&slices0);
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
        pid_t mid = fork();
        if (mid == 0) {
            if (fork() == 0) _exit(0);
            _exit(0);
        }
        waitpid(mid, NULL, 0);
        if (i % 500 == 499 && (z = zombies()) > most) most = z;
    }
    double created = now_ms() - t0, done = -1;
    while (now_ms() - t0 < created + 10000) {
        z = zombies();
        if (z > most) most = z;
        if (z == 0) { done = now_ms() - t0; break; }
        usleep(1000);
    }
    long long cpu1 = pid1_cpu_ns(&slices1);
    printf("%.1f %.1f %d %.0f %lld\n", created, done, most,
           cpu0 < 0 || cpu1 < 0 ? -1.0 : (cpu1 - cpu0) / 1e3, slices1 - slices0);
    return 0;
}
