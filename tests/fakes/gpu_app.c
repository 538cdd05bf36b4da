/*
 * A GPU workload for the watchdog tests: finds the driver the way the CUDA runtime does
 * (dlopen libcuda.so.1, dlsym), allocates COUNT blocks of MIB MiB with cuMemAlloc_v2, prints
 * `allocated K of COUNT` (K stops early when the driver, or libhcs in front of it, refuses),
 * then waits for a signal holding its memory, as a training job holds its tensors.
 *
 *   gpu_app MIB COUNT
 *
 * With LD_PRELOAD=libhcs.so and HCS_CONFIG it stays within its quota; without them it is a
 * workload that escaped libhcs, and only the driver (through NVML) sees what it holds.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned int);
typedef int (*alloc_fn)(unsigned long long *, size_t);

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MIB COUNT\n", argv[0]);
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10) << 20;
    int count = atoi(argv[2]);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cuda) {
        fprintf(stderr, "gpu_app: %s\n", dlerror());
        return 1;
    }
    init_fn init = (init_fn)dlsym(cuda, "cuInit");
    alloc_fn alloc = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
    if (!init || !alloc || init(0) != 0) {
        fprintf(stderr, "gpu_app: the driver did not initialise\n");
        return 1;
    }
    int done = 0;
    unsigned long long ptr;
    while (done < count && alloc(&ptr, size) == 0) done++;
    printf("allocated %d of %d\n", done, count);
    fflush(stdout);
    for (;;) pause();
}
