"""What the SLURM platform writes on the cluster: the job's layout, its sbatch script and launcher, the staging
archive and the submit script. Pure functions, no I/O (Slurm's answers: :mod:`~airflow_provider_tao.hooks.slurm.status`;
log reads: :mod:`~airflow_provider_tao.hooks.slurm.logs`; the other remote commands:
:mod:`~airflow_provider_tao.hooks.slurm.commands`).

Layout of one job under the connection's ``results_root`` (every folder 0700, every file 0600: the staging shell
runs under ``umask 077``)::

    jobs/<job_id>/specs/<job_id>.json       the JobSpec without secret values
    jobs/<job_id>/env/<job_id>.env          ``export K='v'`` lines: the job's whole environment, secrets included
    jobs/<job_id>/meta/<job_id>.json        the handle (name, try, results folder); meta/slurm_job_id after sbatch
    jobs/<job_id>/files/                    JobSpec.files (TAO_JOB_FILES): the in-job runner arrives here
    jobs/<job_id>/command/                  the command: ``command.txt`` (a string) or ``argv.sh`` (a list)
    jobs/<job_id>/launch.sh                 per-task launcher (POSIX sh: rank variables, then exec the command)
    jobs/<job_id>/marks/                    ownership marks and resubmission guards (small files, written atomically)
    jobs/<job_id>/sbatch/job_<job_id>.sbatch
    jobs/<job_id>/slurm-logs/<name>-<job_id>/main.out | main.err   (created BEFORE sbatch: Slurm never creates it)
    jobs/_names/<name>                      the newest job_id of a deterministic name (find_job)
    results/<job_id>/                       the job's results (TAO_RESULTS_ROOT=<results_root>/results)

The sbatch script holds no environment value: it sources the 0600 env file when it runs. The command is staged in
a file and run by exactly one ``/bin/bash -c`` (a string) or exec'd as is (a list); nothing user-provided is ever
interpolated into a shell line unquoted, and job names / partitions / paths are checked against strict patterns.
"""

from __future__ import annotations

import io
import math
import re
import shlex
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------- state map


# ----------------------------------------------------------------------------- input rules

SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./@+=,-]*$")
SAFE_WORD = re.compile(r"^[A-Za-z0-9_.,:@+=%\[\]-]+$")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
NAME_RULE = "letters, digits, '_', '.' and '-', at most 128 characters, starting with a letter or digit"
RUNTIMES = ("pyxis", "oci", "none")
#: Exit code of ``timeout`` when the inner wall-time guard (``timeout_hours``) fires.
INNER_TIMEOUT_EXIT = 124
INNER_TIMEOUT_MARK = "TAO_INNER_TIMEOUT"
#: First line of every run of a job in main.out and main.err.
RUN_MARK = "TAO: run"


def cluster_path(uri: str) -> str | None:
    """``lustre:///abs``, ``slurm:///abs`` or ``/abs`` -> ``/abs``; anything else -> None."""
    for scheme in ("lustre://", "slurm://"):
        if uri.startswith(scheme):
            rest = uri[len(scheme) :]
            return rest if rest.startswith("/") else None
    return uri if uri.startswith("/") else None


def parse_slurm_minutes(text: str) -> float | None:
    """Slurm time limits (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) -> minutes; None = no limit."""
    text = text.strip()
    if text.lower() in ("unlimited", "infinite", "none", "n/a", ""):
        return None
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
        parts = [int(p) for p in text.split(":")]
        hours, minutes, seconds = [*parts, 0, 0][:3]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts[:3]
    return days * 1440 + hours * 60 + minutes + seconds / 60


def format_slurm_time(minutes: float) -> str:
    """Minutes -> ``D-HH:MM:SS`` (rounded up to the second)."""
    seconds = max(1, math.ceil(minutes * 60))
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    mins, secs = divmod(seconds, 60)
    return f"{days}-{hours:02d}:{mins:02d}:{secs:02d}" if days else f"{hours:02d}:{mins:02d}:{secs:02d}"


