/*
 * gpupool's SPANK plugin: every task of a Slurm job that holds a gpupool share runs with the
 * share's files in place of the host's, in a mount namespace of its own.
 *
 * The job's Prolog (`gpupool slurm prolog`, root) writes SHARES/<job id>/etc/ld.so.preload
 * (the interception library) and SHARES/<job id>/etc/gpupool/shim.conf (the share's settings),
 * and SHARES/<job id>/env (the variables the job's programs need to find its GPUs). Here, in
 * each task as root before it becomes the user's (task_init_privileged), the task gets a
 * private mount namespace with a read-only overlay of that etc/ over /etc: the dynamic loader
 * preloads the library into every program of the task, whatever its environment, and the
 * library reads its settings from the read-only file, not from the environment. A job can
 * neither unset the library nor change its share; forked and setsid processes stay in the
 * namespace. Nothing on the host changes. A job with no share directory (no GPU gres) is left
 * alone; a job whose share cannot be put in place does not start (fail closed).
 *
 * A job may ask less than its shards give, or another way to use them (srun, sbatch and salloc
 * options): --gpupool-priority=high|low, --gpupool-policy=cap|share, --gpupool-memory=SIZE,
 * --gpupool-compute=PERCENT. They are checked for form at submit; the node daemon checks that
 * they ask no more than the shards (else the job's tasks refuse to start, saying why). Slurm
 * hands them to the Prolog as SPANK__SLURM_SPANK_OPTION_gpupool_gpupool_<name>.
 *
 * plugstack.conf: required /path/to/gpupool-spank.so shares=/var/lib/gpupool/slurm
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(gpupool, 1);

#define ENV_LINE_MAX 4096

static const char *shares_dir = "/var/lib/gpupool/slurm";

/* the options' values, checked for form in the submitting command (local context) */
static int check_option(int val, const char *optarg, int remote);

enum { OPT_PRIORITY, OPT_POLICY, OPT_MEMORY, OPT_COMPUTE };

struct spank_option spank_options[] = {
    {"gpupool-priority", "high|low",
     "gpupool: the share's priority (low runs in the time high "
     "shares leave)",
     1, OPT_PRIORITY, check_option},
    {"gpupool-policy", "cap|share",
     "gpupool: cap (at most the shards' compute) or share (a "
     "weight: idle time too)",
     1, OPT_POLICY, check_option},
    {"gpupool-memory", "SIZE", "gpupool: less GPU memory than the shards give (e.g. 2Gi)", 1,
     OPT_MEMORY, check_option},
    {"gpupool-compute", "PERCENT", "gpupool: less compute than the shards give (1-100)", 1,
     OPT_COMPUTE, check_option},
    SPANK_OPTIONS_TABLE_END};

static int one_of(const char *text, const char *a, const char *b) {
    return strcmp(text, a) == 0 || strcmp(text, b) == 0;
}

/* SIZE: digits, then an optional K/M/G/T (with i) and B; the daemon reads it exactly */
static int is_size(const char *text) {
    const char *p = text;
    while (*p >= '0' && *p <= '9') p++;
    if (p == text) return 0;
    if (*p != '\0' && strchr("kKMGTP", *p) != NULL) p++;
    if (*p == 'i') p++;
    if (*p == 'B') p++;
    return *p == '\0';
}

static int check_option(int val, const char *optarg, int remote) {
    (void)remote;
    const char *arg = optarg != NULL ? optarg : "";
    char *end = NULL;
    long percent = strtol(arg, &end, 10);
    int ok = val == OPT_PRIORITY  ? one_of(arg, "high", "low")
             : val == OPT_POLICY  ? one_of(arg, "cap", "share")
             : val == OPT_MEMORY  ? is_size(arg)
             : val == OPT_COMPUTE ? (end != arg && *end == '\0' && percent >= 1 && percent <= 100)
                                  : 0;
    if (!ok) {
        slurm_error("gpupool: invalid --%s=%s", spank_options[val].name, arg);
        return -1;
    }
    return 0;
}

static void read_args(int ac, char **av) {
    for (int i = 0; i < ac; i++) {
        if (strncmp(av[i], "shares=", 7) == 0) shares_dir = av[i] + 7;
    }
}

