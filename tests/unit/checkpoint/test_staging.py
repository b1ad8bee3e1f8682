import numpy as np
import torch
from safetensors.torch import load_file

from resilient_slurm.checkpoint import parallel_io
from resilient_slurm.checkpoint.parallel_io import write_files
from resilient_slurm.checkpoint.safetensors_io import write_file
from resilient_slurm.checkpoint.staging import Stager


def state(seed=0, rows=33):
    g = torch.Generator().manual_seed(seed)
    return [("w", torch.randn(rows, 7, generator=g)), ("b16", torch.randn(5, generator=g).bfloat16()),
            ("step", torch.tensor(3.0)), ("mask", torch.tensor([True, False, True]))]


def test_a_staged_file_is_byte_for_byte_what_the_direct_writer_writes(tmp_path):
    (staged,) = Stager().stage([("model.safetensors", state())])
    assert staged.aligned.nbytes % parallel_io.BLOCK == 0
    (digest,) = write_files([staged.out_file(str(tmp_path / "staged"))], threads=2)
    reference = write_file(str(tmp_path / "direct"), state())
    assert (tmp_path / "staged").read_bytes() == (tmp_path / "direct").read_bytes()
    assert digest == reference
    loaded = load_file(str(tmp_path / "staged"))
    assert all(torch.equal(loaded[n], t) for n, t in state())


def test_staged_bytes_do_not_change_when_the_live_tensors_do():
    live = state()
    (staged,) = Stager().stage([("m", live)])
    before = bytes(staged.data)
    for _, t in live:
        t.zero_()
    assert bytes(staged.data) == before


def address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def test_buffers_are_reused_while_the_layout_stays_and_replaced_when_it_changes():
    stager = Stager()
    stager.stage([("a", state(0)), ("b", state(1))])
    assert stager.allocated_bytes > 0
    first = [address(s.aligned) for s in stager.stage([("a", state(2)), ("b", state(3))])]
    assert stager.allocated_bytes == 0  # new values, same layout: no fresh memory
    again = stager.stage([("a", state(4)), ("b", state(5, rows=34))])
    assert address(again[0].aligned) == first[0] and address(again[1].aligned) != first[1]
    assert stager.allocated_bytes == again[1].aligned.nbytes
