"""A stateful fake Kubernetes API server for the integration tests (no real API server can run here).

It speaks the API's REST paths and JSON shapes over HTTP, so the real ``kubernetes`` and ``kubernetes_asyncio``
clients -- reached through the cncf-kubernetes provider's hooks -- talk to it unchanged. It holds Jobs, Pods,
Secrets, ConfigMaps, Services, PersistentVolumeClaims, Events and Nodes; answers errors as the API's ``Status``
objects (404 NotFound, 409 AlreadyExists / Conflict, 422 Invalid, 503 ServiceUnavailable); honours label and field
selectors, owner references with garbage collection and the three delete propagation policies (the Job default
``Orphan``); and runs the controllers a cluster runs (:mod:`tests.kubefake.cluster`): the Job controller (indexed
Jobs, suspend, backoff limit, active deadline, TTL), a scheduler (GPU capacity, node selectors, PVCs) and a
kubelet that runs every pod as a REAL container on the test Docker engine (image, command, env from Secrets,
volumes, memory limit -> a real OOM kill, logs) or, for benchmarks, simulates it.

Tests steer it through ``/fake/*`` (not part of the Kubernetes API): inject evictions and 503 bursts, count objects
and requests. Run it with ``python -m tests.kubefake --port 0 --ready-file F``.
"""