def pyxis_image(image: str) -> str:
    """An image reference in the form Pyxis/enroot expect (``registry#path:tag``, a .sqsh path, or a Hub name)."""
    image = image.removeprefix("docker://")
    if image.startswith("/") or "#" in image:
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def sqsh_cache_name(image: str) -> str:
    """File name of an image's cached SquashFS (the seeds' convention: ``/`` ``:`` ``#`` become ``_``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", pyxis_image(image)) + ".sqsh"


# ----------------------------------------------------------------------------- layout and plan


@dataclass(frozen=True)
class JobLayout:
    """Where one job's files live on the cluster."""

    results_root: str
    job_id: str
    name: str

    @property
    def jobs_root(self) -> str:
        return f"{self.results_root}/jobs"

    @property
    def job_dir(self) -> str:
        return f"{self.jobs_root}/{self.job_id}"

    @property
    def env_file(self) -> str:
        return f"{self.job_dir}/env/{self.job_id}.env"

    @property
    def files_dir(self) -> str:
        return f"{self.job_dir}/files"

    @property
    def marks_dir(self) -> str:
        return f"{self.job_dir}/marks"

    @property
    def sbatch_file(self) -> str:
        return f"{self.job_dir}/sbatch/job_{self.job_id}.sbatch"

    @property
    def launch_file(self) -> str:
        return f"{self.job_dir}/launch.sh"

    @property
    def log_dir(self) -> str:
        return f"{self.job_dir}/slurm-logs/{self.name}-{self.job_id}"

    @property
    def out_file(self) -> str:
        return f"{self.log_dir}/main.out"

    @property
    def err_file(self) -> str:
        return f"{self.log_dir}/main.err"

    @property
    def default_results_parent(self) -> str:
        return f"{self.results_root}/results"

    @property
    def names_index(self) -> str:
        return f"{self.jobs_root}/_names/{self.name}"


@dataclass(frozen=True)
class SbatchPlan:
    """Every scheduling decision of one job (validated; rendered by :func:`render_sbatch`)."""

    nodes: int
    gpus_per_node: int
    cpus_per_task: int
    time_minutes: float
    timeout_minutes: float | None
    runtime: str
    partition: str | None = None
    account: str | None = None
    exclusive: bool = False
    container: str | None = None  # OCI bundle dir, or the pyxis image (registry#path / .sqsh)
    container_mounts: tuple[str, ...] = ()
    container_env: tuple[str, ...] = ()
    sqsh_cache: str | None = None  # pyxis: cache file of the converted image (None = no conversion)
    enroot_uri: str | None = None
    force_reconvert: bool = False
    master_port: int = 29500
    directives: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # extra (--option, value) pairs


# ----------------------------------------------------------------------------- rendering


def render_command(command: str | list[str]) -> dict[str, str]:
    """The staged command files: ``command/command.txt`` for a string, ``command/argv.sh`` (``set -- 'a' 'b'``)
    for a list."""
    if isinstance(command, str):
        return {"command/command.txt": command}
    return {"command/argv.sh": "set -- " + " ".join(shlex.quote(str(arg)) for arg in command) + "\n"}


def render_launcher(layout: JobLayout, multi_node: bool) -> str:
    """Per-task launcher (POSIX sh, runs inside the container): rank variables, then the command.

    A string command becomes the single argument of one ``/bin/bash -c`` (read from its file, trailing newlines
    kept); a list runs as is. Normally ``exec`` replaces this shell, so nothing stands between Slurm and the
    command's exit status. As PID 1 of a container (Slurm's OCI runtime) the command would ignore SIGTERM --
    cancel and time limits could not stop it -- so there the launcher stays, forwards the signals and exits with
    the command's own status.
    """
    job_dir = shlex.quote(layout.job_dir)
    lines = [
        "#!/bin/sh",
        "# generated by airflow-provider-tao: runs once per node (srun --ntasks-per-node=1)",
        f"d={job_dir}",
    ]
    if multi_node:
        lines.append('NODE_RANK="${SLURM_NODEID:-0}"; export NODE_RANK')
    lines += [
        'cd "$d/work" || exit 70',
        'if [ -f "$d/command/argv.sh" ]; then . "$d/command/argv.sh"; else',
        '  cmd=$(cat "$d/command/command.txt"; printf .) || exit 70',
        '  set -- /bin/bash -c "${cmd%.}"',
        "fi",
        'if [ "$$" = 1 ]; then',
        # the trap before the command starts: PID 1 ignores a signal it has no handler for (exiting ends the
        # namespace's every process, the command too, if it started before its pid was kept)
        '  child=; trap \'if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; else exit 143; fi\' TERM INT HUP',
        '  "$@" &',
        "  child=$!",
        '  while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done',
        '  exit "$rc"',
        "fi",
        'exec "$@"',
    ]
    return "\n".join(lines) + "\n"


