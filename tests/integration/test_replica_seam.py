"""The seam the silent-corruption sentinel builds on (replica/engine.py), on torchft for real: two
replica groups of one process each, a lighthouse, a plain tensor as the state. `gather` gives each
live group's value, exactly; after `request_heal`, a group whose state went wrong takes the state of
a live one at the next quorum, and the steps it committed before are not repeated."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_slurm.replica.lighthouse import Lighthouse

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKER = r'''
import json, sys
import torch, torch.distributed as dist
from resilient_slurm.replica.plan import ReplicaPlace
from resilient_slurm.replica.torchft_engine import TorchftReplicas

group, lighthouse = int(sys.argv[1]), sys.argv[2]
state = torch.zeros(4)
store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)

def save():
    return {"state": state.clone()}

def load(received):
    state.copy_(received["state"])

r = TorchftReplicas(ReplicaPlace(group, 2, 1), rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
                    lighthouse=lighthouse, backend="gloo", replica_min=1, timeout_s=30, collective_timeout_s=60,
                    state=(save, load))
out = []
for step in range(1, 4):
    q = r.quorum()
    assert q.live == (0, 1), q
    grad = torch.full((4,), float(group + 1))
    r.sum_(grad)                       # 1 + 2 over the two groups
    assert r.commit()
    state += grad
    seen = r.gather(torch.tensor([int(state.sum().item()), group], dtype=torch.int64))
    out.append({"step": q.step, "gathered": {g: t.tolist() for g, t in seen.items()}, "heal": q.heal is not None})
    if step == 2 and group == 1:
        state += 100.0                 # a corrupted state, which the next gather shows
    if step == 3 and group == 1:
        r.request_heal()
q = r.quorum()
out.append({"step": q.step, "heal": None if q.heal is None else [q.heal.source, q.heal.bytes], "state": state.tolist()})
r.sum_(torch.zeros(1))  # as a step's first sum: the live group serves its state until the healer joins it
r.abandon("done")
r.close()
print(json.dumps(out))
'''


def test_gather_and_a_requested_heal_across_two_groups(tmp_path):
    lighthouse = Lighthouse(1, 10.0)
    try:
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(g), lighthouse.address], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for g in (0, 1)]
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        lighthouse.close()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    g0, g1 = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    # every step both groups added 1 + 2 = 3 to every element; gather gives each group's own value
    assert [row["gathered"] for row in g0[:3]] == [{"0": [12, 0], "1": [12, 1]}, {"0": [24, 0], "1": [24, 1]},
                                                   {"0": [36, 0], "1": [436, 1]}]
    assert g1[2]["gathered"] == g0[2]["gathered"]
    # group 1 asked for a heal after the gather that showed it wrong, and took group 0's state and step
    assert g1[3]["heal"][0] == 0 and g1[3]["heal"][1] == 16 and g1[3]["state"] == g0[3]["state"] == [9.0] * 4
    assert g0[3]["heal"] is None and g1[3]["step"] == g0[3]["step"] == 3
