"""A job's log read in chunks by offset: the reader run on the login host, its answer, the pieces made into lines. Pure
functions, no I/O."""

from __future__ import annotations

import shlex

from airflow_provider_tao.hooks.slurm.script import JobLayout

LOG_CHUNK_BYTES = 1 << 20
#: An unterminated line is shown once this much of it piled up (progress bars that only use ``\r``).
PARTIAL_LINE_FLUSH_BYTES = 64 * 1024
#: Log bytes one poll's status command reads of all its jobs together: each log file gets its share, between
#: ``PARTIAL_LINE_FLUSH_BYTES`` (a share below would hold a long unfinished line back for ever) and
#: ``LOG_CHUNK_BYTES``; a job that printed more is read on at the next polls.
POLL_LOG_BYTES = 8 << 20
#: Offsets of main.out and main.err travel as one opaque integer: out + err * 2**40.
OFFSET_SHIFT = 40


def pack_offset(out: int, err: int) -> int:
    return out + (err << OFFSET_SHIFT)


def unpack_offset(offset: int) -> tuple[int, int]:
    return offset & ((1 << OFFSET_SHIFT) - 1), offset >> OFFSET_SHIFT


_READER_PY = (
    "import os,sys\n"
    "M=int(sys.argv[1]);o=sys.stdout.buffer\n"
    "for l in sys.stdin:\n"
    " t,a,p=l.rstrip('\\n').split('|',2);a=int(a)\n"
    " try:\n"
    "  f=open(p,'rb')\n"
    " except OSError:\n"
    "  o.write(b'@@F %s -1 0 0\\n'%t.encode());continue\n"
    " with f:\n"
    "  s=os.fstat(f.fileno()).st_size;a=0 if s<a else a;f.seek(a);d=f.read(min(M,s-a))\n"
    " o.write(b'@@F %s %d %d %d\\n'%(t.encode(),s,a,len(d)));o.write(d)\n"
)


_READER_SH = (
    "while IFS='|' read -r t a p; do "
    'if [ -f "$p" ]; then s=$(wc -c < "$p"); s=$((s+0)); [ "$s" -lt "$a" ] && a=0; n=$((s-a)); '
    '[ "$n" -gt "$M" ] && n=$M; printf "@@F %s %s %s %s\\n" "$t" "$s" "$a" "$n"; '
    '[ "$n" -gt 0 ] && tail -c +$((a+1)) "$p" | head -c "$n"; '
    'else printf "@@F %s -1 0 0\\n" "$t"; fi; done'
)


def log_reader_command(max_bytes: int = LOG_CHUNK_BYTES) -> str:
    """Reads ``tag|offset|path`` lines on stdin, prints ``@@F tag size offset n`` + n bytes for each (one python3
    process when the login node has one, else a POSIX sh loop)."""
    return (
        f'M={max_bytes}; if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(_READER_PY)} "$M"; '
        f"else {_READER_SH}; fi"
    )


def poll_log_bound(jobs: int) -> int:
    """Bytes per log file a poll's command reads of each of ``jobs`` jobs (see ``POLL_LOG_BYTES``)."""
    return max(PARTIAL_LINE_FLUSH_BYTES, min(LOG_CHUNK_BYTES, POLL_LOG_BYTES // max(1, 2 * jobs)))


def log_requests(layout: JobLayout, offset: int, tag: str) -> list[str]:
    out, err = unpack_offset(offset)
    return [f"{tag}.o|{out}|{layout.out_file}", f"{tag}.e|{err}|{layout.err_file}"]


def parse_log_chunks(data: bytes) -> dict[str, tuple[int, bytes, int]]:
    """``tag -> (start offset, bytes, file size)`` from the reader's output."""
    chunks: dict[str, tuple[int, bytes, int]] = {}
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0 or not data.startswith(b"@@F ", pos):
            break
        tag, size, start, length = data[pos + 4 : end].decode().split(" ")
        body = data[end + 1 : end + 1 + int(length)]
        if int(size) >= 0:
            chunks[tag] = (int(start), body, int(size))
        pos = end + 1 + int(length)
    return chunks


def complete_lines(chunk: bytes, final: bool) -> bytes:
    """The part of ``chunk`` up to its last newline (everything when final or when a huge line piled up)."""
    if final or len(chunk) >= PARTIAL_LINE_FLUSH_BYTES:
        return chunk
    cut = chunk.rfind(b"\n")
    return chunk[: cut + 1] if cut >= 0 else b""


def chunks_at_end(chunks: dict[str, tuple[int, bytes, int]], tag: str) -> bool:
    """Whether the reader's chunks of ``tag`` reach the end of both files (a read bound did not cut them)."""
    return all(start + len(body) >= size for start, body, size in (chunks.get(f"{tag}.{s}", (0, b"", 0)) for s in "oe"))


def merge_log_chunks(chunks: dict[str, tuple[int, bytes, int]], tag: str, offset: int, final: bool) -> tuple[str, int]:
    """Text of main.out then main.err from the reader's chunks, and the packed offset to continue from. ``final``
    (the job ended) shows an unfinished last line only where the chunks reach the files' end."""
    final = final and chunks_at_end(chunks, tag)
    out_off, err_off = unpack_offset(offset)
    texts = []
    offsets = []
    for suffix, current in (("o", out_off), ("e", err_off)):
        start, body, _ = chunks.get(f"{tag}.{suffix}", (current, b"", 0))
        body = complete_lines(body, final)
        text = body.decode(errors="replace")
        texts.append(text + "\n" if final and text and not text.endswith("\n") and suffix == "o" else text)
        offsets.append(start + len(body) if body else (current if start >= current else start))
    return "".join(texts), pack_offset(offsets[0], offsets[1])
