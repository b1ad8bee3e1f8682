"""tokenize: every input format, bad lines, workers, and a rerun after a real kill."""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from resilient_slurm.data.__main__ import main
from resilient_slurm.data.tokens.corpus import MegatronFile
from resilient_slurm.data.tokens.text_inputs import TextInputError
from resilient_slurm.data.tokens.tiny_corpus import documents
from resilient_slurm.data.tokens.tokenize_files import TokenizeError, tokenize
from resilient_slurm.data.tokenizer import ChatTokenizer, resolve_path
from tests.token_corpora import write_jsonl

TOKENIZER = "asset:tiny_chat"
TEXTS = list(documents("prose", 300, seed=3))


def expected_documents():
    tok = ChatTokenizer(resolve_path(TOKENIZER), need_template=False)
    return [e.ids + [tok.eos_ids[0]] for e in tok.tokenizer.encode_batch(TEXTS)]


def read_documents(prefix):
    f = MegatronFile(str(prefix))
    tokens = f.read(0, f.num_tokens).tolist()
    starts = [0, *f.doc_starts(0, f.read(0, f.num_tokens)).tolist(), f.num_tokens]
    return [tokens[a:b] for a, b in zip(starts, starts[1:])]


def write_input(path, kind):
    if kind == "jsonl":
        return write_jsonl(path, TEXTS)
    lines = "".join(json.dumps({"text": t}) + "\n" for t in TEXTS).encode()
    if kind == "jsonl.gz":
        path.write_bytes(gzip.compress(lines))
    elif kind == "jsonl.zst":
        zstandard = pytest.importorskip("zstandard")
        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    else:
        pq = pytest.importorskip("pyarrow.parquet")
        import pyarrow as pa

        pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": TEXTS}), str(path), row_group_size=64)
    return str(path)


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst", "parquet"])
def test_each_input_format_gives_the_tokenizers_documents_with_eos(tmp_path, kind):
    source = write_input(tmp_path / f"in.{kind}", kind)
    report = tokenize([source], str(tmp_path / "out"), TOKENIZER, progress=False, chunk_items=100)
    assert read_documents(tmp_path / "out") == expected_documents()
    assert report.counts.documents == len(TEXTS) and report.dtype == "uint16"
    assert not (tmp_path / "out.parts").exists() and (tmp_path / "out.tokenize.json").exists()


def test_two_workers_write_the_same_bytes_as_one(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS)
    tokenize([source], str(tmp_path / "one"), TOKENIZER, progress=False, chunk_items=70)
    tokenize([source, source], str(tmp_path / "two"), TOKENIZER, workers=2, progress=False, chunk_items=70)
    one = (tmp_path / "one.bin").read_bytes()
    assert (tmp_path / "two.bin").read_bytes() == one + one
    assert read_documents(tmp_path / "two") == expected_documents() * 2


def test_no_eos_leaves_documents_as_encoded(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS[:20])
    tokenize([source], str(tmp_path / "out"), TOKENIZER, progress=False, append_eos=False)
    f = MegatronFile(str(tmp_path / "out"))
    assert f.header.sequences == 20 and f.num_tokens == sum(len(d) - 1 for d in expected_documents()[:20])


