"""What the silent-data-corruption sentinel costs per step, and how long a flipped bit takes to heal.

    python bench/sdc.py [--steps 40] [--layouts 2x2,3x1,1x4] [--json FILE]

Each layout (replicas x shards; `1xN` is the buddy re-run without replicas, every step) trains
the tiny_sft model (d=256, 4 layers, global batch 8 x 128 tokens) on that many gloo ranks of this
machine, one thread each, through the real step (`StepRunner`) and the real sentinel. Per step it
times, on rank 0:
- the step itself (forward, backward, update);
- the sentinel's check after it (`Sentinel.check`: fingerprints, the all-gather over the replicas,
  the world-wide count), and the copy of the state before the update that two replicas (and the
  buddy re-run) keep (`KeptState`, in the optimizer's pre-step hook);
- the fingerprint of the rank's shards alone, against a CRC32 (ISA-L, the checkpoint's checksum) of
  the same bytes, the two in alternating order.
Three steps before the end rank `world - 1` flips a bit after its update, as `fault.sdc_step`
does; the `sdc` event's `heal_s` is found -> healed (and compared again). Medians over the steps
after the first five (start-up). `--json` writes bench/replica.py's keys for the simulator
(simulate/bench.py): fingerprint_s (the check plus the kept copy: the sentinel's whole cost per
step) and sdc_heal_s of the first layout with replicas, and its steady_step_s, ranks, replica_groups.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resilient_slurm.checkpoint.crc32 import crc32  # noqa: E402
from resilient_slurm.config import Config, Layout  # noqa: E402
from resilient_slurm.data.batches import Batch, rank_micro_batches  # noqa: E402
from resilient_slurm.ledger import EventLog, Sdc, read_events, select  # noqa: E402
from resilient_slurm.parallel.mesh import ParallelMesh  # noqa: E402
from resilient_slurm.process.signals import StopRequest  # noqa: E402
from resilient_slurm.replica.fingerprint import bits, fingerprints, local  # noqa: E402
from resilient_slurm.replica.sentinel import Sentinel  # noqa: E402
from resilient_slurm.session.distributed import Comm, RankInfo  # noqa: E402
from resilient_slurm.trainer import build  # noqa: E402
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler  # noqa: E402
from resilient_slurm.trainer.step import StepRunner  # noqa: E402
from tests.ports import free_port  # noqa: E402

WARMUP = 5


def parse_layout(text: str) -> Layout:
    replicas, shards = (int(x) for x in text.split("x"))
    return Layout(replicas, shards, 1, 1)


def _batches(cfg: Config, lay: Layout, rank: int, step: int) -> list[Batch]:
    g = torch.Generator().manual_seed(step)
    rows, seq = cfg.data.global_batch_size, cfg.data.seq_len
    ids = torch.randint(0, cfg.model.vocab_size, (rows, seq + 1), generator=g)
    full = Batch(ids[:, :-1], ids[:, 1:], torch.arange(seq).expand(rows, seq), torch.zeros(rows, seq, dtype=torch.long))
    dp_rank = lay.dp_rank(rank)
    micro = rows // lay.dp
    (chunk,) = rank_micro_batches(list(range(rows)), micro, lay.dp, dp_rank, 1)
    return [Batch(*(t[chunk] for t in (full.input_ids, full.labels, full.position_ids, full.document_ids)))]


def _worker(rank: int, lay: Layout, port: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    comm = Comm(RankInfo(rank, lay.world_size, rank, "127.0.0.1", port))
    cfg = Config()
    cfg.parallel.dp_replicate = lay.dp_replicate
    if lay.dp_replicate == 1:
        cfg.monitor.sdc.rerun_every_steps = 1
    mesh = ParallelMesh(lay, "cpu", rank)
    model = build.build_model(cfg, comm, mesh)
    optimizer = build_optimizer(model, cfg.optim)
    runner = StepRunner(model, optimizer, build_scheduler(optimizer, cfg.optim, steps + 1), comm, cfg.optim.grad_clip,
                        counts_data=mesh.position.counts_data)
    group = mesh.mesh["dp_replicate"].get_group() if "dp_replicate" in mesh.dims else None
    events = EventLog(Path(out).with_suffix(".events.jsonl"), rank)
    sentinel = Sentinel(cfg, comm, lay, group, model, optimizer, events, StopRequest())
    kept = sentinel.holder.kept
    keep_s: list[float] = []
    if kept is not None:
        keep = kept._keep
        def timed_keep(*args: Any) -> None:
            began = time.perf_counter()
            keep(*args)
            keep_s.append(time.perf_counter() - began)
        optimizer._optimizer_step_pre_hooks.clear()
        optimizer.register_step_pre_hook(timed_keep)
    rows: list[dict[str, float]] = []
    flip_at = steps - 3
    for step in range(1, steps + 1):
        batches = _batches(cfg, lay, rank, step)
        began = time.perf_counter()
        sentinel.arm(step)
        runner.step(batches)
        stepped = time.perf_counter()
        if step == flip_at and rank == lay.world_size - 1:
            bits(local(next(p for p in model.parameters() if local(p).numel())))[0] ^= 1
        sentinel.check(step)
        checked = time.perf_counter()
        row = {"step_s": stepped - began, "check_s": checked - stepped}
        if keep_s:
            row["keep_s"] = keep_s.pop()
        order = ("fingerprint", "crc32") if step % 2 else ("crc32", "fingerprint")
        for what in order:
            t = time.perf_counter()
            if what == "fingerprint":
                fingerprints(sentinel.holder.params).tolist()
            else:
                for p in sentinel.holder.params:
                    crc32(bits(local(p)).numpy().tobytes() if local(p).numel() else b"")
            row[what + "_s"] = time.perf_counter() - t
        if step != flip_at:
            rows.append(row)
    if rank == 0:
        found = select(read_events(Path(out).with_suffix(".events.jsonl")), Sdc)
        Path(out).write_text(json.dumps({"rows": rows[WARMUP:], "sdc": [e.details.__dict__ for e in found]}))
    comm.close()


def measure(lay: Layout, steps: int) -> dict[str, Any]:
    """One layout's medians and its injected flip's finding."""
    with tempfile.TemporaryDirectory(prefix="bench-sdc-") as d:
        out = str(Path(d) / "rank0.json")
        mp.spawn(_worker, args=(lay, free_port(), steps, out), nprocs=lay.world_size)
        raw = json.loads(Path(out).read_text())
    rows = raw["rows"]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    found = raw["sdc"][0] if raw["sdc"] else None
    return {"layout": f"{lay.dp_replicate}x{lay.dp_shard}", "ranks": lay.world_size, **med,
            "heal_s": found["heal_s"] if found else None, "decided_by": found["decided_by"] if found else None,
            "culprit": found["ranks"] if found else None, "verified": found["verified"] if found else None}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| layout | ranks | step | check | kept copy | sentinel / step | fingerprint alone | CRC32 (ISA-L) "
             "| flip found -> healed | decided by, culprit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        keep = r.get("keep_s")
        cells = [r["layout"] + (" (buddy re-run)" if r["layout"].startswith("1x") else ""), str(r["ranks"]),
                 _ms(r["step_s"]), _ms(r["check_s"]), "-" if keep is None else _ms(keep),
                 f"{100 * (r['check_s'] + (keep or 0.0)) / r['step_s']:.2f}%", _ms(r["fingerprint_s"]),
                 _ms(r["crc32_s"]), "-" if r["heal_s"] is None else _ms(r["heal_s"]),
                 f"{r['decided_by']}, rank(s) {r['culprit']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f} ms"


def simulator_keys(results: list[dict[str, Any]]) -> dict[str, Any]:
    """bench/replica.py's keys (simulate/bench.py) from the first layout with replicas."""
    r = next(x for x in results if not x["layout"].startswith("1x"))
    keys = {"ranks": r["ranks"], "replica_groups": int(r["layout"].split("x")[0]), "steady_step_s": r["step_s"],
            "fingerprint_s": r["check_s"] + r.get("keep_s", 0.0), "sdc_check_s": r["check_s"],
            "sdc_keep_s": r.get("keep_s", 0.0)}
    if r["heal_s"] is not None:
        keys["sdc_heal_s"] = r["heal_s"]
    return keys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layouts", default="2x2,3x1,1x4", help="replicas x shards, comma-separated")
    parser.add_argument("--json", help="write the simulator's keys here")
    args = parser.parse_args(argv)
    results = [measure(parse_layout(x), args.steps) for x in args.layouts.split(",")]
    print(f"tiny_sft model, gloo on this machine, 1 thread per rank, medians of {args.steps - WARMUP - 1} steps")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(simulator_keys(results), indent=1) + "\n")


if __name__ == "__main__":
    main()
