#!/bin/sh
# Prolog/Epilog wrapper for tools/xid_scan (slurm.conf's Prolog=/Epilog= take a path, not
# arguments). Install it on every node, e.g. as /etc/slurm/xid_scan_hook.sh, mode 0755, root.
#   --exclude-file  the exclude list the launcher reads (cluster.exclude_file), on shared storage
#   --drain         drain with the scan's own reason, not just "Prolog error"/"Epilog error"
#   --expect-gpus   a node showing fewer GPUs than this is taken out
exec /opt/resilient_slurm/tools/xid_scan \
    --exclude-file /shared/resilient_slurm/exclude.json \
    --drain \
    --expect-gpus 8