/* SHARES/<job>/<leaf> into `out`; 0 when the job has a share directory, 1 when not, -1 on error */
static int job_path(spank_t sp, const char *leaf, char *out, size_t size) {
    uint32_t job_id = 0;
    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS) {
        slurm_error("gpupool: cannot read the job id");
        return -1;
    }
    int n = snprintf(out, size, "%s/%u/%s", shares_dir, job_id, leaf);
    if (n < 0 || (size_t)n >= size) {
        slurm_error("gpupool: the share directory's path is too long");
        return -1;
    }
    struct stat st;
    if (lstat(out, &st) != 0) {
        if (errno == ENOENT) return 1;
        slurm_error("gpupool: %s: %s", out, strerror(errno));
        return -1;
    }
    return 0;
}

/* the Prolog refused the job a share (it asked what the node cannot give): say why, on the
 * job's stderr, and let no task start; -1 also when that cannot be read */
static int refused(spank_t sp) {
    char path[PATH_MAX];
    int found = job_path(sp, "refused", path, sizeof path);
    if (found != 0) return found > 0 ? 0 : -1;
    char why[512] = "";
    FILE *file = fopen(path, "re");
    if (file != NULL) {
        if (fgets(why, sizeof why, file) == NULL) why[0] = '\0';
        fclose(file);
    }
    why[strcspn(why, "\n")] = '\0';
    slurm_error("gpupool: %s", why);
    return -1;
}

int slurm_spank_init(spank_t sp, int ac, char **av) {
    (void)sp;
    read_args(ac, av);
    return ESPANK_SUCCESS;
}

/* slurmstepd logs a failed task_init_privileged and starts the task all the same: a task that
 * cannot be held to its share ends here, in its own process (forked for it), before its program */
static int fail_closed(spank_t sp) {
    pid_t task = 0;
    /* the task's pid is set in slurmstepd after the fork: the task's own process reads -1 */
    if (spank_get_item(sp, S_TASK_PID, &task) == ESPANK_SUCCESS && (task == -1 || task == getpid()))
        _exit(1);
    return ESPANK_ERROR;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av) {
    (void)ac;
    (void)av;
    if (!spank_remote(sp)) return ESPANK_SUCCESS;
    if (refused(sp) != 0) return fail_closed(sp);
    char etc[PATH_MAX];
    int found = job_path(sp, "etc", etc, sizeof etc);
    if (found != 0) return found > 0 ? ESPANK_SUCCESS : fail_closed(sp);
    char options[PATH_MAX + 32];
    snprintf(options, sizeof options, "lowerdir=%s:/etc", etc);
    /* this task alone: its own namespace, whose mounts never propagate back to the host */
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        slurm_error("gpupool: cannot make the task's mount namespace: %s", strerror(errno));
        return fail_closed(sp);
    }
    /* two lower layers and no upper one: read-only, the share's files over the host's */
    if (mount("overlay", "/etc", "overlay", MS_RDONLY, options) != 0) {
        slurm_error("gpupool: cannot put the share's files over /etc: %s", strerror(errno));
        return fail_closed(sp);
    }
    return ESPANK_SUCCESS;
}

/* the share's variables, set after the user's own so that they win */
int slurm_spank_task_init(spank_t sp, int ac, char **av) {
    (void)ac;
    (void)av;
    char path[PATH_MAX];
    int found = job_path(sp, "env", path, sizeof path);
    if (found != 0) return found > 0 ? ESPANK_SUCCESS : ESPANK_ERROR;
    FILE *file = fopen(path, "re");
    if (file == NULL) {
        slurm_error("gpupool: cannot read %s: %s", path, strerror(errno));
        return ESPANK_ERROR;
    }
    char line[ENV_LINE_MAX];
    int rc = ESPANK_SUCCESS;
    while (fgets(line, sizeof line, file) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *eq = strchr(line, '=');
        if (eq == NULL) continue;
        *eq = '\0';
        if (spank_setenv(sp, line, eq + 1, 1) != ESPANK_SUCCESS) rc = ESPANK_ERROR;
    }
    fclose(file);
    return rc;
}