def test_a_bad_line_stops_with_file_and_line_or_is_skipped_and_counted(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a b c"}\n{"text": "d e"\n\n{"txt": "x"}\n{"text": 7}\n{"text": "f"}\n')
    with pytest.raises(TokenizeError) as e:
        tokenize([str(path)], str(tmp_path / "out"), TOKENIZER, progress=False)
    assert str(e.value).startswith(f"{path}:2: not valid JSON")
    code = main(["tokenize", "--input", str(path), "--output-prefix", str(tmp_path / "cli"), "--tokenizer", TOKENIZER,
                 "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"resilient_slurm: tokenize: {path}:2: not valid JSON") and "\n" not in err
    report = tokenize([str(path)], str(tmp_path / "skip"), TOKENIZER, bad_lines="skip", progress=False)
    c = report.counts
    assert (c.documents, c.skipped, c.blank, c.lines) == (2, 3, 1, 6)
    assert "skipped 3 bad lines (first: " in report.line() and f"{path}:2: not valid JSON" in report.line()


@pytest.mark.parametrize("content, message", [
    ('{"txt": "a"}\n', ":1: no 'text' key (use --text-key"),
    ('[1, 2]\n', ":1: a JSON list, not an object"),
    ('{"text": null}\n', ":1: 'text' is null"),
    (b'{"text": "\xff"}\n', ":1: not UTF-8"),
])
def test_each_kind_of_bad_line_is_named(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TokenizeError, match=re.escape(message)):
        tokenize([str(path)], str(tmp_path / "out"), TOKENIZER, progress=False)


def test_unreadable_inputs_and_foreign_prefixes_are_refused(tmp_path):
    with pytest.raises(TextInputError, match="unknown format"):
        tokenize([str(tmp_path / "x.csv")], str(tmp_path / "o"), TOKENIZER, progress=False)
    broken = tmp_path / "in.jsonl.gz"
    whole = gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in TEXTS).encode())
    broken.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TextInputError, match="the compressed stream is damaged"):
        tokenize([str(broken)], str(tmp_path / "o"), TOKENIZER, progress=False)
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS[:5])
    (tmp_path / "theirs.bin").write_bytes(b"")
    with pytest.raises(TokenizeError, match="exist and are not an unfinished tokenize output"):
        tokenize([source], str(tmp_path / "theirs"), TOKENIZER, progress=False)
    tokenize([source], str(tmp_path / "done"), TOKENIZER, progress=False)
    with pytest.raises(TokenizeError, match="already a finished tokenize output of other inputs"):
        tokenize([source], str(tmp_path / "done"), TOKENIZER, progress=False, text_key="body")


def test_a_run_killed_mid_way_resumes_to_identical_output_and_a_finished_one_is_never_rewritten(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", list(documents("prose", 6000, seed=5)))
    tokenize([source], str(tmp_path / "straight"), TOKENIZER, progress=False, chunk_items=200)
    prefix = tmp_path / "killed"
    command = [sys.executable, "-m", "resilient_slurm.data", "tokenize", "--input", source, "--output-prefix",
               str(prefix), "--tokenizer", TOKENIZER, "--workers", "2", "--chunk-lines", "200"]
    proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    parts = tmp_path / "killed.parts"
    deadline = time.monotonic() + 120
    while len(list(parts.glob("*.json"))) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its workers, mid-way
    proc.wait()
    finished = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.bin") if (parts / f"{p.stem}.json").exists()}
    assert finished and len(finished) < 30 and not (tmp_path / "killed.tokenize.json").exists()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{len(finished)} finished chunks reused" in done.stdout.splitlines()[-1]
    assert (tmp_path / "killed.bin").read_bytes() == (tmp_path / "straight.bin").read_bytes()
    assert (tmp_path / "killed.idx").read_bytes() == (tmp_path / "straight.idx").read_bytes()
    stat = os.stat(tmp_path / "killed.bin")
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "already finished" in again.stdout and "not rewritten" in again.stdout
    assert os.stat(tmp_path / "killed.bin").st_mtime_ns == stat.st_mtime_ns


def test_progress_is_one_line_per_update_when_stdout_is_not_a_terminal(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", TEXTS)
    done = subprocess.run([sys.executable, "-m", "resilient_slurm.data", "tokenize", "--input", source,
                           "--output-prefix", str(tmp_path / "o"), "--tokenizer", TOKENIZER],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "\r" not in done.stdout
    bars = [line for line in done.stdout.splitlines() if line.startswith("tokenize:") and "|" in line]
    assert bars and "docs/s" in bars[-1] and "tok/s" in bars[-1]
    assert np.all([line.count("|") == 2 for line in bars])
