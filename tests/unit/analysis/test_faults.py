"""The report's hangs (whom the others waited for) and stragglers (the swap's throughput before and
after), from ledger events and metrics rows as the run writes them."""

from resilient_slurm.analysis.faults import hangs, stragglers
from resilient_slurm.analysis.report import _fault_lines
from resilient_slurm.ledger import parse


def event(kind, time, step, rank=-1, node="n1", **fields):
    return parse({"time": time, "event": kind, "step": step, "rank": rank, "job_id": "7", "restart": 0,
                  "job_step": 0, "node": node, **fields})


COLLECTIVE = {"group": "0", "desc": "default_pg", "seq": 57, "waiting": [0, 2], "behind": {"1": 55}}
HANG = dict(reason="heartbeat: ...", waited_s=3.2, limit_s=3.0, stacks="/x", culprits=[1], nodes=["n2"],
            collective=COLLECTIVE)
STRAGGLER = dict(ratio=3.1, compute_s=0.31, others_s=0.1, steps=5, sections={"forward": 0.1}, scores={"1": 0.32},
                 action="swap")
SWAP = dict(cause="straggler on n2: ...", placement="n2 swapped for spare n3: ...", replaced=["n2"], added=["n3"],
            latency_s=21.5, move="swap")


def test_a_hang_names_the_ranks_the_others_waited_for_once_whatever_the_culprits():
    ev = [event("hang", "2026-12-01T10:00:05.000Z", 40, rank=1, node="n2", **HANG),
          event("hang", "2026-12-01T10:00:01.000Z", 12, rank=0, reason="no step completed", waited_s=300.0,
                limit_s=300.0, stacks="/y")]  # the in-rank watchdog's: no culprit to name
    (h,) = hangs(ev)
    assert (h.step, h.culprits, h.nodes, h.collective) == (40, (1,), ("n2",), "#57 of group 0 (default_pg)")
    (line,) = _fault_lines(ev, [])
    assert "step 40: rank 1 (n2); the others waited in collective #57 of group 0 (default_pg)" in line


def test_a_swapped_straggler_shows_the_throughput_before_and_after():
    rows = [{"step": s, "tokens_per_s": 100.0 if s <= 30 else 40.0 if s <= 35 else 95.0} for s in range(1, 60)]
    rows[36]["tokens_per_s"] = 10.0  # the first step after the swap pays the restart: left out
    ev = [event("straggler", "2026-12-01T10:00:00.000Z", 35, rank=1, node="n2", **STRAGGLER),
          event("restart_in_allocation", "2026-12-01T10:00:30.000Z", 36, **SWAP)]
    (s,) = stragglers(ev, rows)
    assert (s.rank, s.node, s.swapped_for, s.found_to_first_step_s, s.before, s.after) == \
        (1, "n2", ("n3",), 21.5, 40.0, 95.0)
    (line,) = _fault_lines(ev, rows)
    assert "rank 1 on n2, 3.1x the others' compute; swapped for n3" in line and "tokens/s 40 -> 95" in line
    # without a swap (no spare, or the local launcher): only what was found
    (alone,) = stragglers(ev[:1], rows)
    assert alone.swapped_for == () and alone.before is None


def test_with_replica_groups_the_swap_is_the_groups_join_on_the_spare():
    rows = [{"step": s, "tokens_per_s": 100.0 if s <= 30 else 40.0 if s <= 35 else 95.0} for s in range(1, 60)]
    rows[36]["tokens_per_s"] = 60.0  # the first step with the joined group: left out
    ev = [event("straggler", "2026-12-01T10:00:00.000Z", 35, rank=1, node="n2", **{**STRAGGLER, "group": 1}),
          event("replica_join", "2026-12-01T10:00:04.500Z", 36, rank=1, node="n3", group=1, live=[0, 1],
                seconds=4.1),
          event("replica_join", "2026-12-01T10:00:09.000Z", 50, rank=0, node="n4", group=0, live=[0, 1],
                seconds=3.0)]
    (s,) = stragglers(ev, rows)
    assert (s.swapped_for, s.found_to_first_step_s, s.before, s.after) == (("n3",), 4.5, 40.0, 95.0)
