"""bench/pretrain_data.py at toy size: every table it prints, from the same code as the full run."""

import json

import pytest

from tests.unit.bench.conftest import load_bench

bench = load_bench("pretrain_data")


@pytest.mark.slow  # two spawned workers, each importing the package and loading the tokenizer
def test_the_tokenize_table_compares_one_and_two_workers(tmp_path):
    rows = bench.bench_tokenize(tmp_path, docs=60, vocab=400, tokenizer=None, repeats=1)
    assert rows[0].startswith("| workers |") and [r.split("|")[1].strip() for r in rows[2:]] == ["1", "2"]
    assert all(int(r.split("|")[2]) == 60 for r in rows[2:])


@pytest.mark.slow  # four fresh processes, each importing torch (~10 s apiece on 2 busy cores)
def test_time_to_first_batch_with_and_without_a_prepared_order(tmp_path):
    rows = bench.bench_first_batch(tmp_path, ["0.3M"], repeats=1, steps=5)
    cases = {tuple(c.strip() for c in r.split("|")[2:4]): r.split("|")[-2].strip() for r in rows[2:]}
    assert cases == {("prepared", "start"): "False", ("prepared", "resume"): "False",
                     ("absent", "start"): "True", ("absent", "resume"): "True"}


def test_the_step_share_reads_a_runs_metrics_or_times_the_data_side(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": i, "data_wait_s": 0.001, "step_seconds": 0.1}) + "\n"
                               for i in range(5)))
    assert bench.bench_step_share(tmp_path, str(metrics), 0) == [
        f"data wait / step time, median over 5 steps of {metrics}: 1.00%"]
    (line,) = bench.bench_step_share(tmp_path, None, 3)
    assert "tiny_pretrain, 2 ranks: rank 0's next_batch() median" in line
