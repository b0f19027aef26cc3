/*
 * Finding the real driver, and making every way a program finds a driver entry point lead to our
 * wrappers: direct calls bind to our exported symbols (LD_PRELOAD puts us first), dlsym(handle,
 * "cuMemAlloc_v2") is answered by our dlsym, and cuGetProcAddress (how the CUDA 12/13 runtimes
 * fetch every entry point, by base name + version + stream flavour) by our cuGetProcAddress.
 * Also the library's constructor: configuration and region are set up before main().
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpupool_procs.h"
#include "shim.h"

typedef void *(*dlsym_fn)(void *, const char *);

/* AddressSanitizer's runtime looks up what it intercepts through dlsym (ours) while it starts,
 * before its shadow memory exists: in a sanitized build, the code on that path must not be
 * instrumented */
#define GP_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

/* one intercepted entry point: its exported name, and for cuGetProcAddress its base name, the
 * first CUDA version that maps the base name to this symbol, and whether it is a _ptsz flavour */
typedef struct {
    const char *name;
    const char *base;
    int version;
    int ptsz;
    int nvml;
    void *wrapper;
} gp_hook;

#define CU_HOOK(base, version, sym, ptsz) {#sym, base, version, ptsz, 0, (void *)sym},
#define NVML_HOOK(sym) {#sym, NULL, 0, 0, 1, (void *)sym},

static const gp_hook hooks[] = {GP_PROCS_WRAPPED(CU_HOOK) NVML_HOOK(nvmlDeviceGetMemoryInfo)
                                    NVML_HOOK(nvmlDeviceGetMemoryInfo_v2)};
#define HOOK_COUNT (sizeof hooks / sizeof hooks[0])

/* the real entry point of each hook, for matching what the driver's cuGetProcAddress returns */
static void *volatile hook_real[HOOK_COUNT];

static dlsym_fn real_dlsym_fn;

GP_UNINSTRUMENTED static dlsym_fn find_real_dlsym(void) {
    dlsym_fn fn = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
    if (fn != NULL) return fn;
    /* glibc 2.34 moved dlsym into libc under a new version; older ones have only their first
     * version of it (2.2.5 on x86-64, 2.17 on aarch64) */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; fn == NULL && i < sizeof versions / sizeof versions[0]; i++)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (fn == NULL) gp_fatal("cannot find the C library's dlsym");
    __atomic_store_n(&real_dlsym_fn, fn, __ATOMIC_RELEASE);
    return fn;
}

void *gp_real_dlsym(void *handle, const char *name) { return find_real_dlsym()(handle, name); }

static void *library(const char *const *names) {
    for (const char *const *name = names; *name != NULL; name++) {
        void *handle = dlopen(*name, RTLD_LAZY | RTLD_NOLOAD);
        if (handle != NULL) return handle;
    }
    return NULL;
}

static void *real_in(const char *name, const char *const *libs) {
    /* RTLD_NEXT: objects after this library in the global scope (a program linked to the
     * driver); then the driver opened privately, as the CUDA runtime and ctypes do */
    void *fn = gp_real_dlsym(RTLD_NEXT, name);
    if (fn != NULL) return fn;
    void *handle = library(libs);
    return handle ? gp_real_dlsym(handle, name) : NULL;
}

void *gp_real_cuda(const char *name) {
    static const char *const libs[] = {"libcuda.so.1", "libcuda.so", NULL};
    return real_in(name, libs);
}

void *gp_real_nvml(const char *name) {
    static const char *const libs[] = {"libnvidia-ml.so.1", "libnvidia-ml.so", NULL};
    return real_in(name, libs);
}

void *gp_real_cached(void *volatile *slot, const char *name, int nvml) {
    void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (fn != NULL) return fn;
    fn = nvml ? gp_real_nvml(name) : gp_real_cuda(name);
    if (fn != NULL) __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
    return fn;
}

GP_UNINSTRUMENTED static const gp_hook *hook_named(const char *name) {
    if (!((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0)) return NULL;
    for (size_t i = 0; i < HOOK_COUNT; i++) {
        if (strcmp(hooks[i].name, name) == 0) return &hooks[i];
    }
    return NULL;
}

GP_UNINSTRUMENTED __attribute__((visibility("default"))) void *dlsym(void *handle,
                                                                     const char *name) {
    dlsym_fn real = find_real_dlsym();
    const gp_hook *hook = hook_named(name);
    if (hook != NULL) {
        void *fn = real(handle, name);
        /* only where the library asked for really has the entry point */
        return fn != NULL ? hook->wrapper : NULL;
    }
    /* a tail call, so that glibc sees the caller's return address (RTLD_NEXT is relative to it) */
    return real(handle, name);
}

static const gp_hook *hook_by_base(const char *symbol, int version, int ptsz) {
    const gp_hook *best = NULL;
    for (size_t i = 0; i < HOOK_COUNT; i++) {
        const gp_hook *hook = &hooks[i];
        if (hook->nvml || hook->ptsz != ptsz || version < hook->version) continue;
        if (strcmp(hook->base, symbol) != 0) continue;
        if (gp_real_cached(&hook_real[i], hook->name, 0) == NULL) continue;
        if (best == NULL || hook->version > best->version) best = hook;
    }
    return best;
}

/* our wrapper for what the driver's cuGetProcAddress returned as `fn` for `symbol` */
static void *wrap_proc(const char *symbol, void *fn, int version, cuuint64_t flags) {
    for (size_t i = 0; i < HOOK_COUNT; i++) {
        if (hooks[i].nvml) continue;
        void *real = gp_real_cached(&hook_real[i], hooks[i].name, 0);
        if (real != NULL && real == fn) return hooks[i].wrapper;
    }
    /* a driver whose table differs from its exports: match by base name, version and flavour
     * (entry points without a stream have no per-thread flavour) */
    int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const gp_hook *hook = hook_by_base(symbol, version, ptsz);
    if (hook == NULL && ptsz) hook = hook_by_base(symbol, version, 0);
    /* a launch path the compute share would miss: say so (a new driver entry point) */
    if (hook == NULL && strstr(symbol, "Launch") != NULL && strcmp(symbol, "cuLaunchHostFunc") != 0)
        gp_log(GP_LOG_INFO, "cuGetProcAddress(%s, %d%s): a launch entry point not wrapped", symbol,
               version, ptsz ? ", per-thread" : "");
    return hook ? hook->wrapper : fn;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    __typeof__(&cuGetProcAddress_v2) real = GP_REAL(cuGetProcAddress_v2);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
        *pfn = wrap_proc(symbol, *pfn, cudaVersion, flags);
    return rc;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    __typeof__(&cuGetProcAddress) real = GP_REAL(cuGetProcAddress);
    if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL)
        *pfn = wrap_proc(symbol, *pfn, cudaVersion, flags);
    return rc;
}

static void after_fork_in_child(void) {
    gp_region_after_fork();
    gp_ptrmap_reset();
    gp_throttle_after_fork();
    gp_launch_after_fork();
    gp_arbiter_after_fork();
    gp_elastic_after_fork();
}

__attribute__((constructor)) static void gp_load(void) {
    static gp_config cfg;
    find_real_dlsym();
    gp_config_load(&cfg);
    gp_region_open(&cfg);
    gp_elastic_configure(&cfg);
    gp_arbiter_configure(&cfg);
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

__attribute__((destructor)) static void gp_unload(void) {
    gp_launch_report();
    gp_arbiter_close();
    gp_memory_report_refusals();
    gp_region_close();
}
