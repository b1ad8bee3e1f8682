"""Hugging Face weights in and out, without ever holding the full model: what one rank reads of a
pretrained directory when it fills only its FSDP2 shard, and the memory of a streaming export.

    python bench/hf_io.py [--dir DIR] [--layers 12] [--reps 3]

The model is a Llama-shaped one written by transformers itself (vocab 32000, hidden 768, GQA 12/4
heads, MLP 2048; about 125M parameters with 12 layers), saved in bf16 as 100 MB shards, as the Hub
ships models. Each case runs in a fresh process; the "extra" column is its peak RSS during the case
(VmHWM, reset when the case begins) minus its RSS then (torch imported, file headers parsed).
Cases run in a rotated order each rep; the table shows medians of time and the largest extra
memory seen.

- load w=N r=R: rank R of N reads, for every parameter, its dim-0 chunk as FSDP2 shards it (rows
  [R*ceil(n/N), ...)), into float32 master weights: bytes read against the files' bytes, and
  memory against the full float32 model.
- export stream: write_hf from the same directory (each tensor read whole in float32) to bf16,
  100 MB shards; memory against the full float32 model.
- export naive: the whole float32 state dict in memory, then safetensors' save_file in bf16
  (what a gather-to-rank-0 export does), for comparison.
Holds on a local disk with the page cache warm (the files were just written); it measures bytes
and memory, which do not depend on the disk; its times do.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds bench/tokenize.py, which would shadow the standard library's `tokenize` (that
# linecache, hence attrs and transformers, import): leave it off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHARD = 100 * 10**6


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _reset_peak() -> None:
    """Restart the kernel's RSS high-water mark (VmHWM) from the current RSS. ru_maxrss cannot be
    used: Linux carries it across exec, so a child would report its parent's peak."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1e3


def _case(kind: str, directory: str, world: int, rank: int, out: str) -> dict[str, float]:
    import torch

    from resilient_slurm.config import ModelConfig
    from resilient_slurm.export.hf_writer import write_hf
    from resilient_slurm.model.pretrained import HFWeights, expected_shapes, read_model_config

    cfg = ModelConfig(**read_model_config(directory))
    weights = HFWeights(directory)
    shapes = expected_shapes(cfg)
    weights.check(shapes)
    full_f32 = sum(math.prod(s) for s in shapes.values()) * 4
    _reset_peak()
    before, opened = _rss_mb(), weights.nbytes_read
    start = time.perf_counter()
    if kind == "load":
        held = []
        for name, shape in shapes.items():
            chunk = math.ceil(shape[0] / world)
            lo, hi = min(shape[0], rank * chunk), min(shape[0], (rank + 1) * chunk)
            out_t = torch.empty(hi - lo, *shape[1:])
            weights.read_rows(name, lo, hi, out_t)
            held.append(out_t)
    elif kind == "stream":
        def read(name: str) -> torch.Tensor:
            t = torch.empty(shapes[name])
            weights.read_rows(name, 0, shapes[name][0], t)
            return t
        write_hf(out, list(shapes.items()), read, cfg, torch.bfloat16, max_shard_bytes=SHARD)
    else:
        from safetensors.torch import save_file
        state = {}
        for name, shape in shapes.items():
            state[name] = torch.empty(shape)
            weights.read_rows(name, 0, shape[0], state[name])
        save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, os.path.join(out, "model.safetensors"),
                  metadata={"format": "pt"})
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "extra_mb": _peak_mb() - before, "read": weights.nbytes_read - opened,
            "file_bytes": weights.file_bytes, "full_f32_mb": full_f32 / 1e6}


def _save_model(directory: str, layers: int) -> None:
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                                      num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=4,
                                      max_position_embeddings=2048)
    with torch.no_grad():
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, max_shard_size="100MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--case", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        kind, directory, world, rank, out = args.case
        print(json.dumps(_case(kind, directory, int(world), int(rank), out)))
        return
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        model_dir = os.path.join(root, "model")
        _save_model(model_dir, args.layers)
        cases = [("load", 1, 0), ("load", 2, 0), ("load", 2, 1), ("load", 4, 0), ("load", 4, 3),
                 ("stream", 1, 0), ("naive", 1, 0)]
        results: dict[tuple[str, int, int], list[dict[str, float]]] = {c: [] for c in cases}
        for rep in range(args.reps):
            for i in range(len(cases)):
                case = cases[(i + rep) % len(cases)]
                out = os.path.join(root, f"out-{rep}-{i}")
                if case[0] == "naive":
                    os.makedirs(out)
                done = subprocess.run([sys.executable, __file__, "--case", case[0], model_dir, str(case[1]),
                                       str(case[2]), out], capture_output=True, text=True, check=True)
                results[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
                shutil.rmtree(out, ignore_errors=True)
        print(f"model: {args.layers} layers, {results[cases[0]][0]['full_f32_mb']:.0f} MB in float32, "
              f"files {results[cases[0]][0]['file_bytes'] / 1e6:.0f} MB (bf16); {args.reps} reps, medians")
        print(f"{'case':<16}{'read MB':>9}{'read/files':>11}{'s':>8}{'extra MB':>10}{'extra/f32 model':>17}")
        for case, runs in results.items():
            label = f"load w={case[1]} r={case[2]}" if case[0] == "load" else f"export {case[0]}"
            read = statistics.median(r["read"] for r in runs)
            extra = max(r["extra_mb"] for r in runs)
            print(f"{label:<16}{read / 1e6:>9.1f}{read / runs[0]['file_bytes']:>11.3f}"
                  f"{statistics.median(r['seconds'] for r in runs):>8.2f}{extra:>10.0f}"
                  f"{extra / runs[0]['full_f32_mb']:>17.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
