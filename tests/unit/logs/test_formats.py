"""Container log formats decoded: CRI (containerd, CRI-O) and Docker's json-file, with partial pieces, escapes,
garbage and endless records bounded; a UTF-16 log transcoded to UTF-8 whatever its chunking."""

from __future__ import annotations

import json
import random
import re
import tracemalloc

import pytest

from stallwatch.logs.formats import (
    MAX_PENDING_BYTES,
    MAX_RECORD_BYTES,
    CriDecoder,
    Decoder,
    DockerJsonDecoder,
    PlainDecoder,
    Transcoder,
    decoder_for,
)


def decode(decoder: Decoder, data: bytes, chunk: int | None = None) -> bytes:
    if chunk is None:
        return decoder.decode(data)
    return b"".join(decoder.decode(data[i : i + chunk]) for i in range(0, len(data), chunk))


def cri(stream: str, tag: str, content: bytes, ts: str = "2026-11-29T10:00:00.123456789Z") -> bytes:
    return f"{ts} {stream} {tag} ".encode() + content + b"\n"


def docker(log: str, stream: str = "stdout", attrs: dict[str, str] | None = None) -> bytes:
    """As moby's jsonlog marshaller writes it: keys in order, `<>&` escaped like Go does."""
    record: dict[str, object] = {"log": log, "stream": stream}
    if attrs is not None:
        record["attrs"] = attrs
    record["time"] = "2026-11-29T10:00:00.123456789Z"
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode() + b"\n"


SAMPLE = (
    cri("stdout", "F", b"first", ts="2026-11-29T10:00:00Z")
    + cri("stderr", "P", b"half ", ts="2026-11-29T10:00:00.5+01:00")
    + cri("stdout", "F", b"second")
    + b"garbled line\n"
    + cri("stderr", "F", b"done")
    + cri("stdout", "F:tag", b"tagged")
    + b"\n"
    + cri("stdout", "X", b"bad tag")
    + cri("stdout", "F", b"caf\xc3\xa9 \xff\xfe binary")
)


SAMPLE_TEXT = b"first\nsecond\ngarbled line\nhalf done\ntagged\n\n2026-11-29T10:00:00.123456789Z stdout X bad tag\n" \
    b"caf\xc3\xa9 \xff\xfe binary\n"


def reference_cri(data: bytes) -> tuple[bytes, int]:
    """The format's rule, line by line and slowly: what every fast path must agree with."""
    out, pending, errors = [], {}, 0
    for line in data.split(b"\n")[:-1]:
        m = re.fullmatch(rb"([^ ]+) (stdout|stderr) ([^ ]*)(?: (.*))?", line, re.S)
        tag = m.group(3).split(b":")[0] if m else b""
        if tag == b"P":
            pending[m.group(2)] = pending.get(m.group(2), b"") + (m.group(4) or b"")
        elif tag == b"F":
            out.append(pending.pop(m.group(2), b"") + (m.group(4) or b"") + b"\n")
        else:
            errors += 1
            out.append(line + b"\n")
    return b"".join(out), errors


def random_cri(rng: random.Random, records: int) -> bytes:
    out = []
    for _ in range(records):
        kind = rng.random()
        content = bytes(rng.choice(b"ab \t:PF\xff") for _ in range(rng.randrange(12)))
        stream = rng.choice(["stdout", "stderr"])
        ts = rng.choice(["2026-11-29T10:00:00Z", "2026-11-29T10:00:00.25Z", "2026-11-29T11:00:00.000000000+01:00"])
        if kind < 0.55:
            out.append(cri(stream, "F", content, ts))
        elif kind < 0.85:
            out.append(cri(stream, "P", content, ts))
        elif kind < 0.9:
            out.append(cri(stream, rng.choice(["F:x", "P:y", "F", "P"]), b"", ts).rstrip(b" \n") + b"\n")
        else:
            out.append(content + b"\n")
    return b"".join(out)


