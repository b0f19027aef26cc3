/*
 * A second preloaded library that wraps getenv and finds the real one with
 * dlsym(RTLD_NEXT, "getenv"), as interposers (profilers, allocators) do. RTLD_NEXT is relative to
 * the library that calls dlsym: the interception library's dlsym must keep it so, or this
 * lookup would find this very wrapper again and recurse forever.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

char *getenv(const char *name) {
    static char *(*real)(const char *);
    if (real == NULL) real = (char *(*)(const char *))dlsym(RTLD_NEXT, "getenv");
    if (strcmp(name, "SHIM_INTERPOSER_PROBE") == 0) return "wrapped";
    return real(name);
}
