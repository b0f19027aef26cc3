"""The names gpupool uses on Kubernetes objects: resources, annotations, the scheduler."""

from __future__ import annotations

#: GPUs to share (device-plugin slots: one per GPU a pod shares)
RESOURCE_GPU = "gpupool.io/gpu"
#: memory per GPU, a Kubernetes quantity (10Gi); not a device-plugin resource, read by the extender
RESOURCE_MEMORY = "gpupool.io/gpu-memory"
#: compute per GPU in percent (1..100)
RESOURCE_COMPUTE = "gpupool.io/gpu-compute"
RESOURCES = (RESOURCE_GPU, RESOURCE_MEMORY, RESOURCE_COMPUTE)

#: optional request annotations
ANN_MODE = "gpupool.io/mode"
ANN_PRIORITY = "gpupool.io/priority"
ANN_GPU_MODEL = "gpupool.io/gpu-model"
ANN_MIG_PROFILE = "gpupool.io/mig-profile"

#: written by the extender before it binds: the node and the GPU indices chosen on it
ANN_NODE = "gpupool.io/node"
ANN_GPUS = "gpupool.io/gpus"
#: the memory (bytes) the pod holds and the compute (milli-GPU) it asked for on each of its GPUs
#: (a `low` pod holds none of that compute: it is opportunistic)
ANN_MEMORY_BYTES = "gpupool.io/memory-bytes"
ANN_COMPUTE_MILLI = "gpupool.io/compute-milli"
#: the device-plugin slot IDs chosen for the pod (one per GPU, on that GPU): the kubelet is
#: steered to them, and Allocate's device IDs name the pod they were chosen for
ANN_SLOTS = "gpupool.io/slots"
#: HMAC-SHA256 by the extender over all of the above and the pod's UID: the device plugin serves
#: only what the extender wrote for this very pod
ANN_SIGNATURE = "gpupool.io/signature"
#: set by the device plugin once Allocate has served the pod
ANN_ALLOCATED = "gpupool.io/allocated"
#: what the extender writes at bind (and removes when the bind fails); a pod created with any of
#: them, or anyone but gpupool changing them, is refused by the webhook
ALLOCATION_ANNOTATIONS = (
    ANN_NODE,
    ANN_GPUS,
    ANN_MEMORY_BYTES,
    ANN_COMPUTE_MILLI,
    ANN_SLOTS,
    ANN_SIGNATURE,
    ANN_ALLOCATED,
)

#: on a Node: its GPU inventory as JSON, written by the device plugin
ANN_NODE_GPUS = "gpupool.io/gpu-inventory"

#: device-plugin slots per GPU: at most this many pods share one GPU
SLOTS_PER_GPU = 10

#: the scheduler profile that calls the extender (the webhook points pods at it)
SCHEDULER_NAME = "gpupool-scheduler"

#: who may write a pod's gpupool.io annotations after its creation: the extender (kube-scheduler's
#: pod) and the device plugins, by their service accounts in the manifests' namespace
DEFAULT_TRUSTED = (
    "system:serviceaccount:gpupool:gpupool-scheduler",
    "system:serviceaccount:gpupool:gpupool-device-plugin",
)
