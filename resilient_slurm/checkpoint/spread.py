"""Resume from a checkpoint spread over nodes (a node-local hot tier, `nodes.py`): find the newest
step whose every file some node still holds, bring each node the files its ranks need, and load.

1. Each node's leader lists what its node holds: its own step directories and its buddy copies
   (files under their own names, which are whole and checked: `p2p.py`), and the manifests.
2. All ranks see every node's list. Candidates are the steps some node has a manifest of, newest
   first, and for each its manifest variants (a node whose retention stripped the optimizer
   state holds a smaller one), fullest first: the first whose every file is held somewhere wins.
3. Every node needs the small JSON files; from the shards index each rank works out which tensor
   files hold rows it needs now (its own, at the world size that saved; parts of several after a
   shrink, all of them on one node). A buddy copy on the node is linked into the node's step
   directory; a file the node does not hold comes from a node that does, over the network, whole,
   checked against the manifest's CRC.
4. Every rank loads from its node's step directory (`load.load_into`, which checks the CRCs of the
   bytes it reads). A step that fails on any rank is passed over by all of them.

When no step is complete on the nodes (every copy of some file died), each leader copies the
newest cold-tier checkpoint into its node's directory and the ranks load that.

Whole files rather than the byte ranges a rank needs: after a shrink or a growth a node fetches
files that only partly hold its rows. At the world size that saved, the two are the same.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resilient_slurm.files import atomic_write
from resilient_slurm.checkpoint import layout, load, p2p, store
from resilient_slurm.checkpoint.buddy import CHUNK_BYTES, ROUND_BYTES, buddy_root
from resilient_slurm.checkpoint.manifest import Manifest, ManifestError
from resilient_slurm.checkpoint.nodes import BUDDY_DIR, Spread, plan_fetch, rounds
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.reader import LoadError
from resilient_slurm.checkpoint.safetensors_io import FormatError
from resilient_slurm.checkpoint.collectives import Collectives

Files = dict[str, int]
"""rel -> size of the files a node holds of one step."""


@dataclass
class Holding:
    """What one node holds, as its leader lists it."""

    manifests: dict[int, list[bytes]] = field(default_factory=dict)
    own: dict[int, Files] = field(default_factory=dict)
    buddy: dict[int, dict[str, tuple[str, int]]] = field(default_factory=dict)
    """step -> rel -> (the node it is a copy from, size)."""


def list_node(root: Path) -> Holding:
    """This node's step directories and buddy copies (complete files only)."""
    h = Holding()
    for step, path in store.list_step_dirs(root):
        h.own[step] = _files(path)
        if (path / layout.MANIFEST).is_file():
            h.manifests[step] = [(path / layout.MANIFEST).read_bytes()]
    base = root / BUDDY_DIR
    for node_dir in sorted(base.iterdir()) if base.is_dir() else ():
        for step, path in store.list_step_dirs(node_dir):
            for rel, size in _files(path).items():
                h.buddy.setdefault(step, {}).setdefault(rel, (node_dir.name, size))
    return h


def _files(path: Path) -> Files:
    out: Files = {}
    for dirpath, _, names in os.walk(path):
        for name in names:
            if name == layout.MANIFEST or name.endswith(p2p.PART_SUFFIX) or name.startswith("."):
                continue
            full = Path(dirpath) / name
            out[full.relative_to(path).as_posix()] = full.stat().st_size
    return out


def candidates(held: dict[int, Holding], before_step: int | None,
               not_before: int | None = None) -> list[tuple[int, Manifest]]:
    """(step, manifest) whose every file some node holds at its size, newest step first, of steps
    in [not_before, before_step). Pure."""
    out = []
    steps = sorted({s for h in held.values() for s in h.manifests
                    if (before_step is None or s < before_step) and (not_before is None or s >= not_before)},
                   reverse=True)
    for step in steps:
        variants: dict[str, Manifest] = {}
        for h in held.values():
            for raw in h.manifests.get(step, []):
                try:
                    variants.setdefault(hashlib.sha256(raw).hexdigest(), Manifest.from_json(raw))
                except ManifestError:
                    continue
        for _, manifest in sorted(variants.items(), key=lambda kv: (-len(kv[1].files), kv[0])):
            if all(holders(held, step, rel, e.nbytes) for rel, e in manifest.files.items()):
                out.append((step, manifest))
    return out


def holders(held: dict[int, Holding], step: int, rel: str, size: int) -> list[int]:
    """The leaders whose node holds `rel` of `step` at `size`, own copies or buddy copies. Pure."""
    return [r for r, h in sorted(held.items())
            if h.own.get(step, {}).get(rel) == size or h.buddy.get(step, {}).get(rel, ("", -1))[1] == size]


