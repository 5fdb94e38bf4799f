"""Label and annotation keys of the objects a cluster agent creates on Kubernetes (reference compute-plane
§3): NVCA's, so tools that know NVCF's objects read ours.
"""

from __future__ import annotations

MESSAGE_BATCH_ID = "nvcf.nvidia.io/message-batch-id"
DEPLOYMENT_ID = "nvcf.nvidia.io/deployment-id"
GPU_SPECIFICATION_ID = "nvcf.nvidia.io/gpu-specification-id"
REGION = "nvcf.nvidia.io/region"
BACKEND = "nvcf.nvidia.io/backend"
INSTANCE_TYPE_NAME = "nvcf.nvidia.io/instance-type-name"
INSTANCE_TYPE_VALUE = "nvcf.nvidia.io/instance-type-value"
ENVIRONMENT = "nvcf.nvidia.io/environment"
#: How long a task's pod may wait for a node (its maxQueuedDuration, in seconds).
MAX_QUEUED_SECONDS = "nvcf.nvidia.io/max-queued-seconds"

#: The API group of the ``NVCFBackend`` object (deploy/crds/nvcfbackends.nvcf.nvidia.io.yaml), NVCA's.
NVCF_BACKEND_GROUP = "nvcf.nvidia.io"
