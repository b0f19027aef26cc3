/*
 * The GPUPOOL_* configuration, read once when the library loads; a malformed value is fatal.
 *
 * The values come from the environment, or, when /etc/gpupool/shim.conf exists, from that file
 * alone (NAME=VALUE lines): a container mounts it read-only next to /etc/ld.so.preload, so a
 * workload can neither drop the library nor change or unset its share.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "shim.h"

#define GP_SYSTEM_CONFIG "/etc/gpupool/shim.conf"
#define GP_CONFIG_LINES 128

extern char **environ;

/* NAME=VALUE entries the configuration is read from: the environment or the file's lines */
static char **source;

static const char *get(const char *name) {
    size_t len = strlen(name);
    for (char **entry = source; entry != NULL && *entry != NULL; entry++) {
        if (strncmp(*entry, name, len) == 0 && (*entry)[len] == '=') return *entry + len + 1;
    }
    return NULL;
}

static void trim_line(char *line) {
    size_t len = strlen(line);
    while (len > 0 && isspace((unsigned char)line[len - 1])) line[--len] = '\0';
}

static char **read_file(const char *path) {
    FILE *file = fopen(path, "re");
    if (file == NULL) gp_fatal("cannot read the share configuration %s: %s", path, strerror(errno));
    static char *lines[GP_CONFIG_LINES + 1];
    char buf[1024];
    int count = 0, number = 0;
    while (fgets(buf, sizeof buf, file) != NULL) {
        number++;
        trim_line(buf);
        const char *text = buf;
        while (isspace((unsigned char)*text)) text++;
        if (*text == '\0' || *text == '#') continue;
        if (strncmp(text, "GPUPOOL_", 8) != 0 || strchr(text, '=') == NULL)
            gp_fatal("invalid line %d of %s: expected GPUPOOL_NAME=VALUE", number, path);
        if (count == GP_CONFIG_LINES) gp_fatal("%s has more than %d settings", path, count);
        lines[count++] = strdup(text);
    }
    fclose(file);
    lines[count] = NULL;
    return lines;
}

/* the system file if present; else a file named by GPUPOOL_CONFIG_FILE (only where the system
 * file is absent, so it opens no way around it); else the environment */
static char **config_source(void) {
    if (access(GP_SYSTEM_CONFIG, F_OK) == 0) return read_file(GP_SYSTEM_CONFIG);
    const char *named = getenv(GP_ENV_CONFIG_FILE);
    if (named != NULL && *named != '\0') return read_file(named);
    return environ;
}

/* the power of a Kubernetes quantity suffix's letter (k/K, M, G, T, P, E), 0 if none */
static unsigned unit_power(char letter, int binary) {
    const char *letters = binary ? "KMGTPE" : "kMGTPE";
    const char *found = letter != '\0' ? strchr(letters, letter) : NULL;
    return found != NULL ? (unsigned)(found - letters) + 1 : 0;
}

/* Kubernetes quantity rules, as the Python side reads sizes: `4G` = 4x10^9, `4Gi` = 4x2^30,
 * with the `B` people add for bytes (`4GB` = `4G`, `4GiB` = `4Gi`); case-sensitive (`m` would be
 * milli); a bare number is bytes */
int gp_parse_bytes(const char *text, uint64_t *out) {
    const char *p = text;
    if (!isdigit((unsigned char)*p)) return -1;
    uint64_t value = 0;
    for (; isdigit((unsigned char)*p); p++) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10) return -1;
        value = value * 10 + digit;
    }
    while (*p == ' ') p++;
    unsigned power = 0;
    uint64_t base = 1;
    if (*p != '\0' && *p != 'B') {
        int binary = p[1] == 'i';
        power = unit_power(*p, binary);
        if (power == 0) return -1;
        base = binary ? 1024 : 1000;
        p += binary ? 2 : 1;
    }
    if (*p == 'B') p++;
    if (*p != '\0') return -1;
    for (unsigned i = 0; i < power; i++) {
        if (value > UINT64_MAX / base) return -1;
        value *= base;
    }
    *out = value;
    return 0;
}

static uint32_t parse_percent(const char *name, const char *text) {
    char *end = NULL;
    if (!isdigit((unsigned char)*text)) goto bad;
    long value = strtol(text, &end, 10);
    if (*end == '%') end++;
    if (*end != '\0' || value < 1 || value > 100) goto bad;
    return (uint32_t)value;
bad:
    gp_fatal("invalid %s=%s: expected a whole percent from 1 to 100", name, text);
}

static uint64_t parse_memory(const char *name, const char *text) {
    uint64_t bytes = 0;
    if (gp_parse_bytes(text, &bytes) != 0)
        gp_fatal("invalid %s=%s: expected a size like 4Gi (4x2^30 bytes), 4G (4x10^9) or 512Mi",
                 name, text);
    return bytes;
}

/* the <n> of GPUPOOL_X_<n>: a device ordinal below GP_MAX_DEVICES */
static int parse_ordinal(const char *name, const char *digits) {
    char *end = NULL;
    if (!isdigit((unsigned char)*digits)) return -1;
    long n = strtol(digits, &end, 10);
    if (*end != '\0') return -1;
    if (n >= GP_MAX_DEVICES)
        gp_fatal("invalid %s: per-device settings cover device ordinals 0 to %d", name,
                 GP_MAX_DEVICES - 1);
    return (int)n;
}