def render_sbatch(layout: JobLayout, plan: SbatchPlan, name: str) -> str:
    """The batch script: directives, the env file sourced at run time, one srun step whose status is the job's."""
    d: list[tuple[str, str | None]] = [
        ("--job-name", name),
        ("--partition", plan.partition),
        ("--account", plan.account),
        ("--nodes", str(plan.nodes)),
        ("--ntasks-per-node", "1"),
        ("--cpus-per-task", str(plan.cpus_per_task)),
        ("--gres", f"gpu:{plan.gpus_per_node}" if plan.gpus_per_node > 0 else None),
        ("--exclusive", "" if plan.exclusive else None),
        ("--time", format_slurm_time(plan.time_minutes)),
        ("--requeue", ""),
        ("--open-mode", "append"),
        ("--output", layout.out_file),
        ("--error", layout.err_file),
        ("--comment", f"tao:{layout.job_id}"),
        ("--wait-all-nodes", "1" if plan.nodes > 1 else None),
        *plan.directives,
    ]
    lines = ["#!/bin/bash"]
    for option, value in d:
        if value is None:
            continue
        if value and not SAFE_WORD.match(value) and not SAFE_PATH.match(value):
            raise ValueError(f"unsafe sbatch value for {option}: {value!r}")
        lines.append(f"#SBATCH {option}={value}" if value else f"#SBATCH {option}")
    q = shlex.quote
    lines += [
        "# generated by airflow-provider-tao. No secrets here: the environment is sourced from a 0600 file.",
        "set +x",
        f". {q(layout.env_file)} || {{ echo 'TAO: cannot read the job environment file' >&2; exit 70; }}",
        # one marker per run in both logs (--open-mode=append keeps every run): failure analysis reads the last run
        f'm="{RUN_MARK} ${{SLURM_RESTART_COUNT:-0}} of job $TAO_JOB_ID (slurm $SLURM_JOB_ID) on $SLURM_JOB_NODELIST"',
        'echo "$m"; echo "$m" >&2',
    ]
    if plan.nodes > 1:
        lines += [
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1); export MASTER_ADDR',
            f"MASTER_PORT=${{MASTER_PORT:-{plan.master_port}}}; export MASTER_PORT",
        ]
    srun = ["srun", f"--nodes={plan.nodes}", f"--ntasks={plan.nodes}", "--ntasks-per-node=1"]
    srun += [f"--cpus-per-task={plan.cpus_per_task}", "--kill-on-bad-exit=1"]
    if plan.runtime == "oci" and plan.container:
        srun.append(f"--container={q(plan.container)}")
    elif plan.runtime == "pyxis" and plan.container:
        image = '"$TAO_IMAGE"' if plan.sqsh_cache else q(plan.container)
        srun.append(f"--container-image={image}")
        if plan.container_mounts:
            srun.append(f"--container-mounts={q(','.join(plan.container_mounts))}")
        if plan.container_env:
            srun.append(f"--container-env={q(','.join(plan.container_env))}")
        if plan.sqsh_cache:
            lines += _sqsh_lines(plan)
    srun += ["/bin/sh", q(layout.launch_file)]
    if plan.timeout_minutes:
        srun = ["timeout", "--signal=TERM", "--kill-after=120", f"{max(1, int(plan.timeout_minutes))}m", *srun]
    lines += [
        " ".join(srun),
        "rc=$?",
        f'if [ "$rc" -eq {INNER_TIMEOUT_EXIT} ]; then echo "{INNER_TIMEOUT_MARK}: the command ran past '
        f'timeout_hours and was stopped" >&2; fi',
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def _sqsh_lines(plan: SbatchPlan) -> list[str]:
    """Pyxis: convert the image once per name into a cached .sqsh (atomic rename, one converter at a time per
    image), reconverting only when asked (``force_reconvert_latest`` for ``:latest``); fall back to the registry
    image when there is no valid SquashFS."""
    q = shlex.quote
    assert plan.sqsh_cache and plan.container and plan.enroot_uri
    force = "1" if plan.force_reconvert else "0"
    return [
        f"TAO_SQSH={q(plan.sqsh_cache)}; TAO_IMAGE={q(plan.container)}",
        'mkdir -p "$(dirname "$TAO_SQSH")"',
        f'if [ ! -s "$TAO_SQSH" ] || [ {force} = 1 ]; then',
        "  (",
        "    flock 9",
        f'    if [ ! -s "$TAO_SQSH" ] || [ {force} = 1 ]; then',
        '      p="$TAO_SQSH.partial.$SLURM_JOB_ID"; rm -f "$p"',
        '      ENROOT_TEMP_PATH="$(dirname "$TAO_SQSH")/.enroot-tmp-$SLURM_JOB_ID" \\',
        f'        enroot import -o "$p" {q(plan.enroot_uri)} >&2 \\',
        '        && [ "$(head -c 4 "$p")" = hsqs ] && mv -f "$p" "$TAO_SQSH" || rm -f "$p"',
        "    fi",
        '  ) 9>"$TAO_SQSH.lock"',
        "fi",
        'if [ -s "$TAO_SQSH" ] && [ "$(head -c 4 "$TAO_SQSH")" = hsqs ]; then TAO_IMAGE="$TAO_SQSH"; '
        'else echo "TAO: no cached SquashFS image, using the registry image" >&2; fi',
    ]


def stage_archive(files: Mapping[str, str | bytes]) -> bytes:
    """A tar of the job folder's files (modes 0600/0700; the remote ``umask 077`` enforces it again)."""
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.split("/")
            if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"{name!r} is not a relative path inside the job folder")
            for i in range(1, len(parts)):
                folder = "/".join(parts[:i])
                if folder not in dirs:
                    dirs.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
                    tar.addfile(info)
            data = files[name]
            payload = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o600, now
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def submit_script(layout: JobLayout, results_dir: str | None, try_number: int) -> str:
    """One remote shell run: unpack the staged files (stdin), create the log and results folders, index the name,
    submit, record the Slurm id. Prints ``@@SUBMITTED <id>``."""
    q = shlex.quote
    lines = [
        "set -eu",
        "umask 077",
        f"J={q(layout.job_dir)}",
        f"mkdir -p {q(layout.jobs_root)}/_names",
        'mkdir "$J"',
        'tar -x -f - -C "$J"',
        f'mkdir -p "$J/marks" "$J/meta" "$J/work" {q(layout.log_dir)}',
        f'printf %s {try_number} > "$J/marks/.owner_try.$$" && mv -f "$J/marks/.owner_try.$$" "$J/marks/owner_try"',
    ]
    if results_dir:
        lines.append(f"(umask 027; mkdir -p {q(results_dir)})")
    lines += [
        f"printf %s {q(layout.job_id)} > {q(layout.names_index)}.$$ && mv -f {q(layout.names_index)}.$$ "
        f"{q(layout.names_index)}",
        f"out=$(sbatch --parsable --export=ALL {q(layout.sbatch_file)})",
        "id=${out%%;*}",
        'printf "%s\\n" "$id" > "$J/meta/slurm_job_id.$$" && mv -f "$J/meta/slurm_job_id.$$" "$J/meta/slurm_job_id"',
        'echo "@@SUBMITTED $id"',
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- status


# ----------------------------------------------------------------------------- usage (GPU-hours)


# ----------------------------------------------------------------------------- logs


# ----------------------------------------------------------------------------- other remote scripts
