"""Checkpoints: one directory per step, safetensors and JSON only, committed by a manifest written last.

Modules, in the order a save
and a resume use them:
    layout         directory and file names; what a shards index says                  [pure]
    chunks         boxes of a tensor from DTensor placements; overlap arithmetic         [pure]
    plan           which rank writes which chunk of which tensor, into which file        [pure]
    manifest       sizes and CRC32s of every file: the commit marker                     [pure]
    policy         when a save is due (every N steps, exponential, every T minutes)      [pure]
    interval       the Young-Daly interval from measured cost and observed failures      [pure]
    deadline       the emergency plan that fits the time left before the kill            [pure]
    costs          save costs measured from the ledger                                   [pure]
    retention      which checkpoints to delete or strip of optimizer state               [pure]
    crc32          combining CRCs of file ranges written in parallel                     [pure]
    collectives    what checkpoints need from the run's process group (protocols)
    train_state    train_state.json: where the run stood, as a frozen record             [pure]
    state          training state ↔ named tensors (each rank's box of them) and JSON (no pickle)
    exchange       the ranks agree on a save's plan: holdings exchanged once per layout, cached
    safetensors_io safetensors headers and files, written and read in ranges
    parallel_io    range-parallel direct I/O with CRCs
    staging        reusable aligned host buffers for background saves
    save           the atomic sharded save protocol across ranks
    group          the checkpoint's own process group (background saves)
    async_save     the save in flight on its own thread
    store          listing, quarantine, deletion and fsync of step directories
    nodes          a node-local hot tier (%n): leaders, buddies, who sends which bytes      [pure]
    p2p            checkpoint files sent between ranks (gloo point-to-point), CRC-checked
    buddy          each node's files copied to its buddy node after a commit
    cold           the cold tier over fsspec (a shared path or s3://)
    uploader       background, verified copies to the cold tier and its retention
    reader         boxes of saved tensors into this rank's shards, only the overlaps it needs
    load           resume: the newest checkpoint that verifies, from either tier
    spread         resume from a checkpoint spread over nodes: own, buddy and peer copies
    memory_policy  the memory tier: when it saves, its size per node, what it fits in       [pure]
    memory_files   the memory tier's directories on a node: room for them, and their cleanup
    memory         the memory tier: saves to host memory (tmpfs) and a buddy node's, resume from them
    verify         the `verify` check, shared by the command and the loader
    checkpointer   the loop's single entry point: when, save, retention, tiers, resume
    names          torchtitan's Llama-3 names for ours, and the rotary permutation between them [pure]
    dcp_io         torch.distributed.checkpoint directories read and written box by box; model.dcp's fill
    convert        a checkpoint to DCP and back, without a process group
    __main__       the `verify` and `convert` command lines
"""
