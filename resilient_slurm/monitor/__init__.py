"""In-training fault detection: findings with their evidence, judged off the loop's hot path.

Modules:
    detectors    NaN, loss spikes and plateaus, gradient explosion/vanishing, throughput drops,
                 slow ranks, data stalls, GPU conditions (median/MAD statistics), host
                 memory leaks (Theil-Sen slope of resident memory)                       [pure]
    gpu_sampler  an NVML sampler thread (utilization, memory, temperature, ECC); absent without NVML

What a finding leads to (roll back, stop, report) is `recovery.on_findings`.
"""
