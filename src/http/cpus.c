/* tern_cpu_count: the CPUs this process may use (run.h). A container or a
 * taskset gives a process fewer CPUs than the machine has; counting the
 * machine's (sysconf) would start more loops than there are CPUs to run
 * them, each then sharing a core with another. Go's runtime reads the
 * affinity mask and, since 1.25, the cgroup's quota, the same way. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tern/run.h"
#include "platform/platform.h"

/* Whole CPUs of a quota per period, rounded up; 0 for no quota. */
static int per_period(long long quota, long long period) {
    if (quota <= 0 || period <= 0)
        return 0;
    long long cpus = (quota + period - 1) / period;
    return cpus > 1 << 20 ? 1 << 20 : (int)cpus;
}

/* The quota of one cgroup directory: v2's cpu.max ("max 100000" or
 * "QUOTA PERIOD"), or v1's cpu.cfs_quota_us (-1: none) and
 * cpu.cfs_period_us; 0 when it has none. */
static int quota_cpus(const char *root, const char *dir, bool v2) {
    char path[4352];
    long long quota = 0, period = 0;
    FILE *f;
    if (v2) {
        snprintf(path, sizeof(path), "%s%s/cpu.max", root, dir);
        if ((f = fopen(path, "re")) == NULL)
            return 0;
        int n = fscanf(f, "%lld %lld", &quota, &period);   /* "max" reads as nothing */
        fclose(f);
        return n == 2 ? per_period(quota, period) : 0;
    }
    snprintf(path, sizeof(path), "%s%s/cpu.cfs_quota_us", root, dir);
    if ((f = fopen(path, "re")) == NULL)
        return 0;
    int n = fscanf(f, "%lld", &quota);
    fclose(f);
    snprintf(path, sizeof(path), "%s%s/cpu.cfs_period_us", root, dir);
    if (n != 1 || (f = fopen(path, "re")) == NULL)
        return 0;
    n = fscanf(f, "%lld", &period);
    fclose(f);
    return n == 1 ? per_period(quota, period) : 0;
}

/* The smallest quota of a cgroup and its ancestors; 0 when none has one. */
static int chain_cpus(const char *root, char *dir, bool v2) {
    int best = 0;
    for (;;) {   /* the group, then each parent up to the root */
        int q = quota_cpus(root, strcmp(dir, "/") == 0 ? "" : dir, v2);
        if (q > 0 && (best == 0 || q < best))
            best = q;
        char *slash = strrchr(dir, '/');
        if (slash == NULL || slash == dir)
            break;
        *slash = '\0';
    }
    return best;
}

/* This process's CPU quota from /proc/self/cgroup: v2's group (the "0::"
 * line) or v1's cpu controller's (a line naming "cpu" among its
 * controllers), 0 when neither has one. */
static int cgroup_cpus(void) {
    char line[4096];
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (f == NULL)
        return 0;
    int best = 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL)
            continue;
        *c2 = '\0';
        const char *controllers = c1 + 1;
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s", c2 + 1);
        int q = 0;
        if (strcmp(line, "0") == 0 && *controllers == '\0') {
            q = chain_cpus("/sys/fs/cgroup", dir, true);
        } else {
            /* v1: "cpu" alone or in a list ("cpu,cpuacct"), mounted under
             * either name */
            char list[256];
            snprintf(list, sizeof(list), ",%s,", controllers);
            if (strstr(list, ",cpu,") == NULL)
                continue;
            char root[300];
            snprintf(root, sizeof(root), "/sys/fs/cgroup/%s", controllers);
            char copy[4096];
            snprintf(copy, sizeof(copy), "%s", dir);
            q = chain_cpus(root, dir, false);
            if (q == 0)
                q = chain_cpus("/sys/fs/cgroup/cpu", copy, false);
        }
        if (q > 0 && (best == 0 || q < best))
            best = q;
    }
    fclose(f);
    return best;
}

int tern_cpu_count(void) {
    int n = tern__plat_affinity_cpus();
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online < 1 ? 1 : online > 1 << 20 ? 1 << 20 : (int)online;
    }
    int q = cgroup_cpus();
    if (q > 0 && q < n)
        n = q;
    return n < 1 ? 1 : n;
}