def test_docker_records_of_other_streams_are_errors_and_keep_nothing() -> None:
    """A forged Docker json-file log whose records name made-up `stream` values made the decoder keep a pending
    buffer for each, 126 MiB for 2,000 of them (docs/research/audit-2026-12-01.md #15). Only `stdout` and `stderr`
    are decoded; a record of any other stream, or of a stream that is not a string, counts as an error and keeps
    nothing."""
    decoder = DockerJsonDecoder()
    forged = b"".join(json.dumps({"log": "x" * 1000, "stream": f"s{i}", "time": "t"}).encode() + b"\n"
                      for i in range(200))
    line = json.dumps({"log": "real\n", "stream": "stdout", "time": "t"}).encode() + b"\n"
    assert decoder.decode(forged + line) == b"real\n"
    assert decoder.errors == 200
    odd = json.dumps({"log": "y\n", "stream": ["stdout"], "time": "t"}).encode() + b"\n"
    assert decoder.decode(odd) == b"" and decoder.errors == 201


def test_containerd_records_with_variable_width_timestamps() -> None:
    data = (
        cri("stdout", "F", b"hello", ts="2026-11-29T10:00:00Z")
        + cri("stderr", "F", b"[2026-11-29 10:00:00 TP0] Decode batch, #running-req: 1", ts="2026-11-29T10:00:00.1Z")
        + cri("stdout", "F", b"  leading spaces stay ", ts="2026-11-29T10:00:00.123456789Z")
        + cri("stdout", "F", b"")
    )
    d = CriDecoder()
    text = b"hello\n[2026-11-29 10:00:00 TP0] Decode batch, #running-req: 1\n  leading spaces stay \n\n"
    assert d.decode(data) == text
    assert d.errors == 0


def test_crio_records_with_offsets_and_tags() -> None:
    data = (
        cri("stdout", "F", b"one", ts="2026-11-29T10:00:00.000000001+01:00")
        + cri("stderr", "F", b"two", ts="2026-11-29T04:00:00.000000002-05:00")
        + cri("stdout", "P:x", b"thr", ts="2026-11-29T10:00:00.000000003+01:00")
        + cri("stdout", "F:y", b"ee", ts="2026-11-29T10:00:00.000000004+01:00")
        + b"2026-11-29T10:00:00.000000005+01:00 stdout F\n"  # empty line, no space after the tag
    )
    d = CriDecoder()
    assert d.decode(data) == b"one\ntwo\nthree\n\n"
    assert d.errors == 0


def test_40_kib_line_split_into_16_kib_pieces_is_one_line() -> None:
    line = bytes(random.Random(1).choice(b"abcdefghij klmnop") for _ in range(40 << 10))
    pieces = [line[:16384], line[16384:32768], line[32768:]]
    data = cri("stdout", "P", pieces[0]) + cri("stdout", "P", pieces[1]) + cri("stdout", "F", pieces[2])
    data = cri("stdout", "F", b"before") + data + cri("stdout", "F", b"after")
    for chunk in (None, 4096, 16384, 1):
        d = CriDecoder()
        assert decode(d, data, chunk) == b"before\n" + line + b"\nafter\n", chunk
        assert d.errors == 0


def test_interleaved_streams_keep_pieces_apart() -> None:
    data = (
        cri("stdout", "P", b"out-a ")
        + cri("stderr", "F", b"err whole")
        + cri("stdout", "P", b"out-b ")
        + cri("stderr", "P", b"err-a ")
        + cri("stdout", "F", b"out-c")
        + cri("stderr", "F", b"err-b")
    )
    assert CriDecoder().decode(data) == b"err whole\nout-a out-b out-c\nerr-a err-b\n"


def test_pieces_carry_across_reads_and_bulk_chunks() -> None:
    """A P at the end of one read, its F among hundreds of plain records in the next."""
    plain = b"".join(cri("stderr", "F", b"line %d" % i) for i in range(300))
    d = CriDecoder()
    assert d.decode(plain + cri("stdout", "P", b"long ")) == b"".join(b"line %d\n" % i for i in range(300))
    assert d.decode(plain + cri("stdout", "F", b"end") + plain) == (
        b"".join(b"line %d\n" % i for i in range(300)) + b"long end\n" + b"".join(b"line %d\n" % i for i in range(300))
    )


