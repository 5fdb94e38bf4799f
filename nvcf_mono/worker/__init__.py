"""The worker agent that runs beside an inference server (``nvcf-mono worker``, the sidecar).

It waits for the inference server to be healthy, connects to the invocation plane's WorkerService,
serves the requests it is sent to the inference server, streams the responses back, and keeps
itself and its instance's health visible on ``/v1/health/live`` and ``/v1/health/ready``.
"""
