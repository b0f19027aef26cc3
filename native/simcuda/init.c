/* cuInit: the process attaches to the simulated node's state, then, when it is an MPS client,
 * to its control daemon (above both, so that neither calls the other). */
#define _GNU_SOURCE
#include <pthread.h>

#include "sim.h"

static pthread_once_t sim_once = PTHREAD_ONCE_INIT;

static void sim_initialise_once(void) {
    CUresult rc = sim_attach_node();
    if (rc == CUDA_SUCCESS) rc = sim_mps_connect();
    g_sim.init_result = rc;
    g_sim.initialized = rc == CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&sim_once, sim_initialise_once);
    return g_sim.init_result;
}