static void load_log_level(void) {
    const char *text = get(GP_ENV_LOG_LEVEL);
    if (text == NULL || *text == '\0') return;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(text, names[i]) == 0) {
            gp_log_threshold = (gp_log_level)i;
            return;
        }
    }
    gp_fatal("invalid GPUPOOL_LOG_LEVEL=%s: expected error, warn, info or debug", text);
}

/* GPUPOOL_MEMORY_LIMIT_<n> and GPUPOOL_COMPUTE_LIMIT_<n> override the all-device values */
static void load_per_device(gp_config *cfg) {
    static const char mem[] = GP_ENV_MEMORY_LIMIT "_";
    static const char cmp[] = GP_ENV_COMPUTE_LIMIT "_";
    for (char **env = source; env != NULL && *env != NULL; env++) {
        const char *entry = *env;
        int is_mem = strncmp(entry, mem, sizeof mem - 1) == 0;
        int is_cmp = strncmp(entry, cmp, sizeof cmp - 1) == 0;
        if (!is_mem && !is_cmp) continue;
        const char *eq = strchr(entry, '=');
        if (eq == NULL) continue;
        char name[128];
        size_t name_len = (size_t)(eq - entry);
        if (name_len >= sizeof name) name_len = sizeof name - 1;
        memcpy(name, entry, name_len);
        name[name_len] = '\0';
        int dev = parse_ordinal(name, name + (is_mem ? sizeof mem : sizeof cmp) - 1);
        if (dev < 0)
            gp_fatal("invalid variable %s: the suffix must be a device ordinal, like %s0", name,
                     is_mem ? mem : cmp);
        if (is_mem) {
            cfg->memory_limit[dev] = parse_memory(name, eq + 1);
        } else {
            cfg->compute_limit[dev] = parse_percent(name, eq + 1);
        }
    }
}

/* "<16 hex digits>:<16 hex digits>": the share's id and key at the arbiter */
static void parse_share(const char *text, gp_config *cfg) {
    char *end = NULL;
    int ok = strlen(text) == 33 && text[16] == ':';
    for (int i = 0; ok && i < 33; i++) ok = i == 16 || isxdigit((unsigned char)text[i]);
    if (ok) {
        cfg->arbiter_share = strtoull(text, &end, 16);
        cfg->arbiter_key = strtoull(text + 17, &end, 16);
    }
    if (!ok || cfg->arbiter_share == 0)
        gp_fatal("invalid GPUPOOL_ARBITER_SHARE: expected <16 hex digits>:<16 hex digits>");
}

void gp_config_load(gp_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    source = config_source();
    load_log_level();
    const char *text = get(GP_ENV_MEMORY_LIMIT);
    uint64_t memory = (text && *text) ? parse_memory(GP_ENV_MEMORY_LIMIT, text) : 0;
    text = get(GP_ENV_COMPUTE_LIMIT);
    uint32_t compute = (text && *text) ? parse_percent(GP_ENV_COMPUTE_LIMIT, text) : 100;
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        cfg->memory_limit[dev] = memory;
        cfg->compute_limit[dev] = compute;
    }
    load_per_device(cfg);
    text = get(GP_ENV_COMPUTE_POLICY);
    if (text == NULL || *text == '\0' || strcmp(text, "cap") == 0) {
        cfg->policy = GP_POLICY_CAP;
    } else if (strcmp(text, "share") == 0) {
        cfg->policy = GP_POLICY_SHARE;
    } else {
        gp_fatal("invalid GPUPOOL_COMPUTE_POLICY=%s: expected cap or share", text);
    }
    text = get(GP_ENV_COMPUTE_PRIORITY);
    if (text == NULL || *text == '\0') {
        cfg->priority = GP_PRIORITY_UNSET;
    } else if (strcmp(text, "high") == 0) {
        cfg->priority = GP_PRIORITY_HIGH;
    } else if (strcmp(text, "low") == 0) {
        cfg->priority = GP_PRIORITY_LOW;
    } else {
        gp_fatal("invalid GPUPOOL_COMPUTE_PRIORITY=%s: expected high or low", text);
    }
    text = get(GP_ENV_ELASTIC);
    if (text == NULL || *text == '\0' || strcmp(text, "0") == 0) {
        cfg->elastic = 0;
    } else if (strcmp(text, "1") == 0) {
        cfg->elastic = 1;
    } else {
        gp_fatal("invalid GPUPOOL_ELASTIC=%s: expected 0 or 1", text);
    }
    text = get(GP_ENV_MEMORY_BURST);
    cfg->memory_burst = (text && *text) ? parse_memory(GP_ENV_MEMORY_BURST, text) : 0;
    if (cfg->memory_burst != 0 && !cfg->elastic)
        gp_fatal("GPUPOOL_MEMORY_BURST needs GPUPOOL_ELASTIC=1 (a burst is managed memory)");
    text = get(GP_ENV_SHARED_REGION);
    cfg->region_path = (text && *text) ? text : NULL;
    /* the trusted arbiter: its directory and this share's id and key there, as the launch
     * registered them; without both, the share is not arbitrated (it holds its cap alone) */
    text = get(GP_ENV_ARBITER_DIR);
    if (text != NULL && *text != '\0' && (*text != '/' || strlen(text) >= 512))
        gp_fatal("invalid GPUPOOL_ARBITER_DIR=%s: expected an absolute path under 512 bytes", text);
    cfg->arbiter_dir = (text && *text) ? text : NULL;
    text = get(GP_ENV_ARBITER_SHARE);
    if (text != NULL && *text != '\0') parse_share(text, cfg);
}
