// The compute check's CUDA C++ program, built with nvcc as users build theirs: a kernel launched
// with <<<...>>>, then cudaDeviceSynchronize(), in a loop, for a given wall time.
//
//   spin MS SECONDS [alloc]
//
// Each kernel busy-waits MS milliseconds of GPU wall time (%globaltimer); `alloc` makes a
// cudaMalloc first. Prints "RESULT {"kernels": N, "seconds": S, "ms": MS}".
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <cuda_runtime.h>

__global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

static double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void check(cudaError_t rc, const char *what) {
    if (rc != cudaSuccess) {
        std::fprintf(stderr, "spin: %s: %s\n", what, cudaGetErrorString(rc));
        std::exit(3);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: spin MS SECONDS [alloc]\n");
        return 64;
    }
    double ms = std::atof(argv[1]), seconds = std::atof(argv[2]);
    if (argc > 3) {
        void *p = nullptr;
        check(cudaMalloc(&p, 64 << 20), "cudaMalloc");
    }
    unsigned long long ns = (unsigned long long)(ms * 1e6);
    double start = now_s();
    long kernels = 0;
    while (now_s() - start < seconds) {
        spin<<<132, 128>>>(ns);
        check(cudaGetLastError(), "launch");
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        kernels++;
    }
    std::printf("RESULT {\"kernels\": %ld, \"seconds\": %.6f, \"ms\": %g}\n", kernels,
                now_s() - start, ms);
    return 0;
}
