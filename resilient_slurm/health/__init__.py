"""Node health: Xid catalog and kernel-log parser, NVML checks, verdicts, exclude list, xid_scan.

Kept import-free, and every module here imports only the standard library at import time
(nvidia-ml-py is imported inside `nvml_checks.probe_gpus`): `tools/xid_scan` runs as root from a
bare Prolog/Epilog and must start in milliseconds.

Modules, in the order data flows:
    xid_catalog   Xid → name, class, action (frozen rows) and site overrides      [pure]
    kernel_log    kernel-log lines → XidEvent                                     [pure]
    log_sources   /dev/kmsg, dmesg, journalctl -k or a file, read after a cursor
    nvml_checks   NVML adapter (lazy) and the check_gpu_* judges
    verdict       events + GPU findings + history → Verdict                      [pure]
    node_state    per-node cursors and Xid history on local disk
    exclude_list  the run's exclude list on shared storage; the --exclude value
    node_policy   which nodes a node record keeps out of new jobs                    [pure]
    node_record   the cluster's node record across jobs (JSON lines on shared storage)
    oom_kill      OOM-kill lines and cgroup oom_kill counters → host OOM, not a node fault [pure]
    oom_watch     the kernel log since a start and a process's memory cgroup counters

    scan          one scan (cursor choice, read, judge, record) and the job-side preflight
    cli           the tools/xid_scan command line and its watchdog
"""
