"""A fake ``brev`` CLI (brevdev/brev-cli v0.6.327) for the tests: no real Brev can be reached from here, and the
real CLI cannot be installed or built here either (a Go module without a vendor tree, no Go proxy).

``bin/brev`` is a stdlib-only Python executable that behaves like the real CLI on every point the provider relies
on, each read from the CLI's source: exit codes 0/1 only; errors on stderr as the CLI prints them; progress on
stderr and instance names on stdout when stdout is piped; names (and instance types) read from a piped stdin until
EOF; the logged-out prompt on stdout and ``EOF``; ``ls --json`` shapes (``{"workspaces": null}`` when empty);
create's fallback chain over ``--type`` and its exit 0 when an instance later fails; exec's "last argument is the
command", its re-run of a failing command and its exit 1 whatever the remote code; ``copy`` with scp semantics.

Each instance is a REAL container on the test Docker engine (``instances.py``), so ``docker run`` inside
``brev exec`` really runs a job, as a sibling container on the same engine (``instance/init.py``).

The world -- user, orgs, instance types and capacity, instances, auth state, faults -- lives in the directory
``$BREV_FAKE_STATE`` (``world.py``); tests drive it through ``control.BrevWorld``.
"""
