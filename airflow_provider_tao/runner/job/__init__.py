"""The in-job runner: stage inputs, write the spec, run the command, commit outputs -- inside the job.

This package is what runs in the job, never on the Airflow side. ``runner/bundle.py`` (host side) packs it into one
zip archive, ``runner.pyz``, which the platform stages into ``$TAO_JOB_FILES`` next to ``runner.json``; the job runs
``python3 runner.pyz runner.json``. The same modules are imported on the host by ``runner/entrypoint.py`` and the
operator (paths, placeholders, manifests), so there is one copy of that logic.

Every module is stdlib-only at import and uses Python >= 3.8 grammar (bare-metal SLURM nodes); none imports airflow
or anything outside this package, and imports inside it are relative (in the archive it is called ``tao_runner``).
Optional packages are imported where they are needed: ``boto3`` for ``s3://``, ``yaml`` / ``tomli_w`` to write a
spec (a stdlib writer otherwise), ``huggingface_hub`` / ``ngcsdk`` for model hubs.

One module per concern:

``errors``    failure classes and exit codes          ``tuning``     the ``TAO_*`` knobs read from the environment
``paths``     dotted spec paths, output names, URIs   ``specs``      writing the spec as yaml / toml / json
``fsops``     atomic local files, walking outputs     ``progress``   ``TAO_PROGRESS`` / ``TAO_FAILURE`` lines, steps
``s3``        the S3 client, errors, listings         ``transfers``  concurrent downloads / uploads, the shared cache
``manifest``  ``_TAO_MANIFEST.json``: write, read     ``hubs``       ``hf_model://``, ``hf_dataset://``, ``ngc://``
``command``   the user command as a process group     ``inputs``     staging declared inputs, rewriting the spec
``outputs``   planning and committing outputs         ``job``        one run, from runner.json to the exit code
``runfile``   reading runner.json                     ``main``       the entry point (``__main__`` of the archive)
"""
