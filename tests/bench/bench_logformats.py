"""Decoding speed of stallwatch.logs.formats on 1,000,000 SGLang decode lines, per runtime framing.

Each framing of the same engine output is fed in 1 MiB reads cut at arbitrary bytes, as the follower reads a file;
the decoded bytes are checked against the engine's output before the figure is printed.

    .venv/bin/python tests/bench/bench_logformats.py [--lines 1000000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stallwatch.logs.formats import CriDecoder, Decoder, DockerJsonDecoder
from support import transcripts

READ_BYTES = 1 << 20  # the follower's read size (stallwatch.logfollow CHUNK_BYTES)


def engine_lines(count: int) -> list[bytes]:
    """SGLang `Decode batch` lines, the same as tests/bench/bench_logs.py feeds the follower."""
    return [line.encode() for line in transcripts.sglang_decode(count)]


def containerd_time(i: int) -> bytes:
    """RFC3339Nano as Go prints it: trailing zeros of the fraction trimmed, so the width varies."""
    fraction = (b"%09d" % (i * 104729 % 1000000000)).rstrip(b"0")
    return b"2026-11-29T10:%02d:%02d%s%sZ" % (i // 60 % 60, i % 60, b"." if fraction else b"", fraction)


def frame_containerd(lines: list[bytes]) -> bytes:
    return b"".join(b"%s stderr F %s" % (containerd_time(i), line) for i, line in enumerate(lines))


def frame_crio(lines: list[bytes]) -> bytes:
    """conmon: fixed-width time with offset; lines cut where its 8 KiB reads end (containers/conmon ctr_stdio.c)."""
    text = b"".join(lines)
    out = []
    for start in range(0, len(text), 8192):
        read = text[start : start + 8192]
        stamp = b"2026-11-29T10:%02d:%02d.%09d+01:00" % (start // 60 % 60, start % 60, start % 1000000000)
        *whole, last = read.split(b"\n")
        out.extend(b"%s stderr F %s\n" % (stamp, line) for line in whole)
        if last:
            out.append(b"%s stderr P %s\n" % (stamp, last))
    return b"".join(out)


def frame_docker(lines: list[bytes]) -> bytes:
    return b"".join(
        b'{"log":%s,"stream":"stderr","time":"%s"}\n' % (json.dumps(line.decode()).encode(), containerd_time(i))
        for i, line in enumerate(lines)
    )


def colored(lines: list[bytes]) -> list[bytes]:
    """vLLM-style ANSI-coloured level names: every record holds `\\u001b` escapes in Docker's JSON."""
    return [b"\x1b[32mINFO\x1b[0m " + line for line in lines]


def measure(make: Callable[[], Decoder], framed: bytes, expected: bytes, lines: int) -> tuple[float, int]:
    reads = [framed[offset : offset + READ_BYTES] for offset in range(0, len(framed), READ_BYTES)]
    decoder = make()
    start = time.perf_counter()
    out = [decoder.decode(read) for read in reads]
    elapsed = time.perf_counter() - start
    assert b"".join(out) == expected, "decoded output differs from the engine's output"
    return lines / elapsed, decoder.errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    lines = engine_lines(args.lines)
    text = b"".join(lines)
    print(f"{args.lines} SGLang decode lines, {len(text) / args.lines:.0f} bytes each, {READ_BYTES >> 10} KiB reads")
    ansi = colored(lines)
    cases: list[tuple[str, Callable[[], Decoder], bytes, bytes]] = [
        ("cri containerd (F records)", CriDecoder, frame_containerd(lines), text),
        ("cri CRI-O (8 KiB reads: P pieces)", CriDecoder, frame_crio(lines), text),
        ("docker json-file", DockerJsonDecoder, frame_docker(lines), text),
        ("docker json-file, ANSI escapes", DockerJsonDecoder, frame_docker(ansi), b"".join(ansi)),
    ]
    for name, make, framed, expected in cases:
        rate, errors = max(measure(make, framed, expected, args.lines) for _ in range(3))
        print(f"{name:36s} {rate / 1e6:6.2f} M lines/s  {len(framed) / (args.lines / rate) / 1e6:6.0f} MB/s in"
              f"  errors={errors}")


if __name__ == "__main__":
    main()
