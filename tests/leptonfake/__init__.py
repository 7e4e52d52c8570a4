"""A stateful fake of the DGX Cloud Lepton workspace API, for the integration tests (no real one can run here).

It answers the routes, query parameters, pagination, JSON shapes and error bodies that the real ``leptonai``
0.47.1 client uses (and the raw requests of the TAO SDK: ``imagepullsecrets``, ``jobs/<id>/replicas``,
``jobs/<id>/failure-analysis``, ``storage-permission``), so our hook talks to it through that client, over HTTP,
unchanged. Jobs move through the platform's states on a clock (:mod:`tests.leptonfake.controller`); each replica is
a REAL container on the test Docker engine (:mod:`tests.leptonfake.runtime`) with the job's env (secret references
resolved), Lepton's per-worker variables, its mounts (node-group volumes are host folders), /dev/shm, the shape's
GPUs and memory (so an OOM kill is real) and DNS names that resolve between replicas; or, for benchmarks
(``--sim``), a simulated one.

Where the real server's behaviour is not known, the fake can do each variant (``/fake/config`` settings:
``patch_labels``, ``unique_names``, ``mount_check``, ``secret_overwrite``, ``label_rules``, ``shape_filter``,
``page_cap``, ``ready_counts``, ``event_message``; ``--id-mode``), so the hook is tested against every one; where
each behaviour comes from is in ``tests/FIDELITY.md``. Run it with ``python -m tests.leptonfake --ready-file F``;
the tests start it through :func:`tests.leptonfake.control.start_server`.
"""
