"""`parallel.*`: how the ranks are laid out (HSDP replicas x FSDP shards x tensor x pipeline), and
the resolved `Layout` every part of a run reads its coordinates from. [pure]

The degrees multiply to the world size. Axis order, outermost first: pp, dp_replicate, dp_shard,
tp, so the ranks of one tensor-parallel group are consecutive and sit on one node (torchtitan's
order; Megatron's default puts TP fastest-varying too). `dp_shard=-1` takes what the other degrees
leave, so the same recipe runs at any world size that the fixed degrees divide, and an elastic
shrink drops whole data-parallel groups.

Pipeline stages are cut by decoder layer (`stage_layers`), torchtitan's rule: the embedding and the
head each weigh as much as a layer, so the L + 2 units are spread evenly over the stages, the
remainder to the earliest, and the first and last stages hold one layer fewer for them. Where that
would leave a stage without a layer (under two layers a stage), the layers alone are spread evenly,
the remainder to the earliest. Pipeline rank r runs stages r, r + pp, r + 2pp, ... (`rank_stages`:
the loop order torch.distributed.pipelining assumes), so the first stage is on pp rank 0 and the
last on pp rank pp - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.config.checks import Problems

PP_SCHEDULES = ("1f1b", "interleaved_1f1b", "gpipe")
"""Pipeline schedules (torch.distributed.pipelining): Schedule1F1B, ScheduleInterleaved1F1B,
ScheduleGPipe."""


@dataclass
class ParallelConfig:
    dp_replicate: int = 1
    """Data-parallel replicas (HSDP's replicated dimension): each holds a whole copy of the state,
    sharded inside it over dp_shard ranks; gradients are all-reduced across replicas."""
    dp_shard: int = -1
    """FSDP2 shards per replica; -1: whatever the other degrees leave of the world size."""
    tp: int = 1
    """Tensor parallelism (DTensor, with sequence parallelism for the norms and a vocabulary-parallel
    embedding and head): consecutive ranks, all inside one node."""
    pp: int = 1
    """Pipeline stages, cut by decoder layer (torch.distributed.pipelining); the micro-batches of a
    step are its gradient-accumulation micro-batches."""
    pp_schedule: str = "1f1b"
    """Pipeline schedule: 1f1b, interleaved_1f1b or gpipe (PP_SCHEDULES)."""
    pp_virtual_stages: int = 2
    """Stages per rank with interleaved_1f1b (each rank holds this many non-adjacent stages); the
    other schedules hold one."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.dp_replicate >= 1, f"parallel.dp_replicate: {self.dp_replicate}; set it to 1 or more")
        p.need(self.dp_shard == -1 or self.dp_shard >= 1,
               f"parallel.dp_shard: {self.dp_shard}; set it to 1 or more, or -1 for what the other degrees leave")
        p.need(self.tp >= 1, f"parallel.tp: {self.tp}; set it to 1 or more")
        p.need(self.pp >= 1, f"parallel.pp: {self.pp}; set it to 1 or more")
        p.need(self.pp_schedule in PP_SCHEDULES,
               f"parallel.pp_schedule: {self.pp_schedule!r} unknown; use one of {', '.join(PP_SCHEDULES)}")
        p.need(self.pp_virtual_stages >= 1,
               f"parallel.pp_virtual_stages: {self.pp_virtual_stages}; set it to 1 or more")
        return p

    @property
    def stages_per_rank(self) -> int:
        return self.pp_virtual_stages if self.pp_schedule == "interleaved_1f1b" else 1


@dataclass(frozen=True)
class Coords:
    """Where one rank sits in the layout."""

    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int


@dataclass(frozen=True)
class Layout:
    """The resolved degrees of a run at one world size."""

    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel groups: each reads its own rows of every global batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The device mesh's shape, outermost first (MESH_DIMS)."""
        return self.pp, self.dp_replicate, self.dp_shard, self.tp

    def coords(self, rank: int) -> Coords:
        rest, tp = divmod(rank, self.tp)
        rest, dp_shard = divmod(rest, self.dp_shard)
        pp, dp_replicate = divmod(rest, self.dp_replicate)
        return Coords(pp, dp_replicate, dp_shard, tp)

    def dp_rank(self, rank: int) -> int:
        """The data-parallel group of `rank`: which rows of a global batch it reads (replicas and
        shards alike are data-parallel; tensor and pipeline ranks of one group read the same rows)."""
        c = self.coords(rank)
        return c.dp_replicate * self.dp_shard + c.dp_shard

    def describe(self) -> str:
        """`dp_replicate 2 x dp_shard 2 x tp 2 x pp 1` with what each axis means, for the first log line."""
        parts = [f"{self.dp_replicate} replica(s) (HSDP)" if self.dp_replicate > 1 else "",
                 f"{self.dp_shard} FSDP shard(s)", f"tp {self.tp}" if self.tp > 1 else "",
                 f"pp {self.pp}" if self.pp > 1 else ""]
        return " x ".join(p for p in parts if p)


MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


def resolve(cfg: ParallelConfig, world_size: int) -> Layout | str:
    """The layout at `world_size`, or the one-line problem with it (`parallel.*: what; fix`)."""
    fixed = cfg.dp_replicate * cfg.tp * cfg.pp
    if cfg.dp_shard == -1:
        if world_size % fixed:
            return (f"parallel: dp_replicate*tp*pp = {cfg.dp_replicate}*{cfg.tp}*{cfg.pp} = {fixed} does not divide "
                    f"the {world_size} rank(s); change a degree or the number of ranks")
        return Layout(cfg.dp_replicate, world_size // fixed, cfg.tp, cfg.pp)
    layout = Layout(cfg.dp_replicate, cfg.dp_shard, cfg.tp, cfg.pp)
    if layout.world_size != world_size:
        return (f"parallel: dp_replicate*dp_shard*tp*pp = {cfg.dp_replicate}*{cfg.dp_shard}*{cfg.tp}*{cfg.pp} = "
                f"{layout.world_size}, but the run has {world_size} rank(s); make the product equal the ranks, "
                f"or set parallel.dp_shard=-1")
    return layout


def _spread(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


def stage_layers(num_layers: int, num_stages: int) -> list[range]:
    """The decoder layers of each pipeline stage (module docstring); ValueError unless every stage
    can have one."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"{num_stages} pipeline stage(s) for {num_layers} layer(s): every stage needs a layer")
    sizes = _spread(num_layers + 2, num_stages)
    sizes[0] -= 1
    sizes[-1] -= 1
    if min(sizes) < 1:
        sizes = _spread(num_layers, num_stages)
    starts = [sum(sizes[:i]) for i in range(num_stages)]
    return [range(a, a + n) for a, n in zip(starts, sizes)]


def rank_stages(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    """The stages pipeline rank `pp_rank` runs, in order."""
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def interleaved_problem(micro_batches: int, pp: int) -> str | None:
    """What ScheduleInterleaved1F1B (torch 2.13) refuses of a step's micro-batches: it runs them in
    rounds of max(1, micro_batches // pp), which must divide them."""
    rounds = max(1, micro_batches // pp)
    if micro_batches % rounds == 0:
        return None
    return (f"parallel.pp_schedule: interleaved_1f1b runs the {micro_batches} micro-batches of a step in {rounds} "
            f"rounds (micro-batches // pp), which must divide them; make the micro-batches per step a multiple "
            f"of {rounds} (data.global_batch_size / (data.micro_batch_size * data-parallel ranks)), or use "
            f"parallel.pp_schedule=1f1b")
