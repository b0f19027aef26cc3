/* The GPUPOOL_* configuration, read once when the library loads; a malformed value is fatal. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "shim.h"

extern char **environ;

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
    unsigned shift = 0;
    if (*p != '\0') {
        switch (toupper((unsigned char)*p)) {
        case 'K': shift = 10; break;
        case 'M': shift = 20; break;
        case 'G': shift = 30; break;
        case 'T': shift = 40; break;
        case 'B': shift = 0; break;
        default: return -1;
        }
        const char *suffix = p + 1;
        /* accepted after the unit letter: "", "i", "iB", "B" (binary multiples in every case) */
        if (toupper((unsigned char)*p) == 'B') {
            if (*suffix != '\0') return -1;
        } else if (*suffix != '\0' && strcasecmp(suffix, "i") != 0 &&
                   strcasecmp(suffix, "ib") != 0 && strcasecmp(suffix, "b") != 0) {
            return -1;
        }
    }
    if (shift && value > (UINT64_MAX >> shift)) return -1;
    *out = value << shift;
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
        gp_fatal("invalid %s=%s: expected bytes, like 4294967296, 4GiB or 512MiB", name, text);
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
    const char *text = getenv("GPUPOOL_LOG_LEVEL");
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
    static const char mem[] = "GPUPOOL_MEMORY_LIMIT_";
    static const char cmp[] = "GPUPOOL_COMPUTE_LIMIT_";
    for (char **env = environ; env != NULL && *env != NULL; env++) {
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

void gp_config_load(gp_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    load_log_level();
    const char *text = getenv("GPUPOOL_MEMORY_LIMIT");
    uint64_t memory = (text && *text) ? parse_memory("GPUPOOL_MEMORY_LIMIT", text) : 0;
    text = getenv("GPUPOOL_COMPUTE_LIMIT");
    uint32_t compute = (text && *text) ? parse_percent("GPUPOOL_COMPUTE_LIMIT", text) : 100;
    for (int dev = 0; dev < GP_MAX_DEVICES; dev++) {
        cfg->memory_limit[dev] = memory;
        cfg->compute_limit[dev] = compute;
    }
    load_per_device(cfg);
    text = getenv("GPUPOOL_COMPUTE_POLICY");
    if (text == NULL || *text == '\0' || strcmp(text, "cap") == 0) {
        cfg->policy = GP_POLICY_CAP;
    } else if (strcmp(text, "share") == 0) {
        cfg->policy = GP_POLICY_SHARE;
    } else {
        gp_fatal("invalid GPUPOOL_COMPUTE_POLICY=%s: expected cap or share", text);
    }
    text = getenv("GPUPOOL_SHARED_REGION");
    cfg->region_path = (text && *text) ? text : NULL;
}