class SpreadResume:
    """The collective resume of one rank (every rank of the run calls `run`)."""

    def __init__(self, root: Path, spread: Spread, comm: Collectives, group: Any, io_threads: int) -> None:
        self.root, self.spread, self.comm, self.group, self.io_threads = root, spread, comm, group, io_threads
        self.rank = comm.rank
        self.leader = spread.is_leader(comm.rank)

    def held(self) -> dict[int, Holding]:
        if self.leader:
            store.remove_partial_saves(self.root)
        mine = list_node(self.root) if self.leader else None
        return {r: h for r, h in enumerate(self.comm.all_gather_object(mine)) if h is not None}

    def run(self, model: nn.Module, optimizer: torch.optim.Optimizer | None,
            scheduler: torch.optim.lr_scheduler.LRScheduler | None, cold: Any, before_step: int | None,
            refusal: load.Refusal | None = None, not_before: int | None = None) -> load.ResumeOutcome:
        """`not_before`: pass over the nodes' steps before it (the memory tier, when a disk tier
        holds a newer checkpoint)."""
        held = self.held()
        skipped: list[tuple[str, str]] = []
        touched = False
        for step, manifest in candidates(held, before_step, not_before):
            path = self.root / layout.step_dir_name(step)
            result: load.Restored | None = None
            refused: str | None = None
            try:
                source = self._bring_json(held, step, manifest)
                if refusal is not None:
                    refused = refusal(TrainState.from_json(load.read_json(path, layout.TRAIN_STATE, manifest)))
                # every rank takes part in bringing the tensors, even one that refuses
                source = self._bring_tensors(held, step, manifest, model) or source
                if refused:
                    raise LoadError(refused)
                touched = True
                result, reason = load.load_into(path, manifest, self.rank, model, optimizer, scheduler,
                                                self.io_threads), "ok"
            except load.ModelChanged as e:  # the model's code changed: the user's to fix, nothing to skip
                reason = refused = str(e)
            except (LoadError, FormatError, ValueError, KeyError, OSError) as e:
                reason = str(e)
            result, reason, refused = load.held_somewhere(self.comm, result, reason, refused)
            outcomes = self.comm.all_gather_object((result is not None, reason, refused))
            _raise_refused(path, outcomes)
            if all(ok for ok, _, _ in outcomes):
                assert result is not None
                result.source = source
                if self.leader and not (path / layout.MANIFEST).exists():
                    atomic_write(path / layout.MANIFEST, manifest.to_json())
                return load.ResumeOutcome(result, skipped, False)
            skipped.append((str(path), "; ".join(sorted({r for ok, r, _ in outcomes if not ok}))))
        restored, cold_skipped = self._from_cold(cold, before_step, model, optimizer, scheduler, refusal)
        return load.ResumeOutcome(restored, skipped + cold_skipped, touched and restored is None)

    def collect(self, step: int) -> list[str]:
        """Bring every file of a committed step to rank 0's node (the finished model is exported
        from there); the problems, if any."""
        held = self.held()
        raw = held[0].manifests.get(step)
        if not raw:
            return [f"rank 0's node has no manifest of step {step}"]
        manifest = Manifest.from_json(raw[0])
        want = {0: [rel for rel in manifest.files if held[0].own.get(step, {}).get(rel) != manifest.files[rel].nbytes]}
        _, problems = self._bring(held, step, manifest, want)
        return problems

    # --- bringing files to the nodes that need them
    def _bring_json(self, held: dict[int, Holding], step: int, manifest: Manifest) -> str:
        rels = [rel for rel in manifest.files if rel.endswith(".json")]
        source, problems = self._bring(held, step, manifest, {leader: rels for leader in held})
        if problems:
            raise LoadError("; ".join(problems))
        return source

    def _bring_tensors(self, held: dict[int, Holding], step: int, manifest: Manifest, model: nn.Module) -> str | None:
        path = self.root / layout.step_dir_name(step)
        try:
            need: list[str] | str = sorted(load.needed_files(path, manifest, model))
        except (LoadError, FormatError, ValueError, KeyError, OSError) as e:
            need = f"rank {self.rank}: {e}"  # still at the all-gather, or the others wait for it
        needs = self.comm.all_gather_object(need)
        errors = [n for n in needs if isinstance(n, str)]
        if errors:
            raise LoadError("; ".join(errors))
        want: dict[int, list[str]] = {}
        for rank, rels in enumerate(needs):
            want.setdefault(self.spread.leader(self.spread.nodes[rank]), []).extend(rels)
        source, problems = self._bring(held, step, manifest, want)
        if problems:
            raise LoadError("; ".join(problems))
        return source if source != "hot" else None

    def _bring(self, held: dict[int, Holding], step: int, manifest: Manifest,
               want: dict[int, list[str]]) -> tuple[str, list[str]]:
        """Each leader gets the files `want` names into its node's step directory: from its own
        buddy copies (a link), or over the network. Returns where they came from (hot: all there
        already; buddy: some from buddy copies; peers: from other nodes' own directories) and
        every rank's problems."""
        step_dir = layout.step_dir_name(step)
        sizes = {rel: e.nbytes for rel, e in manifest.files.items()}
        missing = {leader: sorted({rel for rel in rels if held[leader].own.get(step, {}).get(rel) != sizes[rel]})
                   for leader, rels in want.items()}
        local = {leader: [rel for rel in rels if held[leader].buddy.get(step, {}).get(rel, ("", -1))[1] == sizes[rel]]
                 for leader, rels in missing.items()}
        remote = {leader: [rel for rel in rels if rel not in local[leader]] for leader, rels in missing.items()}
        problems: list[str] = []
        if self.rank in local:
            for rel in local[self.rank]:
                problems += _link(buddy_root(self.root, held[self.rank].buddy[step][rel][0]) / step_dir / rel,
                                  self.root / step_dir / rel)
        plan = plan_fetch({rel: holders(held, step, rel, sizes[rel]) for rels in remote.values() for rel in rels},
                          remote, sizes, CHUNK_BYTES)

        def source(t: Any) -> str:
            if held[self.rank].own.get(step, {}).get(t.rel) == sizes[t.rel]:
                return str(self.root / step_dir / t.rel)
            return str(buddy_root(self.root, held[self.rank].buddy[step][t.rel][0]) / step_dir / t.rel)

        problems += p2p.exchange(rounds(plan, ROUND_BYTES), self.rank, self.group, source,
                                 lambda t: str(self.root / step_dir / t.rel),
                                 {rel: e.crc32 for rel, e in manifest.files.items()})
        everyone = [p for ps in self.comm.all_gather_object(problems) for p in ps]
        from_buddy = any(local.values()) or any(held[t.src].own.get(step, {}).get(t.rel) != sizes[t.rel] for t in plan)
        return ("buddy" if from_buddy else "peers" if plan else "hot"), everyone

    def _from_cold(self, cold: Any, before_step: int | None, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                   scheduler: torch.optim.lr_scheduler.LRScheduler | None,
                   refusal: load.Refusal | None) -> tuple[load.Restored | None, list[tuple[str, str]]]:
        """Every leader copies the newest cold checkpoint that works into its node's directory."""
        skipped: list[tuple[str, str]] = []
        steps: list[int] = []
        if self.rank == 0 and cold is not None:
            try:
                steps = cold.steps()
            except Exception as e:  # noqa: BLE001 - an unreachable cold tier must not stop a resume
                skipped.append((cold.url, f"cold tier unreadable: {e.__class__.__name__}: {e}"))
        steps, skipped = self.comm.all_gather_object((steps, skipped))[0]
        for step in (s for s in steps if before_step is None or s < before_step):
            problem = load.fetch(cold, step, self.root) if self.leader else None
            problems = [p for p in self.comm.all_gather_object(problem) if p]
            if problems:
                skipped += problems
                continue
            path = self.root / layout.step_dir_name(step)
            result, reason, _, refused = load.attempt(path, self.rank, model, optimizer, scheduler, self.io_threads,
                                                      refusal)
            result, reason, refused = load.held_somewhere(self.comm, result, reason, refused)
            outcomes = self.comm.all_gather_object((result is not None, reason, refused))
            _raise_refused(path, outcomes)
            if all(ok for ok, _, _ in outcomes):
                assert result is not None
                result.source = "cold"
                return result, skipped
            skipped.append((str(path), "; ".join(sorted({r for ok, r, _ in outcomes if not ok}))))
        return None, skipped


def _raise_refused(path: Path, outcomes: list[tuple[bool, str, str | None]]) -> None:
    """Every rank raises the same CheckpointRefused when any of them refused the checkpoint."""
    refusals = sorted({r for _, _, r in outcomes if r})
    if refusals:
        raise load.CheckpointRefused(f"{path}: {refusals[0]}")


def _link(src: Path, dest: Path) -> list[str]:
    """A buddy copy into the node's step directory: a hard link (the same disk), else a copy."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.unlink()
        try:
            os.link(src, dest)
        except OSError:
            shutil.copyfile(src, dest)
    except OSError as e:
        return [f"{dest}: {e.__class__.__name__}: {e}"]
    return []