def test_every_chunk_boundary_gives_the_same_output() -> None:
    whole = CriDecoder()
    assert whole.decode(SAMPLE) == SAMPLE_TEXT
    assert whole.errors == 3
    for cut in range(len(SAMPLE) + 1):
        d = CriDecoder()
        assert d.decode(SAMPLE[:cut]) + d.decode(SAMPLE[cut:]) == SAMPLE_TEXT, cut
        assert d.errors == 3
    d = CriDecoder()
    assert decode(d, SAMPLE, 1) == SAMPLE_TEXT and d.errors == 3


def test_garbled_lines_pass_through_and_count() -> None:
    lines = [b"plain text, no framing", b"2026-11-29T10:00:00Z stdout", b"2026-11-29T10:00:00Z stdin F x",
             b" stdout F no timestamp", b"2026-11-29T10:00:00Z  stdout F two spaces", b"\x00\x01\x02"]
    d = CriDecoder()
    assert d.decode(b"\n".join(lines) + b"\n") == b"\n".join(lines) + b"\n"
    assert d.errors == len(lines)


@pytest.mark.parametrize("seed", range(6))
def test_random_records_at_random_chunkings_match_the_rule(seed: int) -> None:
    rng = random.Random(seed)
    data = random_cri(rng, 600)
    expected, errors = reference_cri(data)
    for _ in range(4):
        d = CriDecoder()
        out = []
        pos = 0
        while pos < len(data):
            step = rng.choice([1, 7, 64, 500, 5000, 1 << 20])
            out.append(d.decode(data[pos : pos + step]))
            pos += step
        assert b"".join(out) == expected
        assert d.errors == errors


