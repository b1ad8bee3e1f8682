"""In-training fault detection: findings with their evidence, judged off the loop's hot path.

Modules:
    detectors    NaN, loss spikes and plateaus, gradient explosion/vanishing, throughput drops,
                 slow ranks, data stalls, GPU conditions (median/MAD statistics), host
                 memory leaks (Theil-Sen slope of resident memory)                       [pure]
    heartbeats   a rank's beat (step, phase, allowance, collectives) and when its silence is a hang,
                 and whom the others wait for                                              [pure]
    stragglers   a rank slow but alive, from every rank's step sections                     [pure]
    replay       replay verification: a restart's recomputed steps against their values before
                 the failure (bit for bit), and what a difference leads to                      [pure]
    hang_dumps   the marker, grace and py-spy limit a hang's stack dumps share between the
                 ranks' watchdogs and the supervisor                                        [pure]
    gpu_sampler  an NVML sampler thread (utilization, memory, temperature, ECC); absent without NVML

What a finding leads to (roll back, stop, report) is `recovery.on_findings`.
"""