def test_100_mb_record_without_newline_keeps_memory_bounded() -> None:
    block = b"x" * (1 << 20)
    d = CriDecoder()
    tracemalloc.start()
    try:
        assert d.decode(b"2026-11-29T10:00:00Z stdout F ") == b""
        for _ in range(100):
            assert d.decode(block) == b""
        peak_before_end = tracemalloc.get_traced_memory()[1]
        out = d.decode(b"tail\n" + cri("stdout", "F", b"next"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_before_end < 8 << 20 and peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB"
    kept = MAX_RECORD_BYTES - len(b"2026-11-29T10:00:00Z stdout F ")
    assert out == b"x" * kept + b"\nnext\n"
    assert d.dropped_bytes == 100 * (1 << 20) + 4 - kept


def test_pending_pieces_are_capped() -> None:
    piece = b"p" * (256 << 10)
    d = CriDecoder()
    for _ in range(6):
        assert d.decode(cri("stdout", "P", piece)) == b""
    assert d.decode(cri("stdout", "F", b"end")) == b"p" * MAX_PENDING_BYTES + b"end\n"
    assert d.dropped_bytes == 6 * len(piece) - MAX_PENDING_BYTES


def test_reset_drops_the_unfinished_record_and_pieces() -> None:
    d = CriDecoder()
    assert d.decode(cri("stdout", "P", b"old piece ") + b"2026-11-29T10:00:00Z stdout F unfini") == b""
    d.reset()
    assert d.decode(cri("stdout", "F", b"new")) == b"new\n"
    assert d.errors == 0


def test_docker_complete_lines_and_attrs() -> None:
    data = (
        docker("first line\n")
        + docker("on stderr\n", "stderr")
        + docker("with attrs\n", attrs={"tag": "sglang", "env": "prod"})
        + docker("\n")
    )
    for chunk in (None, 1):
        d = DockerJsonDecoder()
        assert decode(d, data, chunk) == b"first line\non stderr\nwith attrs\n\n"
        assert d.errors == 0
    one = DockerJsonDecoder()
    assert [one.decode(record) for record in (docker("a\n"), docker("b\n", attrs={"k": "v"}))] == [b"a\n", b"b\n"]


def test_docker_16_kib_partial_pieces_are_joined_per_stream() -> None:
    line = "".join(random.Random(2).choice("abcdef <>&\"\\\t") for _ in range(40 << 10))
    data = (
        docker(line[:16384])
        + docker("stderr in between\n", "stderr")
        + docker(line[16384:32768])
        + docker("err piece ", "stderr")
        + docker(line[32768:] + "\n")
        + docker("err end\n", "stderr")
    )
    expected = b"stderr in between\n" + line.encode() + b"\nerr piece err end\n"
    for chunk in (None, 1000, 1):
        d = DockerJsonDecoder()
        assert decode(d, data, chunk) == expected, chunk
        assert d.errors == 0


def test_docker_escapes() -> None:
    cases = {
        "\x1b[32mINFO\x1b[0m colored\n": b"\x1b[32mINFO\x1b[0m colored\n",
        'say "hi"\n': b'say "hi"\n',
        "C:\\path\\\n": b"C:\\path\\\n",
        "tab\there\n": b"tab\there\n",
        "<html> & co\n": b"<html> & co\n",
        "caf\u00e9 \U0001f600\n": "caf\u00e9 \U0001f600\n".encode(),
    }
    data = b"".join(docker(log) for log in cases)
    expected = b"".join(cases.values())
    for chunk in (None, 3, 1):
        d = DockerJsonDecoder()
        assert decode(d, data, chunk) == expected, chunk
        assert d.errors == 0


def test_docker_backslash_before_the_final_newline_is_not_mistaken() -> None:
    """`"log":"a\\\\n"` is `a\\n` without a newline: a piece that the next record completes."""
    data = b'{"log":"a\\\\n","stream":"stdout","time":"2026-11-29T10:00:00Z"}\n' + docker("b\n")
    for chunk in (None, 1):
        d = DockerJsonDecoder()
        assert decode(d, data, chunk) == b"a\\nb\n"


def test_docker_surrogate_escapes_never_raise() -> None:
    data = (
        b'{"log":"pair \\ud83d\\ude00\\n","stream":"stdout","time":"t"}\n'
        b'{"log":"lone low \\udc80\\n","stream":"stdout","time":"t"}\n'
        b'{"log":"lone high \\ud800\\n","stream":"stdout","time":"t"}\n'
    )
    expected = "pair \U0001f600\n".encode() + b"lone low \x80\n" + "lone high \ufffd\n".encode()
    for chunk in (None, 1):
        d = DockerJsonDecoder()
        assert decode(d, data, chunk) == expected
        assert d.errors == 0


def test_docker_bad_records_are_skipped_and_counted() -> None:
    bad = [b"not json", b'{"log":"unterminated', b'{"stream":"stdout","time":"t"}', b'{"log":42}', b"[1,2]",
           b'"just a string"', b"[" * 100000, b"{\xff\xfe}", b""]
    good = docker("good one\n") + docker("good two\n", "stderr")
    data = docker("before\n") + b"\n".join(bad) + b"\n" + good
    for chunk in (None, 1):
        d = DockerJsonDecoder()
        assert decode(d, data, chunk) == b"before\ngood one\ngood two\n"
        assert d.errors == len(bad)


def test_docker_bulk_and_per_line_paths_agree() -> None:
    rng = random.Random(3)
    logs = ["".join(rng.choice("abcdefgh \"\\\t\x1b<&\u00e9") for _ in range(rng.randrange(8))) for _ in range(400)]
    records = [docker(log + ("\n" if rng.random() < 0.9 else ""), rng.choice(["stdout", "stderr"]),
                      {"k": "v"} if rng.random() < 0.2 else None) for log in logs]
    data = b"".join(records)
    bulk = DockerJsonDecoder().decode(data)
    per_record = DockerJsonDecoder()
    one_by_one = b"".join(per_record.decode(r) for r in records)
    forced_slow = DockerJsonDecoder()
    slow = forced_slow.decode(b"garbage\n" + data)  # one bad line sends the whole chunk down the per-line path
    assert bulk == one_by_one == slow
    assert forced_slow.errors == 1


def test_docker_endless_record_is_bounded_and_counted() -> None:
    d = DockerJsonDecoder()
    block = b"y" * (1 << 20)
    assert d.decode(b'{"log":"') == b""
    for _ in range(3):
        assert d.decode(block) == b""
    assert d.decode(b'\\n","stream":"stdout","time":"t"}\n' + docker("after\n")) == b"after\n"
    assert d.errors == 1  # the truncated record is no longer valid JSON
    assert d.dropped_bytes > 2 << 20


def test_plain_is_identity() -> None:
    d = PlainDecoder()
    assert decode(d, SAMPLE, 5) == SAMPLE
    d.reset()
    assert d.errors == 0 and d.dropped_bytes == 0


def test_decoder_for() -> None:
    assert isinstance(decoder_for("plain"), PlainDecoder)
    assert isinstance(decoder_for("cri"), CriDecoder)
    assert isinstance(decoder_for("docker"), DockerJsonDecoder)
    assert decoder_for("cri") is not decoder_for("cri")
    with pytest.raises(ValueError, match="unknown log format 'journald'"):
        decoder_for("journald")


# A PowerShell redirect's lines: CRLF, a non-ASCII character (2 bytes in UTF-8) and one outside the BMP (a surrogate
# pair in UTF-16, 4 bytes in UTF-8).
UTF16_TEXT = "INFO Starting to load model m...\r\nΓûê ready \U0001f680 done\r\n"
BOMS = {"utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff"}


@pytest.mark.parametrize("codec", BOMS)
def test_utf16_with_a_bom_is_transcoded_at_every_chunking(codec: str) -> None:
    """Every split of a code unit or of a surrogate pair between two reads waits for the rest: any chunking gives
    the same UTF-8, the BOM left out."""
    data = BOMS[codec] + UTF16_TEXT.encode(codec)
    for chunk in (1, 2, 3, 5, len(data)):
        text = Transcoder()
        assert b"".join(text.decode(data[i : i + chunk]) for i in range(0, len(data), chunk)) == UTF16_TEXT.encode()
        assert text.codec == codec


def test_utf8_passes_through_unchanged() -> None:
    """No BOM: the bytes as they are, also a first byte that might have begun one and a lone `FF FE` further on."""
    for data in (SAMPLE_TEXT, b"\xff not a BOM\n", b"\xfe", b"ok\n\xff\xfe\x00\x01\n"):
        text = Transcoder()
        assert b"".join(text.decode(data[i : i + 1]) for i in range(len(data))) + text.decode(b"x") == data + b"x"
        assert text.codec is None


def test_invalid_utf16_becomes_replacement_characters() -> None:
    """A lone surrogate, a high surrogate without its low one, and random bytes after a BOM never raise."""
    text = Transcoder()
    lone = b"\xff\xfe" + b"a\x00" + b"\x00\xdc" + b"b\x00" + b"\x00\xd8" + b"\n\x00"  # a, low, b, high, newline
    assert text.decode(lone) == "a\ufffdb\ufffd\n".encode()
    rng = random.Random(7)
    garbage = b"\xff\xfe" + bytes(rng.randrange(256) for _ in range(1 << 16))
    text = Transcoder()
    text.decode(garbage).decode("utf-8")  # valid UTF-8, whatever came in


def test_transcoder_reset_and_begin_decide_anew() -> None:
    """After a reset (a new file) its first bytes decide again; a read that begins mid-file takes the file's first
    bytes from `begin`, and steps over half a code unit at an odd offset."""
    data = b"\xff\xfe" + "line one\nline two\n".encode("utf-16-le")
    text = Transcoder()
    text.decode(data)
    text.reset()
    assert text.decode(b"plain\n") == b"plain\n" and text.codec is None
    for offset, expected in ((1, b"line one\nline two\n"), (2, b"line one\nline two\n"), (19, b"line two\n"),
                             (20, b"line two\n")):
        text = Transcoder()
        text.begin(data[:2], offset)
        assert text.decode(data[offset:]) == expected
    text = Transcoder()
    text.begin(b"pl", 3)
    assert text.decode(b"ain\n") == b"ain\n"
